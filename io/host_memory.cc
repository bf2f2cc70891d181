// mmap + hwloc binding. The memory is anonymous, as io_uring fixed buffers require.
#include "io/host_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_format.h"
#include "io/checked.h"

namespace tiermem::io {

absl::StatusOr<std::unique_ptr<HostRegion>> HostRegion::Create(uint64_t bytes, const Topology* topo,
                                                               int node) {
  // The region is 2 MiB aligned and asks for transparent huge pages: an O_DIRECT request of
  // 1 MiB then spans one physically contiguous segment instead of 256 pages, which a virtio or
  // NVMe queue with a segment limit (often 254) would split; DMA mapping and the TLB gain too.
  constexpr uint64_t kHuge = 2ull << 20;
  // The round-up and the alignment slack must not wrap: near 2^64 they once mapped nothing.
  // No address space holds half of 2^64 either, so larger requests are refused as invalid.
  const auto rounded = RoundUp(bytes, kHuge);
  if (bytes == 0 || !rounded.has_value() || *rounded > (uint64_t{1} << 62)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%llu bytes of host memory is not a possible size (1 byte to 4 EiB)",
                        static_cast<unsigned long long>(bytes)));
  }
  bytes = *rounded;
  void* raw =
      mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    int err = errno;
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot map %llu bytes of host memory for the DRAM tier: %s",
                        static_cast<unsigned long long>(bytes), std::strerror(err)));
  }
  // Trim the mapping to the aligned range.
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHuge - 1) / kHuge * kHuge;
  if (aligned > start) munmap(raw, aligned - start);
  if (const uintptr_t tail = start + bytes + kHuge - (aligned + bytes); tail > 0) {
    munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  }
  void* p = reinterpret_cast<void*>(aligned);
  // Advice only: where THP is off ("never") the region stays on small pages.
  (void)madvise(p, bytes, MADV_HUGEPAGE);
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
