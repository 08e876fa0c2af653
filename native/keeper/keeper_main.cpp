// weightd-keeper: holds the descriptors of weightd's memory (and the daemon's record of what
// they hold) so that the daemon can crash, restart or be upgraded without losing the memory.
// No CUDA, no network, no Node: one poll() loop over a Unix socket (docs/keeper.md).
//   weightd-keeper --socket PATH [--adopt-within SECONDS] [--exit-when-empty] [--request-timeout SECONDS]
//                  [--idle-timeout SECONDS] [--log-level LEVEL]
// Exit codes: 0 stopped (SIGTERM, SIGINT, SIGHUP, SIGQUIT, or empty with --exit-when-empty), 1 an unexpected
// failure, 2 bad usage or socket setup, 3 another keeper already serves PATH.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "keeper_connection.h"
#include "keeper_log.h"
#include "keeper_requests.h"
#include "keeper_socket.h"
#include "keeper_store.h"
#include "keeper_wire.h"

namespace weightd::keeper {
namespace {

constexpr size_t kMaxConnections = 256;
// Large requests being received and replies waiting to go out, across every connection (InFlight):
// four KEEPs of the largest size at once. It bounds what clients can make the keeper hold, so the
// OOM killer (which would take every kept shard with it) has no reason to pick it.
constexpr size_t kMaxBytesInFlight = size_t{4} * kMaxRequestBytes;

struct Options {
  std::string socket;
  std::chrono::milliseconds adoptWithin{600'000};
  bool exitWhenEmpty = false;
  pid_t stopWithParent = 0;
  Timeouts timeouts{std::chrono::seconds(10), std::chrono::seconds(30)};
  Level level = Level::Info;
};

const char* const kUsage =
    "usage: weightd-keeper --socket PATH [--adopt-within SECONDS] [--exit-when-empty] [--stop-with-parent PID] [--request-timeout SECONDS]\n"
    "                      [--idle-timeout SECONDS] [--log-level debug|info|warn|error]\n"
    "  --socket PATH          the Unix socket to serve (its directory must be yours and not group/other-writable)\n"
    "  --adopt-within SECONDS free a record this long after its owner exits, unless taken (default 600)\n"
    "  --exit-when-empty      exit once no record is held and no client is connected (a keeper the daemon spawned)\n"
    "  --stop-with-parent PID stop as on SIGTERM when the parent process PID ends (`weightd keeper`, which runs this as its child)\n"
    "  --request-timeout SECONDS close a connection whose request has not arrived whole this long after its first byte,\n"
    "                         or whose reply has not been taken this long after it was ready (default 10)\n"
    "  --idle-timeout SECONDS close a connection that has sent nothing this long since it connected or got its last reply (default 30)\n";

// A duration flag's value in seconds, fractions allowed: 0 to 1e9, or above 0 where 0 would mean never waiting.
std::chrono::milliseconds seconds(const std::string& flag, const std::string& v, bool positive) {
  char* end = nullptr;
  double s = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(s) || s < 0 || (positive && s == 0) || s > 1e9) {
    throw SetupError(kExitSetup, flag + " " + v + " is not a number of seconds (" + (positive ? "above 0" : "0") + " to 1e9, e.g. 600 or 0.5)");
  }
  return std::chrono::milliseconds(std::max<int64_t>(std::llround(s * 1000), positive ? 1 : 0));
}

Options parseOptions(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) throw SetupError(kExitSetup, std::string(flag) + " needs a value\n" + kUsage);
      return argv[++i];
    };
    if (a == "--socket") {
      o.socket = value("--socket");
    } else if (a == "--adopt-within") {
      o.adoptWithin = seconds(a, value("--adopt-within"), false);
    } else if (a == "--request-timeout") {
      o.timeouts.request = seconds(a, value("--request-timeout"), true);
    } else if (a == "--idle-timeout") {
      o.timeouts.idle = seconds(a, value("--idle-timeout"), true);
    } else if (a == "--exit-when-empty") {
      o.exitWhenEmpty = true;
    } else if (a == "--stop-with-parent") {
      std::string v = value("--stop-with-parent");
      char* end = nullptr;
      long pid = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || pid < 2) throw SetupError(kExitSetup, "--stop-with-parent " + v + " is not a process id (its parent's pid, 2 or more)");
      o.stopWithParent = static_cast<pid_t>(pid);
    } else if (a == "--log-level") {
      std::string v = value("--log-level");
      if (!parseLevel(v, o.level)) throw SetupError(kExitSetup, "--log-level " + v + " is not one of debug, info, warn, error");
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else {
      throw SetupError(kExitSetup, "unknown argument " + a + "\n" + kUsage);
    }
  }
  if (o.socket.empty()) throw SetupError(kExitSetup, std::string("--socket PATH is required\n") + kUsage);
  return o;
}

