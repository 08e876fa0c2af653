#include "keeper_log.h"

#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

namespace weightd::keeper {
namespace {

Level threshold = Level::Info;
const char* const names[] = {"debug", "info", "warn", "error"};

void appendJsonString(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

}  // namespace

bool parseLevel(const std::string& name, Level& out) {
  for (int i = 0; i < 4; ++i) {
    if (name == names[i]) {
      out = static_cast<Level>(i);
      return true;
    }
  }
  return false;
}

void setLogLevel(Level level) { threshold = level; }

void log(Level level, const std::string& msg, std::initializer_list<Field> fields) {
  if (level < threshold) return;
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  tm utc{};
  ::gmtime_r(&ts.tv_sec, &utc);
  char when[40];
  size_t n = std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &utc);
  std::snprintf(when + n, sizeof when - n, ".%03ldZ", ts.tv_nsec / 1000000);
  std::string line = std::string("{\"time\":\"") + when + "\",\"level\":\"" + names[static_cast<int>(level)] + "\",\"msg\":";
  appendJsonString(line, msg);
  for (const Field& f : fields) {
    line += ",\"";
    line += f.key;
    line += "\":";
    if (f.quoted) {
      appendJsonString(line, f.value);
    } else {
      line += f.value;
    }
  }
  line += "}\n";
  // One write per line, so lines of a keeper and its neighbours on one stderr never interleave.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace weightd::keeper
