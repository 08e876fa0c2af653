// Whether a process still runs: docs/spec/liveness.md, the rule the daemon and both clients
// follow (src/wire/processLiveness.ts, clients/python/weightd_client/liveness.py), written once
// more for the keeper, which watches its owners without Node. A bare pid is not enough (pids are
// reused, a zombie still answers kill(pid, 0)): the start time and state in /proc/<pid>/stat say.
#pragma once
#include <sys/types.h>

#include <optional>
#include <string>

namespace weightd {

// Field 3 (the state) and field 22 (the start time) of a /proc/<pid>/stat line, counted after the
// command name's last ')'; nullopt where the line does not have them.
struct StatFields {
  std::optional<std::string> state;
  std::optional<std::string> startTime;
};
StatFields parseStat(const std::string& line);

// The start time of `pid` now, if /proc/<pid>/stat can be read.
std::optional<std::string> startTimeOf(pid_t pid);

// alive(pid, startTime) of the spec: pid > 0, kill(pid, 0) succeeds or says EPERM, the state is
// not Z or X where /proc tells, and a recorded start time equals the process's current one.
bool isProcessAlive(pid_t pid, const std::optional<std::string>& startTime);

}  // namespace weightd