// A keeper holds up to 4096 fds per record: the soft limit (often 1024) goes up to the hard one.
void raiseFdLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// A keeper run by a wrapper (`weightd keeper`) must not outlive it: a wrapper killed with SIGKILL
// cannot forward the signal, and an orphaned keeper would hold memory and the socket nobody
// stops. The kernel sends SIGTERM (blocked, so it arrives on the signalfd: the normal stop) when
// the parent dies; a parent that died before prctl ran is seen by getppid().
void stopWithParent(pid_t parent) {
  if (parent == 0) return;
  if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) throw SetupError(1, std::string("prctl(PR_SET_PDEATHSIG) failed: ") + std::strerror(errno));
  if (::getppid() != parent) throw SetupError(1, "--stop-with-parent " + std::to_string(parent) + ": that process is not this keeper's parent (it has ended, or the flag names another)");
}

int signalFd() {
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  // `weightd keeper` forwards these too (src/cli/runKeeper.ts): each is a stop, exit 0, not the
  // default action's death (exit 129, or 131 and a core dump) with the socket left behind.
  sigaddset(&mask, SIGHUP);
  sigaddset(&mask, SIGQUIT);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  int fd = ::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  if (fd < 0) throw SetupError(1, std::string("signalfd failed: ") + std::strerror(errno));
  return fd;
}

class Keeper {
 public:
  Keeper(Options options, Listener listener, int sigFd)
      : options_(std::move(options)), listener_(listener), sigFd_(sigFd), store_(options_.adoptWithin), info_{::getpid(), Clock::now()}, inFlight_(kMaxBytesInFlight) {
    spareFd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }

  ~Keeper() {
    if (spareFd_ >= 0) ::close(spareFd_);
    connections_.clear();
    ::close(listener_.fd);
    removeSocket(options_.socket, listener_);
    ::close(sigFd_);
  }

  // Returns the exit code.
  int run() {
    log(Level::Info, "keeper serving", {{"socket", options_.socket}, {"pid", static_cast<int>(info_.pid)},
                                        {"adoptWithinMs", static_cast<long long>(options_.adoptWithin.count())},
                                        {"exitWhenEmpty", options_.exitWhenEmpty ? "yes" : "no"},
                                        {"requestTimeoutMs", static_cast<long long>(options_.timeouts.request.count())},
                                        {"idleTimeoutMs", static_cast<long long>(options_.timeouts.idle.count())}});
    for (;;) {
      std::vector<pollfd> fds;
      fds.push_back({sigFd_, POLLIN, 0});
      fds.push_back({listener_.fd, static_cast<short>(roomForAnother() ? POLLIN : 0), 0});
      for (const auto& c : connections_) fds.push_back({c->fd(), c->events(), 0});
      std::vector<std::pair<pid_t, int>> owners = store_.ownerPidfds();
      for (const auto& [pid, fd] : owners) fds.push_back({fd, POLLIN, 0});

      if (::poll(fds.data(), fds.size(), timeoutMs()) < 0 && errno != EINTR) {
        log(Level::Error, "poll failed", {{"error", std::strerror(errno)}});
        return 1;
      }
      if (fds[0].revents) {
        signalfd_siginfo si{};
        ssize_t got = ::read(sigFd_, &si, sizeof si);
        int sig = got == static_cast<ssize_t>(sizeof si) ? static_cast<int>(si.ssi_signo) : 0;
        log(Level::Info, "stopping on a signal: every kept record is freed", {{"signal", sig}, {"records", static_cast<long long>(store_.records().size())}});
        return 0;
      }
      // The connections polled are served before any is accepted (which may close an idle one to
      // make room), so the entries of fds still match connections_.
      size_t polled = connections_.size();
      for (size_t i = 0; i < polled; ++i) {
        short ev = fds[2 + i].revents;
        if (ev) serve(*connections_[i], ev);
      }
      for (size_t i = 0; i < owners.size(); ++i) {
        if (fds[2 + polled + i].revents) logEvents(store_.ownerExited(owners[i].first));
      }
      if (fds[1].revents) acceptAll();
      logEvents(store_.tick());
      closeOverdue();
      reapConnections();
      // What was sent, refused or closed above freed room in the budget: the frames waiting for it
      // go on, in the order they asked for it, until one still does not fit.
      while (Connection* next = inFlight_.next()) {
        serve(*next, POLLIN);
        if (next->parked()) break;
      }
      if (emptyAndDone()) {
        log(Level::Info, "no record held and no client connected: exiting (--exit-when-empty)");
        return 0;
      }
    }
  }

