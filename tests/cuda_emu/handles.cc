// CUDA emulation: the IPC handle format that cudaIpcMemHandle_t and
// cudaIpcEventHandle_t share. Both export a memfd (an allocation's, or an
// interprocess event's shared page); the handle names the exporter's pid and
// fd and the memfd's unique name, and an opener in another process reaches
// the same object through /proc/<pid>/fd. See state.h for the design.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "state.h"

namespace tfring_emu {
namespace detail {

std::string memfdName(uint64_t nonce, uint64_t gen) {
  char buf[64];
  snprintf(buf, sizeof(buf), "tfring-emu-%016llx-%llu", static_cast<unsigned long long>(nonce),
           static_cast<unsigned long long>(gen));
  return buf;
}

void fillHandle(char reserved[64], const HandleData& d) {
  memset(reserved, 0, 64);
  memcpy(reserved, &d, sizeof(d));
}

bool readHandle(const char reserved[64], uint32_t kind, HandleData* d) {
  memcpy(d, reserved, sizeof(*d));
  return d->magic == kMagic && d->kind == kind && d->pid > 0 && d->fd >= 0;
}

// Opens the exporter's memfd through /proc, after checking that the fd still
// is the object the handle names. -1 if the exporter (or the object) is gone.
int openExported(const HandleData& h, uint64_t min_len) {
  char path[64], link[512];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", h.pid, h.fd);
  ssize_t n = readlink(path, link, sizeof(link) - 1);
  if (n < 0) return -1;
  link[n] = 0;
  const std::string want = "/memfd:" + memfdName(h.nonce, h.gen);  // then " (deleted)"
  if (strncmp(link, want.c_str(), want.size()) != 0 || (link[want.size()] && link[want.size()] != ' '))
    return -1;
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < min_len) {
    close(fd);
    return -1;
  }
  return fd;
}


}  // namespace detail
}  // namespace tfring_emu
