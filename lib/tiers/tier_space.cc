// Tier budgets and their error messages.
#include "lib/tiers/tier_space.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/cord.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "lib/base/status.h"

namespace tiermem {

namespace {

// Marks a backing's failure (IsBackingShort); rides in a payload, as the tm_status tag does.
constexpr absl::string_view kBackingShort = "tiermem.backing_short";

}  // namespace

bool IsBackingShort(const absl::Status& s) { return s.GetPayload(kBackingShort).has_value(); }

absl::Status TierSpace::Full(uint64_t bytes, absl::string_view tensor_name, uint64_t free,
                             uint64_t largest) const {
  tm_status code = tier_ == TM_TIER_NVME ? TM_ERR_NO_SPACE : TM_ERR_OUT_OF_MEMORY;
  return Error(
      code, absl::StrFormat("the %s tier is full: tensor \"%s\" needs %s; %s of %s are free, the "
                            "largest free block is %s",
                            tm_tier_name(tier_), tensor_name, HumanBytes(bytes), HumanBytes(free),
                            HumanBytes(alloc_.capacity()), HumanBytes(largest)));
}

absl::StatusOr<Extent> TierSpace::Allocate(uint64_t bytes, absl::string_view tensor_name,
                                           uint64_t owner) {
  return AllocatePlaced(bytes, tensor_name, owner, nullptr);
}

absl::StatusOr<Extent> TierSpace::Allocate(uint64_t bytes, absl::string_view tensor_name,
                                           uint64_t owner, FreesAfter frees_after) {
  return AllocatePlaced(bytes, tensor_name, owner, &frees_after);
}

absl::StatusOr<Extent> TierSpace::AllocatePlaced(uint64_t bytes, absl::string_view tensor_name,
                                                 uint64_t owner, const FreesAfter* frees_after) {
  if (counted()) return AllocateCounted(bytes, tensor_name, owner);
  MutexLock lock(&mu_);
  auto side = [&](uint32_t prev, uint32_t next) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    auto after = [&](uint32_t block) ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (block == OffsetAllocator::kNone) return UINT64_MAX;  // the tier's end: never
      return (*frees_after)(block < owners_.size() ? owners_[block] : 0);
    };
    // The leftover goes next to the neighbour that frees sooner; ties keep the front (the
    // plain allocator's choice, the leftover after the request).
    return after(prev) < after(next) ? OffsetAllocator::Side::kBack : OffsetAllocator::Side::kFront;
  };
  auto a = frees_after == nullptr ? alloc_.Allocate(bytes) : alloc_.Allocate(bytes, 0, side);
  if (!a.has_value()) {
    return Full(bytes, tensor_name, alloc_.capacity() - alloc_.used(), alloc_.LargestFree());
  }
  if (owners_.size() <= a->block) owners_.resize(a->block + 1);
  owners_[a->block] = owner;
  return Extent{a->offset, a->size, a->block};
}

std::optional<Extent> TierSpace::SlideDown(const Extent& e) {
  if (e.empty() || counted()) return std::nullopt;
  MutexLock lock(&mu_);
  const std::optional<uint64_t> offset = alloc_.SlideDown(e.block);
  if (!offset.has_value()) return std::nullopt;
  return Extent{*offset, e.size, e.block};
}

void TierSpace::Disown(const Extent& e) { Reown(e, 0); }

void TierSpace::Reown(const Extent& e, uint64_t owner) {
  if (e.empty()) return;
  MutexLock lock(&mu_);
  if (counted()) {
    if (e.block < counted_.size()) counted_[e.block].owner = owner;
    return;
  }
  if (e.block < owners_.size()) owners_[e.block] = owner;
}

absl::StatusOr<Extent> TierSpace::AllocateCounted(uint64_t bytes, absl::string_view tensor_name,
                                                  uint64_t owner) {
  uint32_t block = 0;
  uint64_t size = 0;
  {
    MutexLock lock(&mu_);
    size = alloc_.Rounded(bytes);
    const uint64_t free = alloc_.capacity() - counted_used_;
    if (size == 0 || size > free) return Full(bytes, tensor_name, free, free);
    // Counted before the backing is asked, so that the backing never holds more than capacity.
    counted_used_ += size;
    counted_peak_ = std::max(counted_peak_, counted_used_);
    if (spare_.empty()) {
      block = static_cast<uint32_t>(counted_.size());
      counted_.emplace_back();
    } else {
      block = spare_.back();
      spare_.pop_back();
    }
    counted_[block] = Counted{size, owner, nullptr};
  }
  // Asked without the space's lock: an outside allocator may take its time (cudaMalloc).
  absl::StatusOr<void*> memory = backing_.allocate(size, tensor_name);
  MutexLock lock(&mu_);
  if (!memory.ok() || *memory == nullptr) {
    counted_[block] = Counted{};
    spare_.push_back(block);
    counted_used_ -= size;
    absl::Status s =
        memory.ok() ? Error(TM_ERR_OUT_OF_MEMORY, "the allocator returned NULL") : memory.status();
    s.SetPayload(kBackingShort, absl::Cord("1"));
    return s;
  }
  counted_[block].memory = *memory;
  return Extent{0, size, block, *memory};
}

void TierSpace::Free(Extent& e) {
  if (e.empty()) return;
  if (on_free_) on_free_(e);  // while the space is still e's: nothing new lands there yet
  if (counted()) {
    // Given back first, counted free after: the backing never holds more than capacity.
    backing_.free(e.memory, e.size);
    MutexLock lock(&mu_);
    counted_[e.block] = Counted{};
    spare_.push_back(e.block);
    counted_used_ -= e.size;
    e = Extent{};
    return;
  }
  MutexLock lock(&mu_);
  alloc_.Free(e.block);
  owners_[e.block] = 0;
  e = Extent{};
}

TierSpace::~TierSpace() {
  if (!counted()) return;
  MutexLock lock(&mu_);
  // The copies of tensors still alive when the runtime goes: nothing reads them any more.
  for (Counted& c : counted_) {
    if (c.memory != nullptr) backing_.free(c.memory, c.size);
    c = Counted{};
  }
  counted_used_ = 0;
}

std::vector<TierSpace::Block> TierSpace::Layout() const {
  MutexLock lock(&mu_);
  std::vector<Block> out;
  if (counted()) {
    uint64_t offset = 0;
    for (const Counted& c : counted_) {
      if (c.size == 0) continue;
      out.push_back(Block{offset, c.size, c.owner, false});
      offset += c.size;
    }
    if (counted_used_ < alloc_.capacity()) {
      out.push_back(Block{offset, alloc_.capacity() - counted_used_, 0, true});
    }
    return out;
  }
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
  return alloc_.capacity() - (counted() ? counted_used_ : alloc_.used());
}

tm_tier_stats TierSpace::Stats() const {
  MutexLock lock(&mu_);
  if (counted()) return tm_tier_stats{alloc_.capacity(), counted_used_, counted_peak_};
  return tm_tier_stats{alloc_.capacity(), alloc_.used(), alloc_.peak()};
}

}  // namespace tiermem
