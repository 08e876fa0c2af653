// One JSON line per event on stderr: {"time","level","msg",...fields}, like the daemon's logs.
#pragma once
#include <initializer_list>
#include <string>
#include <utility>

namespace weightd::keeper {

enum class Level { Debug = 0, Info = 1, Warn = 2, Error = 3 };

// false for a name that is not a level.
bool parseLevel(const std::string& name, Level& out);
void setLogLevel(Level level);

// A field's value: a JSON string, or a number written as is.
struct Field {
  Field(const char* k, const std::string& v) : key(k), value(v), quoted(true) {}
  Field(const char* k, const char* v) : key(k), value(v), quoted(true) {}
  Field(const char* k, long long v) : key(k), value(std::to_string(v)), quoted(false) {}
  Field(const char* k, int v) : key(k), value(std::to_string(v)), quoted(false) {}
  Field(const char* k, unsigned long v) : key(k), value(std::to_string(v)), quoted(false) {}
  const char* key;
  std::string value;
  bool quoted;
};

void log(Level level, const std::string& msg, std::initializer_list<Field> fields = {});

}  // namespace weightd::keeper
