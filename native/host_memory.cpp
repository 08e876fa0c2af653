#include "host_memory.h"

#include <fstream>
#include <sstream>

namespace weightd {

namespace {

// A "Key:   123 kB" line of /proc/meminfo, in bytes; 0 when absent.
uint64_t meminfoBytes(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    return std::stoull(line.substr(key.size() + 1)) * 1024;
  }
  return 0;
}

bool readFile(const std::string& path, std::string& out) {
  std::ifstream f(path);
  if (!f) return false;
  std::ostringstream s;
  s << f.rdbuf();
  out = s.str();
  return true;
}

// A cgroup file holding one number ("max" or unreadable: no bound).
bool cgroupNumber(const std::string& path, uint64_t& out) {
  std::string text;
  if (!readFile(path, text) || text.compare(0, 3, "max") == 0) return false;
  try {
    out = std::stoull(text);
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// This process's cgroup v2 path ("0::/system.slice/x.service"); empty without cgroup v2.
std::string cgroupPath() {
  std::string text;
  if (!readFile("/proc/self/cgroup", text)) return "";
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, 3, "0::") == 0) return line.substr(3);
  }
  return "";
}

// A "key N" line of a cgroup's memory.stat; 0 when absent.
uint64_t statValue(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string name;
  uint64_t value = 0;
  while (in >> name >> value) {
    if (name == key) return value;
  }
  return 0;
}

// Lowers m's bounds to what the cgroup in `dir` still allows. Its usage counts the page cache,
// which the kernel reclaims when a fill needs the room (a checkpoint just read is exactly that),
// but not shmem (memfd pages, ours included), which it cannot: those are added back and kept.
void boundByCgroup(HostMemory& m, const std::string& dir, const std::string& maxName, const std::string& currentName,
                   const std::string& fileKey, const std::string& shmemKey) {
  uint64_t max = 0, current = 0;
  // cgroup v1 writes "no limit" as a number near 2^63.
  if (!cgroupNumber(dir + "/" + maxName, max) || max >= (uint64_t{1} << 62) || !cgroupNumber(dir + "/" + currentName, current)) return;
  std::string stat;
  uint64_t reclaimable = 0;
  if (readFile(dir + "/memory.stat", stat)) {
    uint64_t file = statValue(stat, fileKey), shmem = statValue(stat, shmemKey);
    reclaimable = file > shmem ? file - shmem : 0;
  }
  uint64_t used = current > reclaimable ? current - reclaimable : 0;
  uint64_t left = max > used ? max - used : 0;
  if (max < m.totalBytes) m.totalBytes = max;
  if (left < m.freeBytes) {
    m.freeBytes = left;
    m.limitedBy = dir + "/" + maxName;
  }
}

}  // namespace

HostMemory hostMemory() {
  HostMemory m;
  std::string meminfo;
  if (readFile("/proc/meminfo", meminfo)) {
    m.totalBytes = meminfoBytes(meminfo, "MemTotal");
    m.freeBytes = meminfoBytes(meminfo, "MemAvailable");
    m.limitedBy = "MemAvailable";
  }
  // cgroup v2: a limit set on any ancestor binds this cgroup too, so take the tightest.
  for (std::string path = cgroupPath(); !path.empty();) {
    std::string dir = "/sys/fs/cgroup" + (path == "/" ? "" : path);
    boundByCgroup(m, dir, "memory.max", "memory.current", "file", "shmem");
    if (path == "/") break;
    size_t slash = path.rfind('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  // cgroup v1 (hybrid hosts, older Docker): a container sees its own memory cgroup at the mount's root.
  boundByCgroup(m, "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_cache", "total_shmem");
  return m;
}

}  // namespace weightd
