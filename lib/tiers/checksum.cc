// Per-block XXH3-64 sums of NVMe extents.
#include "lib/tiers/checksum.h"

#include <xxhash.h>

#include <algorithm>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"

namespace tiermem {

absl::StatusOr<std::vector<BlockChecksums::Sum>> BlockChecksums::Hash(uint64_t offset,
                                                                      const char* data,
                                                                      uint64_t n) const {
  if (offset % block_ != 0) {
    return Error(TM_ERR_INTERNAL,
                 absl::StrFormat("a write at extent offset %llu is not on a %llu-byte checksum "
                                 "block boundary",
                                 static_cast<unsigned long long>(offset),
                                 static_cast<unsigned long long>(block_)));
  }
  std::vector<Sum> sums;
  sums.reserve((n + block_ - 1) / block_);
  for (uint64_t done = 0; done < n; done += block_) {
    const uint64_t len = std::min(block_, n - done);
    sums.push_back({XXH3_64bits(data + done, len), len});
  }
  return sums;
}

void BlockChecksums::Store(uint64_t extent, uint64_t offset, const std::vector<Sum>& sums) {
  if (sums.empty()) return;
  const uint64_t first = offset / block_;
  MutexLock lock(&mu_);
  std::vector<Sum>& all = sums_[extent];
  if (all.size() < first + sums.size()) all.resize(first + sums.size());
  std::copy(sums.begin(), sums.end(), all.begin() + static_cast<ptrdiff_t>(first));
}

absl::Status BlockChecksums::Record(uint64_t extent, uint64_t offset, const char* data,
                                    uint64_t n) {
  // Hashed without the lock: moves of other extents record and verify meanwhile.
  auto sums = Hash(offset, data, n);
  if (!sums.ok()) return sums.status();
  Store(extent, offset, *sums);
  return absl::OkStatus();
}

BlockChecksums::Check BlockChecksums::Verify(uint64_t extent, uint64_t offset, const char* data,
                                             uint64_t n) const {
  Check check;
  if (n == 0) return check;
  const uint64_t first = offset / block_;
  const uint64_t last = (offset + n - 1) / block_;
  std::vector<Sum> sums(last - first + 1);
  {
    MutexLock lock(&mu_);
    if (auto it = sums_.find(extent); it != sums_.end()) {
      for (uint64_t k = first; k <= last && k < it->second.size(); ++k)
        sums[k - first] = it->second[k];
    }
  }
  const uint64_t end = offset + n;
  for (uint64_t k = first; k <= last; ++k) {
    const Sum& s = sums[k - first];
    const uint64_t start = k * block_;
    // The read covers [max(start, offset), min(end, start + block)) of this block; bytes past
    // what was written of it (all of them, for a block never written) no sum vouches for.
    if (std::min(end, start + block_) > start + s.length) {
      if (!check.unrecorded.has_value()) check.unrecorded = start;
      continue;
    }
    if (start < offset || start + s.length > end) {
      check.partial.push_back(start);
      continue;
    }
    if (check.mismatch.has_value()) continue;
    const uint64_t actual = XXH3_64bits(data + (start - offset), s.length);
    if (actual != s.hash) check.mismatch = Check::Mismatch{start, s.length, s.hash, actual};
  }
  return check;
}

uint64_t BlockChecksums::BlockLength(uint64_t extent, uint64_t block_offset) const {
  MutexLock lock(&mu_);
  auto it = sums_.find(extent);
  const uint64_t k = block_offset / block_;
  if (it == sums_.end() || k >= it->second.size()) return 0;
  return it->second[k].length;
}

void BlockChecksums::Forget(uint64_t extent) {
  MutexLock lock(&mu_);
  sums_.erase(extent);
}

size_t BlockChecksums::extents() const {
  MutexLock lock(&mu_);
  return sums_.size();
}

}  // namespace tiermem
