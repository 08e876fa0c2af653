#include "deferred_release.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace weightd {

namespace {

struct Releaser {
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::function<void()>> queued;
  bool running = false;  // a release taken off the queue and not yet done
  bool started = false;
};

// Never destroyed: the thread waits on it until the process ends (a static destructor at exit
// would run while the thread may still use it).
Releaser& releaser() {
  static Releaser* r = new Releaser();
  return *r;
}

void serve(Releaser& r) {
  std::unique_lock<std::mutex> lock(r.mutex);
  for (;;) {
    r.changed.wait(lock, [&] { return !r.queued.empty(); });
    std::function<void()> release = std::move(r.queued.front());
    r.queued.pop_front();
    r.running = true;
    lock.unlock();
    release();
    release = nullptr;  // what it captured goes here, off the lock
    lock.lock();
    r.running = false;
    r.changed.notify_all();
  }
}

}  // namespace

void startReleaser() {
  Releaser& r = releaser();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.started) return;
  std::thread(serve, std::ref(r)).detach();
  r.started = true;
}

void releaseLater(std::function<void()> release) {
  startReleaser();
  Releaser& r = releaser();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.queued.push_back(std::move(release));
  r.changed.notify_all();
}

void settleReleases() {
  Releaser& r = releaser();
  std::unique_lock<std::mutex> lock(r.mutex);
  r.changed.wait(lock, [&] { return r.queued.empty() && !r.running; });
}

}  // namespace weightd
