// Chunks found in a bitmap, mapped side by side into a hole of the reserved range.
#include "lib/tiers/mapped_arena.h"

#include <bit>
#include <utility>

#include "absl/strings/str_format.h"

namespace tiermem {

absl::StatusOr<std::unique_ptr<MappedArena>> MappedArena::Create(io::Device& device,
                                                                 uint64_t bytes) {
  auto mapper = device.CreateChunkMapper(bytes, kRangeMultiple);
  if (!mapper.ok()) return mapper.status();
  return std::unique_ptr<MappedArena>(new MappedArena(std::move(*mapper)));
}

MappedArena::MappedArena(std::unique_ptr<io::ChunkMapper> mapper)
    : mapper_(std::move(mapper)),
      chunk_(mapper_->chunk_bytes()),
      capacity_(mapper_->chunks() * chunk_),
      range_(mapper_->range_bytes(), chunk_) {
  const uint64_t n = mapper_->chunks();
  MutexLock lock(&mu_);
  free_.assign((n + 63) / 64, ~uint64_t{0});
  if (n % 64 != 0) free_.back() = (uint64_t{1} << (n % 64)) - 1;
  free_count_ = n;
}

MappedArena::~MappedArena() {
  MutexLock lock(&mu_);
  for (const auto& [memory, m] : mappings_) {
    const char* p = static_cast<const char*>(memory);
    mapper_->Unmap(static_cast<uint64_t>(p - mapper_->base()), m.chunks.data(), m.chunks.size());
  }
  mappings_.clear();
}

uint64_t MappedArena::free_chunks() const {
  MutexLock lock(&mu_);
  return free_count_;
}

absl::StatusOr<void*> MappedArena::Allocate(uint64_t bytes) {
  if (bytes == 0 || bytes % chunk_ != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "mapped HBM: %llu bytes is not a whole number of %llu-byte chunks",
        static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(chunk_)));
  }
  const uint64_t count = bytes / chunk_;
  MutexLock lock(&mu_);
  if (count > free_count_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "mapped HBM: %llu chunks wanted, %llu free", static_cast<unsigned long long>(count),
        static_cast<unsigned long long>(free_count_)));
  }
  auto hole = range_.Allocate(bytes);
  if (!hole.has_value()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("mapped HBM: no hole of %llu bytes left in the reserved address range",
                        static_cast<unsigned long long>(bytes)));
  }
  Mapping m{hole->block, {}};
  m.chunks.reserve(count);
  for (uint64_t w = 0; w < free_.size() && m.chunks.size() < count; ++w) {
    for (uint64_t bits = free_[w]; bits != 0 && m.chunks.size() < count; bits &= bits - 1) {
      m.chunks.push_back(w * 64 + static_cast<uint64_t>(std::countr_zero(bits)));
    }
  }
  if (auto s = mapper_->Map(hole->offset, m.chunks.data(), count); !s.ok()) {
    range_.Free(hole->block);  // the mapper left nothing mapped; the chunks stay free
    return s;
  }
  for (uint64_t c : m.chunks) free_[c / 64] &= ~(uint64_t{1} << (c % 64));
  free_count_ -= count;
  void* memory = mapper_->base() + hole->offset;
  mappings_.emplace(memory, std::move(m));
  return memory;
}

void MappedArena::Free(void* memory) {
  MutexLock lock(&mu_);
  auto it = mappings_.find(memory);
  if (it == mappings_.end()) return;
  const Mapping& m = it->second;
  const uint64_t offset = static_cast<uint64_t>(static_cast<char*>(memory) - mapper_->base());
  mapper_->Unmap(offset, m.chunks.data(), m.chunks.size());
  for (uint64_t c : m.chunks) free_[c / 64] |= uint64_t{1} << (c % 64);
  free_count_ += m.chunks.size();
  range_.Free(m.block);
  mappings_.erase(it);
}

}  // namespace tiermem
