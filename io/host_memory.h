// Anonymous host memory for the DRAM tier, bound to a NUMA node before first touch.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "io/numa.h"

namespace tiermem::io {

class HostRegion {
 public:
  // Maps `bytes` (rounded up to 2 MiB) and, when node >= 0, binds it to that node.
  // InvalidArgument for 0 or a size no address space can hold; ResourceExhausted when the
  // mapping is refused.
  static absl::StatusOr<std::unique_ptr<HostRegion>> Create(uint64_t bytes, const Topology* topo,
                                                            int node);
  ~HostRegion();
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;

  void* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  HostRegion() = default;
  void* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace tiermem::io
