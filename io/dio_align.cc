// O_DIRECT alignment probing. statx is called raw: glibc 2.36's struct statx lacks the DIOALIGN
// fields, so this file uses the kernel's struct and includes no glibc stat header.
#include <linux/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "io/swap_file.h"

#ifndef AT_EMPTY_PATH
#define AT_EMPTY_PATH 0x1000
#endif

namespace tiermem::io {
namespace {

uint32_t SysfsLogicalBlockSize(uint32_t major, uint32_t minor) {
  // A partition has no queue/ of its own: its parent's holds the limits.
  for (const char* rel : {"queue/logical_block_size", "../queue/logical_block_size"}) {
    std::string path =
        "/sys/dev/block/" + std::to_string(major) + ":" + std::to_string(minor) + "/" + rel;
    FILE* f = std::fopen(path.c_str(), "re");
    if (f == nullptr) continue;
    unsigned v = 0;
    int n = std::fscanf(f, "%u", &v);
    std::fclose(f);
    if (n == 1 && v >= 512 && (v & (v - 1)) == 0) return v;
  }
  return 0;
}

}  // namespace

uint32_t ProbeDirectIoAlignment(int fd, std::string* source) {
  struct statx stx = {};
  long rc = syscall(SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx);
  if (rc == 0) {
    if ((stx.stx_mask & STATX_DIOALIGN) != 0 && stx.stx_dio_offset_align != 0) {
      uint32_t a = stx.stx_dio_offset_align > stx.stx_dio_mem_align ? stx.stx_dio_offset_align
                                                                    : stx.stx_dio_mem_align;
      *source = "statx";
      return a;
    }
    if (uint32_t b = SysfsLogicalBlockSize(stx.stx_dev_major, stx.stx_dev_minor); b != 0) {
      *source = "block device";
      return b;
    }
  }
  *source = "default";
  return 4096;
}

}  // namespace tiermem::io
