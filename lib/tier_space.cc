// Tier budgets and their error messages.
#include "lib/tier_space.h"

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "lib/status.h"

namespace tiermem {

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrFormat("%llu B", static_cast<unsigned long long>(bytes))
                : absl::StrFormat("%.4g %s", v, kUnits[u]);
}

absl::StatusOr<Extent> TierSpace::Allocate(uint64_t bytes, absl::string_view tensor_name,
                                           uint64_t owner) {
  MutexLock lock(&mu_);
  auto a = alloc_.Allocate(bytes);
  if (!a.has_value()) {
    tm_status code = tier_ == TM_TIER_NVME ? TM_ERR_NO_SPACE : TM_ERR_OUT_OF_MEMORY;
    return Error(
        code, absl::StrFormat("the %s tier is full: tensor \"%s\" needs %s; %s of %s are free, the "
                              "largest free block is %s",
                              tm_tier_name(tier_), tensor_name, HumanBytes(bytes),
                              HumanBytes(alloc_.capacity() - alloc_.used()),
                              HumanBytes(alloc_.capacity()), HumanBytes(alloc_.LargestFree())));
  }
  if (owners_.size() <= a->block) owners_.resize(a->block + 1);
  owners_[a->block] = owner;
  return Extent{a->offset, a->size, a->block};
}

void TierSpace::Disown(const Extent& e) {
  if (e.empty()) return;
  MutexLock lock(&mu_);
  if (e.block < owners_.size()) owners_[e.block] = 0;
}

void TierSpace::Free(Extent& e) {
  if (e.empty()) return;
  if (on_free_) on_free_(e);  // while the space is still e's: nothing new lands there yet
  MutexLock lock(&mu_);
  alloc_.Free(e.block);
  owners_[e.block] = 0;
  e = Extent{};
}

std::vector<TierSpace::Block> TierSpace::Layout() const {
  MutexLock lock(&mu_);
  std::vector<Block> out;
  alloc_.ForEachBlock([&](const OffsetAllocator::Span& s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    out.push_back(Block{s.offset, s.size, s.free ? 0 : owners_[s.block], s.free});
  });
  return out;
}

uint64_t TierSpace::Rounded(uint64_t bytes) const {
  MutexLock lock(&mu_);
  return alloc_.Rounded(bytes);
}

uint64_t TierSpace::capacity() const {
  MutexLock lock(&mu_);
  return alloc_.capacity();
}

uint64_t TierSpace::free_bytes() const {
  MutexLock lock(&mu_);
  return alloc_.capacity() - alloc_.used();
}

tm_tier_stats TierSpace::Stats() const {
  MutexLock lock(&mu_);
  return tm_tier_stats{alloc_.capacity(), alloc_.used(), alloc_.peak()};
}

}  // namespace tiermem