 private:
  int timeoutMs() const {
    int t = store_.pollTimeoutMs();
    std::optional<Clock::time_point> next;
    for (const auto& c : connections_) {
      std::optional<Clock::time_point> d = c->deadline(options_.timeouts);
      if (d && (!next || *d < *next)) next = d;
      std::optional<Clock::time_point> h = inFlight_.contended() ? c->holdDeadline() : std::nullopt;
      if (h && (!next || *h < *next)) next = h;
    }
    if (next) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*next - Clock::now()).count() + 1;
      int until = left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
      t = t < 0 ? until : std::min(t, until);
    }
    if (options_.exitWhenEmpty && !armed_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(info_.started + options_.adoptWithin - Clock::now()).count() + 1;
      int armIn = left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
      t = t < 0 ? armIn : std::min(t, armIn);
    }
    return t;
  }

  // Armed by the first KEEP or WATCH (a spawning daemon's PING comes before its WATCH), or once
  // adopt-within has passed without either, so a keeper nobody used does not stay forever.
  bool emptyAndDone() {
    if (!options_.exitWhenEmpty) return false;
    if (!armed_ && Clock::now() >= info_.started + options_.adoptWithin) armed_ = true;
    return armed_ && store_.records().empty() && connections_.empty();
  }

  void acceptAll() {
    for (;;) {
      int fd = ::accept4(listener_.fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0 && (errno == EMFILE || errno == ENFILE) && spareFd_ >= 0) {
        // Out of descriptors, the client would stay in the backlog and the listener readable:
        // the loop would spin on it. The spare descriptor makes room to take it and close it.
        int err = errno;
        ::close(spareFd_);
        int refused = ::accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (refused >= 0) ::close(refused);
        spareFd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        log(Level::Warn, "refused a client: the keeper's open-file limit is reached; raise it (LimitNOFILE= in its unit) or hold fewer records", {{"error", std::strerror(err)}});
        if (refused >= 0) continue;
        return;
      }
      if (fd < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
          log(Level::Warn, "accept failed", {{"error", std::strerror(errno)}});
        }
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      ucred cred{};
      socklen_t len = sizeof cred;
      if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::geteuid()) {
        log(Level::Warn, "refused a client of another uid: the keeper serves only its own user",
            {{"peerUid", static_cast<long long>(cred.uid)}, {"peerPid", static_cast<int>(cred.pid)}, {"uid", static_cast<long long>(::geteuid())}});
        ::close(fd);
        continue;
      }
      if (connections_.size() >= kMaxConnections && !closeLongestIdle()) {
        log(Level::Warn, "refused a client: too many connections, none of them idle", {{"peerPid", static_cast<int>(cred.pid)}, {"limit", static_cast<int>(kMaxConnections)}});
        ::close(fd);
        continue;
      }
      log(Level::Debug, "client connected", {{"peerPid", static_cast<int>(cred.pid)}});
      connections_.push_back(std::make_unique<Connection>(fd, cred.pid, inFlight_));
    }
  }

  bool roomForAnother() const {
    if (connections_.size() < kMaxConnections) return true;
    for (const auto& c : connections_) {
      if (c->phase() == Connection::Phase::Idle && !c->finished()) return true;
    }
    return false;
  }

  // A full keeper makes room for a new client by closing the client that has been idle longest
  // (one that connected and sent nothing, or took its reply and sent nothing since): idle
  // connections never lock the daemon out. Those mid-request, mid-reply or watching stay.
  bool closeLongestIdle() {
    auto idle = connections_.end();
    std::optional<Clock::time_point> oldest;
    for (auto it = connections_.begin(); it != connections_.end(); ++it) {
      if ((*it)->phase() != Connection::Phase::Idle || (*it)->finished()) continue;
      Clock::time_point d = *(*it)->deadline(options_.timeouts);
      if (!oldest || d < *oldest) {
        oldest = d;
        idle = it;
      }
    }
    if (idle == connections_.end()) return false;
    log(Level::Info, "closed the longest-idle client to make room for a new one", {{"peerPid", static_cast<int>((*idle)->peerPid())}, {"limit", static_cast<int>(kMaxConnections)}});
    connections_.erase(idle);
    return true;
  }

  // Each phase has its deadline (Timeouts): a request cut off mid-frame is told why, then closed;
  // a reply nobody takes and an idle connection are closed. While frames wait for room in the
  // budget, one that holds room and arrives slower than kMinLargeRequestRate is refused too.
  void closeOverdue() {
    Clock::time_point now = Clock::now();
    for (auto& c : connections_) {
      std::optional<Clock::time_point> held = c->holdDeadline();
      if (inFlight_.contended() && held && now >= *held && !c->finished()) {
        long long heldMs = std::chrono::duration_cast<std::chrono::milliseconds>(now - c->reservedAt()).count();
        std::string why = "a large request of " + std::to_string(c->declared()) + " bytes held room in the keeper's budget of " + std::to_string(inFlight_.limit()) +
                          " bytes for " + std::to_string(heldMs) + " ms and " + std::to_string(c->received()) + " bytes of it arrived, while other requests waited for room; one must arrive within " +
                          std::to_string(kHoldGrace.count()) + " ms and " + std::to_string(kMinLargeRequestRate >> 20) + " MiB a second of getting room: send a large request whole at once";
        log(Level::Warn, "a large request arrived too slowly while others waited for room: replied with an error and closed the connection",
            {{"code", "E_READ_TIMEOUT"}, {"error", why}, {"peerPid", static_cast<long long>(c->peerPid())}});
        c->send(errorFrame("E_READ_TIMEOUT", why));
        c->closeAfterReply();
        continue;
      }
      std::optional<Clock::time_point> d = c->deadline(options_.timeouts);
      if (!d || now < *d || c->finished()) continue;
      long long peer = c->peerPid();
      switch (c->phase()) {
        case Connection::Phase::Receiving: {
          std::string why = "request not complete within " + std::to_string(options_.timeouts.request.count()) + " ms of its first byte (" +
                            std::to_string(c->received()) + " of " + (c->declared() ? std::to_string(c->declared()) : std::string("?")) + " bytes received" +
                            (c->parked() ? ", waiting for the keeper to receive " + std::to_string(inFlight_.used()) + " bytes of other requests" : "") + ")";
          log(Level::Warn, "a request did not arrive in time: replied with an error and closed the connection", {{"code", "E_READ_TIMEOUT"}, {"error", why}, {"peerPid", peer}});
          c->send(errorFrame("E_READ_TIMEOUT", why));
          c->closeAfterReply();
          break;
        }
        case Connection::Phase::Replying:
          log(Level::Warn, "a client did not take its reply in time: closed the connection", {{"timeoutMs", static_cast<long long>(options_.timeouts.request.count())}, {"peerPid", peer}});
          c->closeNow();
          break;
        case Connection::Phase::Idle:
          log(Level::Info, "closed a client that sent nothing within the idle timeout", {{"timeoutMs", static_cast<long long>(options_.timeouts.idle.count())}, {"peerPid", peer}});
          c->closeNow();
          break;
        case Connection::Phase::Watching: break;
      }
    }
  }

  void serve(Connection& c, short revents) {
    if (revents & POLLOUT) c.flush();
    if (!(revents & (POLLIN | POLLHUP | POLLERR)) || c.finished()) return;
    // Not polled for input while parked, but a hang-up still shows: its request can be answered to nobody.
    if (c.parked() && (revents & (POLLHUP | POLLERR))) {
      c.closeNow();
      return;
    }
    try {
      bool wasParked = c.parked();
      std::optional<Request> request = c.read();
      if (c.parked() && !wasParked) {
        log(Level::Debug, "a request waits for room: the keeper is receiving as many bytes of large requests as it holds at once",
            {{"bytes", static_cast<unsigned long>(c.declared())}, {"inFlight", static_cast<unsigned long>(inFlight_.used())}, {"limit", static_cast<unsigned long>(inFlight_.limit())}, {"peerPid", static_cast<int>(c.peerPid())}});
      }
      if (!request) return;
      if (c.watching) {
        log(Level::Warn, "a WATCH connection sent another request: closing it", {{"peerPid", static_cast<int>(c.peerPid())}});
        closeAll(request->fds);
        c.closeNow();
        return;
      }
      size_t watchers = std::count_if(connections_.begin(), connections_.end(), [](const auto& other) { return other->watching && !other->finished(); });
      Reply reply = handleRequest(store_, info_, c, std::move(*request), watchers);
      if (c.watching || !reply.logMsg.empty()) armed_ = armed_ || c.watching || reply.logMsg == "kept";
      if (!reply.logMsg.empty()) {
        log(Level::Info, reply.logMsg, {{"device", reply.device}, {"fingerprint", reply.fingerprint}, {"peerPid", static_cast<int>(c.peerPid())},
                                        {"fds", static_cast<unsigned long>(reply.fds.size())}});
      }
      if (!reply.frame.empty()) c.send(std::move(reply.frame), std::move(reply.fds));
    } catch (const KeeperError& e) {
      log(Level::Warn, "bad request: replied with an error and closed the connection", {{"code", e.code()}, {"error", e.what()}, {"peerPid", static_cast<int>(c.peerPid())}});
      c.send(errorFrame(e.code(), e.what()));
      c.closeAfterReply();
    } catch (const std::exception& e) {
      log(Level::Error, "request failed", {{"error", e.what()}, {"peerPid", static_cast<int>(c.peerPid())}});
      c.send(errorFrame("E_INTERNAL", std::string("the keeper failed: ") + e.what()));
      c.closeAfterReply();
    }
  }

  void reapConnections() {
    for (auto it = connections_.begin(); it != connections_.end();) {
      Connection& c = **it;
      if (!c.finished()) {
        ++it;
        continue;
      }
      if (c.gone() && c.midFrame()) log(Level::Warn, "client went away mid-request: its partial request is dropped", {{"peerPid", static_cast<int>(c.peerPid())}});
      log(Level::Debug, c.watching ? "watcher disconnected" : "client disconnected", {{"peerPid", static_cast<int>(c.peerPid())}});
      it = connections_.erase(it);
    }
  }

  void logEvents(const std::vector<StoreEvent>& events) {
    for (const StoreEvent& e : events) log(Level::Info, e.msg, {{"device", e.device}, {"fingerprint", e.fingerprint}, {"ownerPid", static_cast<int>(e.pid)}});
  }

  Options options_;
  Listener listener_;
  int sigFd_;
  Store store_;
  KeeperInfo info_;
  InFlight inFlight_;
  std::vector<std::unique_ptr<Connection>> connections_;
  bool armed_ = false;
  // Held for the moment the keeper runs out of descriptors (acceptAll).
  int spareFd_ = -1;
};

}  // namespace
}  // namespace weightd::keeper

int main(int argc, char** argv) {
  using namespace weightd::keeper;
  try {
    Options options = parseOptions(argc, argv);
    setLogLevel(options.level);
    raiseFdLimit();
    int sigFd = signalFd();
    stopWithParent(options.stopWithParent);
    Listener listener = listenOn(options.socket);
    return Keeper(std::move(options), listener, sigFd).run();
  } catch (const SetupError& e) {
    std::fprintf(stderr, "weightd-keeper: %s\n", e.what());
    return e.exitCode();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weightd-keeper: %s\n", e.what());
    return 1;
  }
}
