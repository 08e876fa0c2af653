// The keeper's liveness rule (native/keeper/process_liveness.h) driven by
// test/native/keeperLiveness.test.ts with docs/spec/liveness.md's vectors:
//   liveness_check stat FILE...             each file's stat line: "STATE START" per file, "-" for none
//   liveness_check alive PID START|- ...    "1" or "0" per pair
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "keeper/process_liveness.h"

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "stat") {
    for (int i = 2; i < argc; ++i) {
      std::ifstream in(argv[i], std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      weightd::StatFields f = weightd::parseStat(text.str());
      std::cout << f.state.value_or("-") << ' ' << f.startTime.value_or("-") << '\n';
    }
    return 0;
  }
  if (mode == "alive" && argc % 2 == 0) {
    for (int i = 2; i + 1 < argc; i += 2) {
      std::string start = argv[i + 1];
      // A pid that is not an integer (a vector's 1.5) can never reach the keeper as a pid_t.
      char* end = nullptr;
      long pid = std::strtol(argv[i], &end, 10);
      bool integer = end != argv[i] && *end == '\0';
      std::cout << (integer && weightd::isProcessAlive(static_cast<pid_t>(pid), start == "-" ? std::nullopt : std::optional<std::string>(start)) ? 1 : 0) << '\n';
    }
    return 0;
  }
  std::cerr << "usage: liveness_check stat FILE... | alive PID START|- ...\n";
  return 2;
}
