// mmap + hwloc binding. The memory is anonymous, as io_uring fixed buffers require.
#include "io/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace tiermem::io {

absl::StatusOr<std::unique_ptr<HostRegion>> HostRegion::Create(uint64_t bytes, const Topology* topo,
                                                               int node) {
  uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  bytes = (bytes + page - 1) / page * page;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot map %llu bytes of host memory for the DRAM tier: %s",
        static_cast<unsigned long long>(bytes), std::strerror(err)));
  }
  std::unique_ptr<HostRegion> r(new HostRegion());
  r->data_ = p;
  r->size_ = bytes;
  if (node >= 0 && topo != nullptr) {
    if (auto s = topo->BindArea(p, bytes, node); !s.ok()) return s;
  }
  return r;
}

HostRegion::~HostRegion() {
  if (data_ != nullptr) munmap(data_, size_);
}

}  // namespace tiermem::io
