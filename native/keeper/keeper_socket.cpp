#include "keeper_socket.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace weightd::keeper {
namespace {

std::string why(int err) { return std::strerror(err); }

sockaddr_un addressOf(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    throw SetupError(kExitSetup, "--socket " + path + " is " + std::to_string(path.size()) + " bytes; a Unix socket path needs 1 to " +
                                     std::to_string(sizeof addr.sun_path - 1) + ": choose a shorter one");
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  return addr;
}

void checkDirectory(const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) throw SetupError(kExitSetup, "cannot stat the socket directory " + dir + ": " + why(errno) + "; create it (mode 0700)");
  if (!S_ISDIR(st.st_mode)) throw SetupError(kExitSetup, "the socket directory " + dir + " is not a directory (a symlink is refused too)");
  if (st.st_uid != ::geteuid()) {
    throw SetupError(kExitSetup, "the socket directory " + dir + " is owned by uid " + std::to_string(st.st_uid) + ", not this keeper's uid " +
                                     std::to_string(::geteuid()) + ": another user could replace the socket; use a directory of your own");
  }
  if (st.st_mode & 022) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    throw SetupError(kExitSetup, "the socket directory " + dir + " has mode " + mode + ", writable by group or others: chmod go-w it (0700 is best)");
  }
}

// What is at `path` now: nothing, a stale socket (removed here), or a live keeper (exit 3).
void clearStale(const std::string& path, const sockaddr_un& addr) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw SetupError(kExitSetup, "cannot stat " + path + ": " + why(errno));
  }
  if (!S_ISSOCK(st.st_mode)) throw SetupError(kExitSetup, path + " exists and is not a socket: remove it or choose another --socket");
  int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (probe < 0) throw SetupError(kExitSetup, "cannot create a socket: " + why(errno));
  int r = ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  int err = errno;
  ::close(probe);
  if (r == 0) throw SetupError(kExitAlreadyServed, "a keeper already serves " + path + ": use it, or stop it (SIGTERM) first");
  if (err != ECONNREFUSED) throw SetupError(kExitSetup, "cannot tell whether " + path + " is live: connect failed with " + why(err));
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) throw SetupError(kExitSetup, "cannot remove the stale socket " + path + ": " + why(errno));
}

}  // namespace

Listener listenOn(const std::string& path) {
  sockaddr_un addr = addressOf(path);
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  checkDirectory(dir);
  // Two keepers starting at once: the lock makes one find the other's live socket rather than
  // both judge it stale and one unlink the other's.
  int dirFd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirFd < 0) throw SetupError(kExitSetup, "cannot open the socket directory " + dir + ": " + why(errno));
  ::flock(dirFd, LOCK_EX);
  struct Unlock {
    int fd;
    ~Unlock() { ::close(fd); }
  } unlock{dirFd};

  clearStale(path, addr);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw SetupError(kExitSetup, "cannot create a socket: " + why(errno));
  mode_t old = ::umask(077);  // owner-only from the start: no moment where another uid could connect
  int r = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
  int err = errno;
  ::umask(old);
  if (r != 0) {
    ::close(fd);
    throw SetupError(kExitSetup, "cannot bind " + path + ": " + why(err));
  }
  struct stat st {};
  if (::chmod(path.c_str(), 0600) != 0 || ::listen(fd, 64) != 0 || ::lstat(path.c_str(), &st) != 0) {
    err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    throw SetupError(kExitSetup, "cannot listen on " + path + ": " + why(err));
  }
  return {fd, st.st_ino};
}

void removeSocket(const std::string& path, const Listener& listener) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == listener.inode) ::unlink(path.c_str());
}

}  // namespace weightd::keeper
