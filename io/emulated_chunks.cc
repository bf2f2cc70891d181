// The emulated device's chunk mapper (TIERMEM_HBM_LAYOUT=mapped without a GPU), apart from the
// device itself: anonymous huge pages moved with mremap between a park and the copies' range.
#include "io/emulated_chunks.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"

namespace tiermem::io {
namespace {

// The emulated device's chunks: 2 MiB of anonymous memory each, a GPU's granularity, kept in a
// parking range (chunk i at park + i * 2 MiB) while unmapped, and moved with mremap to where a
// copy needs it and back. A move carries the pages and their page tables (one entry per huge
// page where the kernel backs the chunk with one), so no byte is copied and nothing is faulted
// in again. A move never leaves a hole (MREMAP_DONTUNMAP): the ranges stay this mapper's.
class EmulatedChunkMapper final : public ChunkMapper {
 public:
  static constexpr uint64_t kChunk = uint64_t{2} << 20;

  static absl::StatusOr<std::unique_ptr<EmulatedChunkMapper>> Create(uint64_t bytes,
                                                                     uint64_t range_multiple) {
    const uint64_t chunks = bytes / kChunk;
    if (chunks == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "emulated device: %llu bytes is below one chunk (%llu bytes)",
          static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(kChunk)));
    }
    if (range_multiple == 0 || chunks > (uint64_t{1} << 46) / kChunk / (range_multiple + 1)) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("emulated device: a range of %llu x %llu bytes is too large to reserve",
                          static_cast<unsigned long long>(range_multiple),
                          static_cast<unsigned long long>(chunks * kChunk)));
    }
    if (auto s = CheckMappingsLeft(chunks); !s.ok()) return s;
    std::unique_ptr<EmulatedChunkMapper> m(new EmulatedChunkMapper(chunks, range_multiple));
    // One reservation for both, one chunk over so that both start 2 MiB aligned (huge pages).
    m->reserved_ = chunks * kChunk * (range_multiple + 1) + kChunk;
    void* p =
        mmap(nullptr, m->reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return Failed("reserving the address range");
    m->reservation_ = static_cast<char*>(p);
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    m->park_ = reinterpret_cast<char*>((at + kChunk - 1) / kChunk * kChunk);
    m->base_ = m->park_ + chunks * kChunk;
    // Chunks are untouched until first used, as a slab's pages are.
    if (mmap(m->park_, chunks * kChunk, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
      return Failed("mapping the chunks");
    }
    madvise(m->park_, chunks * kChunk, MADV_HUGEPAGE);  // a hint: without it, 4 KiB pages
    return m;
  }
  ~EmulatedChunkMapper() override {
    if (forget_) forget_(base_);
    if (reservation_ != nullptr) munmap(reservation_, reserved_);
  }
  // Runs when the mapper goes, to drop its range from the device's memory.
  void set_forget(std::function<void(void*)> f) { forget_ = std::move(f); }

  uint64_t chunk_bytes() const override { return kChunk; }
  uint64_t chunks() const override { return chunks_; }
  char* base() const override { return base_; }
  uint64_t range_bytes() const override { return range_; }

  absl::Status Map(uint64_t offset, const uint64_t* chunks, uint64_t count) override {
    if (offset % kChunk != 0 || count == 0 || offset > range_ ||
        count > (range_ - offset) / kChunk) {
      return absl::InvalidArgumentError("emulated device: a mapping outside the range");
    }
    for (uint64_t i = 0; i < count;) {
      const uint64_t n = Run(chunks + i, count - i);
      if (chunks[i] >= chunks_ || chunks[i + n - 1] >= chunks_ ||
          !Place(chunks[i], n, base_ + offset + i * kChunk)) {
        absl::Status s = chunks[i] >= chunks_ || chunks[i + n - 1] >= chunks_
                             ? absl::InvalidArgumentError("emulated device: no such chunk")
                             : OutOfMappings(Failed("moving a chunk into place"));
        Unmap(offset, chunks, i);
        return s;
      }
      i += n;
    }
    return absl::OkStatus();
  }
  void Unmap(uint64_t offset, const uint64_t* chunks, uint64_t count) override {
    for (uint64_t i = 0; i < count;) {
      const uint64_t n = Run(chunks + i, count - i);
      char* at = base_ + offset + i * kChunk;
      if (Move(at, park_ + chunks[i] * kChunk, n * kChunk)) {
        i += n;
        continue;
      }
      // One chunk at a time when the run could not move whole (its pages span two mappings).
      for (uint64_t j = 0; j < n; ++j) {
        if (Move(at + j * kChunk, park_ + chunks[i + j] * kChunk, kChunk)) continue;
        // The kernel refused the move (the process is at vm.max_map_count): the park keeps only
        // a reservation where the chunk belongs. Its pages are dropped here, so the budget
        // holds, and its next placement maps fresh memory instead of moving that reservation
        // in. What stays at `at` holds no pages; the next copy placed there replaces it.
        madvise(at + j * kChunk, kChunk, MADV_DONTNEED);
        lost_[chunks[i + j]] = true;
      }
      i += n;
    }
  }

 private:
  EmulatedChunkMapper(uint64_t chunks, uint64_t range_multiple)
      : chunks_(chunks), range_(chunks * kChunk * range_multiple), lost_(chunks, false) {}
  // The mappings this process holds and its vm.max_map_count (0 when unreadable).
  static void CountMappings(uint64_t& in_use, uint64_t& max_maps) {
    max_maps = 0;
    in_use = 0;
    std::ifstream("/proc/sys/vm/max_map_count") >> max_maps;
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) ++in_use;
  }
  // A move refused for memory (ENOMEM) is most often a process out of memory mappings, which
  // the caller would not guess from "Cannot allocate memory": the limit is named, with its value.
  static absl::Status OutOfMappings(absl::Status s) {
    if (!absl::IsResourceExhausted(s)) return s;
    uint64_t in_use = 0, max_maps = 0;
    CountMappings(in_use, max_maps);
    const std::string limit =
        max_maps == 0
            ? std::string("vm.max_map_count")
            : absl::StrFormat("vm.max_map_count (%llu)", static_cast<unsigned long long>(max_maps));
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s (the process holds %llu memory mappings: at %s the kernel refuses every new one; "
        "raise vm.max_map_count or lower the HBM budget)",
        s.message(), static_cast<unsigned long long>(in_use), limit));
  }
  // Each chunk is a mapping of its own once copies come and go: free ones split the park and
  // copies split the range, each side by reservations between them, up to three mappings per
  // chunk. A process at vm.max_map_count fails every mmap (malloc's, a thread stack's), not only
  // this tier's moves: a budget whose worst case does not fit in what is left is refused.
  static absl::Status CheckMappingsLeft(uint64_t chunks) {
    uint64_t max_maps = 0, in_use = 0;
    CountMappings(in_use, max_maps);
    if (max_maps == 0 || (in_use < max_maps && chunks <= (max_maps - in_use) / 3)) {
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError(absl::StrFormat(
        "emulated device: %llu chunks of 2 MiB can take up to %llu memory mappings as copies "
        "come and go, and vm.max_map_count (%llu) leaves this process %llu: lower the budget to "
        "at most %llu MiB or raise vm.max_map_count",
        static_cast<unsigned long long>(chunks), static_cast<unsigned long long>(3 * chunks),
        static_cast<unsigned long long>(max_maps),
        static_cast<unsigned long long>(in_use < max_maps ? max_maps - in_use : 0),
        static_cast<unsigned long long>(in_use < max_maps ? (max_maps - in_use) / 3 * 2 : 0)));
  }
  // How many of `chunks` (count > 0) from the first are consecutive, all in the park or all lost
  // alike: one run, moved by one mremap (one flush of the TLBs instead of one per chunk).
  uint64_t Run(const uint64_t* chunks, uint64_t count) const {
    uint64_t n = 1;
    while (n < count && chunks[n] == chunks[0] + n && chunks[n] < chunks_ && chunks[0] < chunks_ &&
           lost_[chunks[n]] == lost_[chunks[0]]) {
      ++n;
    }
    return n;
  }
  // Puts the `n` consecutive chunks from `c` at `to`: their pages moved from the park, or fresh
  // memory for chunks whose move back to the park was refused (lost_). A run the kernel will not
  // move whole (its park pages span two mappings) moves a chunk at a time; on failure, what
  // moved is moved back and nothing is left at `to`.
  bool Place(uint64_t c, uint64_t n, char* to) {
    if (!lost_[c]) {
      if (Move(park_ + c * kChunk, to, n * kChunk)) return true;
      for (uint64_t j = 0; j < n; ++j) {
        if (Move(park_ + (c + j) * kChunk, to + j * kChunk, kChunk)) continue;
        for (uint64_t k = 0; k < j; ++k) {
          if (!Move(to + k * kChunk, park_ + (c + k) * kChunk, kChunk)) {
            madvise(to + k * kChunk, kChunk, MADV_DONTNEED);
            lost_[c + k] = true;
          }
        }
        return false;
      }
      return true;
    }
    if (mmap(to, n * kChunk, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) == MAP_FAILED) {
      return false;
    }
    madvise(to, n * kChunk, MADV_HUGEPAGE);
    for (uint64_t j = 0; j < n; ++j) lost_[c + j] = false;
    return true;
  }
  // Moves `bytes` of mapping (one mapping, whole chunks) from `from` to `to` (a reserved hole).
  // MREMAP_DONTUNMAP leaves `from` mapped, with no pages: no moment where it is a hole that
  // another mmap of the process could take (and a later move here would then overwrite). It is
  // made inaccessible again; should the kernel refuse that (at vm.max_map_count), it stays a
  // mapping without pages that nothing reads.
  static bool Move(char* from, char* to, uint64_t bytes) {
    if (mremap(from, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, to) ==
        MAP_FAILED) {
      return false;
    }
    mprotect(from, bytes, PROT_NONE);
    return true;
  }
  static absl::Status Failed(const char* what) {
    const int err = errno;
    std::string msg = absl::StrFormat("emulated device: %s: %s", what, std::strerror(err));
    return err == ENOMEM ? absl::ResourceExhaustedError(msg) : absl::InternalError(msg);
  }

  const uint64_t chunks_;
  const uint64_t range_;
  char* reservation_ = nullptr;  // park and range, reserved_ bytes
  uint64_t reserved_ = 0;
  char* park_ = nullptr;
  char* base_ = nullptr;
  // Chunks whose park slot is only a reservation; the arena's lock orders Map and Unmap.
  std::vector<bool> lost_;
  std::function<void(void*)> forget_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkMapper>> CreateEmulatedChunkMapper(
    uint64_t bytes, uint64_t range_multiple, std::function<void(void*)> forget) {
  auto m = EmulatedChunkMapper::Create(bytes, range_multiple);
  if (!m.ok()) return m.status();
  (*m)->set_forget(std::move(forget));
  return std::unique_ptr<ChunkMapper>(std::move(*m));
}

}  // namespace tiermem::io
