#include "process_liveness.h"

#include <cerrno>
#include <csignal>
#include <fstream>
#include <sstream>
#include <vector>

namespace weightd {

StatFields parseStat(const std::string& line) {
  StatFields out;
  // The command name (field 2) may hold spaces and parentheses: fields are counted after its last ')'.
  size_t close = line.rfind(')');
  if (close == std::string::npos) return out;
  std::string rest = close + 2 <= line.size() ? line.substr(close + 2) : std::string();
  if (!rest.empty() && rest.back() == '\n') rest.pop_back();
  std::vector<std::string> fields;
  size_t start = 0;
  for (;;) {
    size_t space = rest.find(' ', start);
    fields.push_back(rest.substr(start, space == std::string::npos ? std::string::npos : space - start));
    if (space == std::string::npos) break;
    start = space + 1;
  }
  if (!fields.empty() && !fields[0].empty()) out.state = fields[0];
  if (fields.size() > 19) out.startTime = fields[19];
  return out;
}

static std::optional<std::string> readStat(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat", std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<std::string> startTimeOf(pid_t pid) {
  if (pid <= 0) return std::nullopt;
  std::optional<std::string> stat = readStat(pid);
  return stat ? parseStat(*stat).startTime : std::nullopt;
}

bool isProcessAlive(pid_t pid, const std::optional<std::string>& startTime) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  std::optional<std::string> stat = readStat(pid);
  StatFields fields = stat ? parseStat(*stat) : StatFields{};
  if (fields.state && (*fields.state == "Z" || *fields.state == "X")) return false;
  return !startTime || (stat && fields.startTime == startTime);
}

}  // namespace weightd
