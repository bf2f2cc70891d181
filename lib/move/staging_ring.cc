// The staging ring: its shape for a DRAM budget, and leases of its slots.
#include "lib/move/staging_ring.h"

#include <algorithm>

namespace tiermem {

StagingRing::Shape StagingRing::ShapeFor(uint64_t dram_bytes, uint64_t preferred_chunk,
                                         uint64_t alignment) {
  Shape s{preferred_chunk, 8};
  const uint64_t limit = dram_bytes / 4;
  const uint64_t min_chunk = std::max<uint64_t>(alignment, 64 << 10);
  while (s.bytes() > limit && s.chunk / 2 >= min_chunk) s.chunk /= 2;
  while (s.bytes() > limit && s.slots > 2) s.slots /= 2;
  s.chunk = s.chunk / alignment * alignment;
  return s;
}

StagingRing::StagingRing(char* base, Shape shape) : shape_(shape) {
  MutexLock lock(&mu_);
  for (uint32_t i = 0; i < shape.slots; ++i) free_.push_back(base + i * shape.chunk);
}

StagingRing::Lease StagingRing::Acquire(uint32_t n) {
  MutexLock lock(&mu_);
  while (free_.size() < n) released_.Wait(&mu_);
  std::vector<char*> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  return Lease(*this, std::move(out));
}

void StagingRing::Release(const std::vector<char*>& slots) {
  MutexLock lock(&mu_);
  free_.insert(free_.end(), slots.begin(), slots.end());
  released_.SignalAll();
}

}  // namespace tiermem
