// The disk cache of compiled kernels (CUDA binaries, the CPU's shared libraries): one
// file per entry in cache_dir(), named by its key. See disk_cache.h, and
// ops/cuda/kernel_cache.cpp for what a CUDA entry's key covers.
#include "ops/codegen/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>

#include "ops/codegen/hash.h"

namespace cl {
namespace codegen {

namespace {

bool valid_key(const std::string& key) {
  return key.size() == 64 && key.find_first_not_of("0123456789abcdef") == std::string::npos;
}

}  // namespace

namespace disk {

int open_dir(const std::string& dir, std::string* why) {
  if (dir.empty()) {
    *why = "the disk cache is off (CASTLAB_CACHE_DIR is set but empty)";
    return -1;
  }
  // Create missing folders 0700 (whatever the umask); existing parents are left alone.
  bool created = false;
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i < dir.size() && dir[i] != '/') continue;
    const std::string cur = dir.substr(0, i);
    if (mkdir(cur.c_str(), 0700) == 0)
      created = true;
    else if (errno != EEXIST) {
      *why = "cannot create " + cur + ": " + std::strerror(errno);
      return -1;
    }
  }
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot open " + dir + ": " + std::strerror(errno);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISDIR(st.st_mode)) {
    close(fd);
    *why = dir + " is not a directory";
    return -1;
  }
  if (st.st_uid != geteuid()) {
    close(fd);
    *why = dir + " is owned by uid " + std::to_string(st.st_uid) + ", not by this user (" +
           std::to_string(geteuid()) + ")";
    return -1;
  }
  if (created && (st.st_mode & 07777) != 0700) {
    if (fchmod(fd, 0700) == 0) st.st_mode = (st.st_mode & ~07777) | 0700;
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    *why = dir + " is writable by other users (mode " + mode + ")";
    return -1;
  }
  return fd;
}

std::string load(int dirfd, const std::string& key, std::string* kind, std::string* payload) {
  if (!valid_key(key)) return "bad key";
  const std::string name = key + ".bin";
  const int fd = openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? "missing" : errno == ELOOP ? "symlink" : "read error";
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  struct stat st;
  if (fstat(fd, &st) != 0) return "read error";
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (st.st_uid != geteuid()) return "foreign owner";
  const size_t cap = kMaxEntryBytes + 512;  // payload + header
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > cap) return "too large";
  std::string all;
  all.resize(static_cast<size_t>(st.st_size) + 1);  // one more: notices a file that grew
  size_t got = 0;
  while (got < all.size()) {
    const ssize_t n = read(fd, &all[got], all.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return "read error";
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  all.resize(got);
  const size_t nl = all.find('\n');
  if (nl == std::string::npos || nl > 300) return "bad header";
  const std::string header = all.substr(0, nl);
  char magic[32] = {0}, k[16] = {0}, sum[80] = {0}, ekey[80] = {0};
  int ver = 0;
  unsigned long long size = 0;
  if (std::sscanf(header.c_str(), "%31s %d %15s %llu %79s %79s", magic, &ver, k, &size, sum,
                  ekey) != 6)
    return "bad header";
  if (std::string(magic) != "castlab-kernel" || ver != 2) return "bad header";
  if (std::string(k) != "cubin" && std::string(k) != "ptx" && std::string(k) != "so")
    return "bad header";
  if (ekey != key) return "key mismatch";
  if (all.size() - nl - 1 != size) return "size mismatch";
  std::string data = all.substr(nl + 1);
  if (sha256_hex(data) != sum) return "checksum mismatch";
  *kind = k;
  *payload = std::move(data);
  return "ok";
}

bool store(int dirfd, const std::string& key, const std::string& kind, const std::string& payload) {
  if (!valid_key(key) || payload.size() > kMaxEntryBytes) return false;
  if (kind != "cubin" && kind != "ptx" && kind != "so") return false;
  std::random_device rd;
  char rnd[16];
  std::snprintf(rnd, sizeof rnd, "%08x", static_cast<unsigned>(rd()));
  const std::string name = key + ".bin";
  const std::string tmp = name + ".tmp." + std::to_string(getpid()) + "." + rnd;
  const int fd =
      openat(dirfd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = fchmod(fd, 0600) == 0;  // the umask can only remove bits; be explicit anyway
  const std::string data = "castlab-kernel 2 " + kind + " " + std::to_string(payload.size()) + " " +
                           sha256_hex(payload) + " " + key + "\n" + payload;
  size_t put = 0;
  while (ok && put < data.size()) {
    const ssize_t n = write(fd, data.data() + put, data.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      ok = false;
    else
      put += static_cast<size_t>(n);
  }
  ok = (close(fd) == 0) && ok;
  if (ok && renameat(dirfd, tmp.c_str(), dirfd, name.c_str()) == 0) return true;
  unlinkat(dirfd, tmp.c_str(), 0);
  return false;
}

int clean_temps(int dirfd, int max_age_s) {
  const int fd = dup(dirfd);
  if (fd < 0) return 0;
  DIR* d = fdopendir(fd);
  if (!d) {
    close(fd);
    return 0;
  }
  rewinddir(d);
  std::vector<std::string> doomed;
  const time_t now = time(nullptr);
  while (struct dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    const size_t t = name.find(".bin.tmp.");
    if (t != 64 || !valid_key(name.substr(0, 64))) continue;
    const char* p = name.c_str() + t + 9;
    char* end = nullptr;
    const long pid = std::strtol(p, &end, 10);
    struct stat st;
    if (fstatat(dirfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    const bool dead = end != p && *end == '.' && pid > 0 && pid != getpid() &&
                      kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    const bool old = now - st.st_mtime > max_age_s;
    if (dead || old) doomed.push_back(name);
  }
  closedir(d);
  int removed = 0;
  for (const auto& name : doomed)
    if (unlinkat(dirfd, name.c_str(), 0) == 0) ++removed;
  return removed;
}

}  // namespace disk

std::string cache_dir() {
  if (const char* e = std::getenv("CASTLAB_CACHE_DIR")) return e;  // "": disk cache off
  const char* x = std::getenv("XDG_CACHE_HOME");
  if (x && x[0] == '/') return std::string(x) + "/castlab/kernels";
  const char* h = std::getenv("HOME");
  if (h && h[0] == '/' && h[1] != '\0') return std::string(h) + "/.cache/castlab/kernels";
  return "/tmp/castlab-kernels-" + std::to_string(geteuid());  // owner-checked on use
}

}  // namespace codegen
}  // namespace cl
