// Swap file set-up and the logical-offset -> (file, file offset) striping map.
#include "lib/nvme_tier.h"

#include "absl/strings/str_format.h"
#include "io/checked.h"
#include "lib/status.h"

namespace tiermem {

absl::StatusOr<std::unique_ptr<NvmeTier>> NvmeTier::Create(const std::vector<std::string>& paths,
                                                           uint64_t bytes, uint32_t stripe) {
  if (paths.empty()) return Error(TM_ERR_CONFIG, "TIERMEM_NVME_PATHS names no directory");
  std::unique_ptr<NvmeTier> t(new NvmeTier());
  t->stripe_ = stripe;
  const uint64_t n = paths.size();
  // Every file holds the same whole number of stripes. A budget whose share does not fit in
  // one file's offsets (2^63 - 1), or whose rounding wraps, can never be reserved: a
  // configuration error, not a full disk.
  const auto row = CheckedMul(n, stripe);
  const auto per_file = row.has_value() ? CheckedMul(DivideRoundingUp(bytes, *row), stripe)
                                        : std::nullopt;
  if (!per_file.has_value() || *per_file > kMaxFileBytes ||
      !CheckedMul(*per_file, n).has_value()) {
    return Error(TM_ERR_CONFIG,
                 absl::StrFormat("TIERMEM_NVME_BYTES=%llu is beyond what a file system can hold "
                                 "(%llu path(s), at most 2^63 - 1 bytes each)",
                                 static_cast<unsigned long long>(bytes),
                                 static_cast<unsigned long long>(n)));
  }
  for (const std::string& dir : paths) {
    auto f = io::SwapFile::Create(dir, *per_file);
    if (!f.ok()) {
      const absl::Status& s = f.status();
      if (absl::IsResourceExhausted(s)) {
        return Error(TM_ERR_NO_SPACE,
                     absl::StrFormat("TIERMEM_NVME_BYTES=%llu over TIERMEM_NVME_PATHS: %s",
                                     static_cast<unsigned long long>(bytes), s.message()));
      }
      tm_status code = (absl::IsNotFound(s) || absl::IsFailedPrecondition(s) ||
                        absl::IsPermissionDenied(s) || absl::IsInvalidArgument(s))
                           ? TM_ERR_CONFIG
                           : TM_ERR_IO;
      return Error(code, absl::StrFormat("TIERMEM_NVME_PATHS: %s", s.message()));
    }
    if ((*f)->alignment() > t->alignment_) t->alignment_ = (*f)->alignment();
    t->files_.push_back(std::move(*f));
  }
  if (t->alignment_ > stripe) {
    return Error(TM_ERR_CONFIG,
                 absl::StrFormat("TIERMEM_IO_BLOCK_SIZE=%u is smaller than the O_DIRECT alignment "
                                 "%u of the NVMe paths",
                                 stripe, t->alignment_));
  }
  t->space_ = std::make_unique<TierSpace>(TM_TIER_NVME, *per_file * n, t->alignment_);
  return t;
}

std::vector<io::IoRequest> NvmeTier::Requests(const Extent& e, uint64_t offset, void* buffer,
                                              uint64_t length, bool write) const {
  std::vector<io::IoRequest> out;
  // Extents are whole granules of at least the alignment, so this round-up stays inside one.
  length = RoundUp(length, alignment_).value_or(length);
  const uint64_t n = files_.size();
  uint64_t done = 0;
  while (done < length) {
    uint64_t logical = e.offset + offset + done;
    uint64_t stripe_index = logical / stripe_;
    uint64_t within = logical % stripe_;
    uint64_t chunk = std::min<uint64_t>(stripe_ - within, length - done);
    const io::SwapFile& f = *files_[stripe_index % n];
    io::IoRequest r;
    r.fd = f.fd();
    r.offset = (stripe_index / n) * stripe_ + within;
    r.buffer = static_cast<char*>(buffer) + done;
    r.length = chunk;
    r.write = write;
    r.alignment = f.alignment();
    r.label = f.dir().c_str();
    // Neighbouring stripes of one file (a single path) merge into one request.
    if (!out.empty() && out.back().fd == r.fd &&
        out.back().offset + out.back().length == r.offset &&
        static_cast<char*>(out.back().buffer) + out.back().length == r.buffer) {
      out.back().length += chunk;
    } else {
      out.push_back(r);
    }
    done += chunk;
  }
  return out;
}

}  // namespace tiermem
