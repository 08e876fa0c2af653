// What a native call lets go of after it has answered (issue 31). A pull's end held its GPU
// resources until the end of the call: the writer's memory opened over IPC, the finals' mappings
// made here, the digest kernel's module and buffers, the streams. Letting go of them took 0.6-1.1
// ms of an 8 GB pull from one buffer on an H100, and 8.8 ms from a trainer's 291 tensors opened
// one by one (bench/RESULTS.md, 2026-12-07 06:55), before the commit could reply. They
// are drained already when handed over, so nothing waits for them: one thread of the process
// releases them, in order, right after.
#pragma once

#include <functional>

namespace weightd {

// Starts the releaser's thread, once per process (the addon does, as it loads).
void startReleaser();

// Runs `release` on the releaser's thread, after every release handed over before it. It must not
// throw (what fails there has no caller to tell).
void releaseLater(std::function<void()> release);

// Waits until every release handed over so far has run (at the addon's teardown: nothing of a
// call may outlive the environment that made it).
void settleReleases();

}  // namespace weightd
