// Swap file set-up, the logical-offset -> (file, file offset) striping map, and the checksum
// checks around each transfer.
#include "lib/tiers/nvme_tier.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "io/checked.h"
#include "lib/base/status.h"

namespace tiermem {

namespace {

// Two entries naming one directory (again, through a symlink, `.` or `..`) would put two swap
// files on one file system where the striping counts on separate drives, and count its space
// twice: refused, naming both. A path that cannot be looked up is left to SwapFile::Create,
// which names its error.
absl::Status CheckDistinctDirectories(const std::vector<std::string>& paths,
                                      const std::string& what) {
  std::vector<std::pair<dev_t, ino_t>> ids(paths.size());
  std::vector<bool> known(paths.size(), false);
  for (size_t i = 0; i < paths.size(); ++i) {
    struct stat st = {};
    if (stat(paths[i].c_str(), &st) != 0) continue;
    ids[i] = {st.st_dev, st.st_ino};
    known[i] = true;
    for (size_t j = 0; j < i; ++j) {
      if (known[j] && ids[j] == ids[i]) {
        return Error(TM_ERR_CONFIG, absl::StrFormat("%s: \"%s\" is the same directory as \"%s\" "
                                                    "(given twice): list each directory once",
                                                    what, paths[i], paths[j]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvmeTier>> NvmeTier::Create(const std::vector<std::string>& paths,
                                                           uint64_t bytes, uint32_t stripe,
                                                           const NvmeSettingNames& names) {
  const std::string& budget_name = names.budget;
  if (paths.empty()) return Error(TM_ERR_CONFIG, names.paths + " names no directory");
  std::unique_ptr<NvmeTier> t(new NvmeTier());
  t->stripe_ = stripe;
  const uint64_t n = paths.size();
  // Every file holds the same whole number of stripes: the budget is rounded down to them (as
  // the other tiers round down to their granules; the runtime refuses one below a stripe per
  // path first). A share that does not fit in one file's offsets (2^63 - 1) can never be
  // reserved: a configuration error, not a full disk.
  const auto row = CheckedMul(n, stripe);
  const auto per_file = row.has_value() ? CheckedMul(bytes / *row, stripe) : std::nullopt;
  if (!per_file.has_value() || *per_file > kMaxFileBytes || !CheckedMul(*per_file, n).has_value()) {
    // Said with the share that broke the limit, so the message never contradicts the limit.
    return Error(TM_ERR_CONFIG,
                 absl::StrFormat("%s=%llu is beyond what a file system can hold: "
                                 "its share per path (%llu path(s), in whole stripes of %u bytes) "
                                 "is %s, above the largest file, 2^63 - 1 bytes",
                                 budget_name, static_cast<unsigned long long>(bytes),
                                 static_cast<unsigned long long>(n), stripe,
                                 per_file.has_value() ? absl::StrCat(*per_file, " bytes")
                                                      : std::string("beyond 2^64 bytes")));
  }
  if (absl::Status s = CheckDistinctDirectories(paths, names.paths); !s.ok()) return s;
  for (const std::string& dir : paths) {
    auto f = io::SwapFile::Create(dir, *per_file);
    if (!f.ok()) {
      const absl::Status& s = f.status();
      if (absl::IsResourceExhausted(s)) {
        return Error(TM_ERR_NO_SPACE, absl::StrFormat("%s=%llu over %s: %s", budget_name,
                                                      static_cast<unsigned long long>(bytes),
                                                      names.paths, s.message()));
      }
      tm_status code = (absl::IsNotFound(s) || absl::IsFailedPrecondition(s) ||
                        absl::IsPermissionDenied(s) || absl::IsInvalidArgument(s))
                           ? TM_ERR_CONFIG
                           : TM_ERR_IO;
      return Error(code, absl::StrFormat("%s: %s", names.paths, s.message()));
    }
    if ((*f)->alignment() > t->alignment_) t->alignment_ = (*f)->alignment();
    t->files_.push_back(std::move(*f));
  }
  if (t->alignment_ > stripe) {
    return Error(TM_ERR_CONFIG, absl::StrFormat("%s=%u is smaller than the O_DIRECT alignment "
                                                "%u of the NVMe paths",
                                                names.stripe, stripe, t->alignment_));
  }
  t->space_ = std::make_unique<TierSpace>(TM_TIER_NVME, *per_file * n, t->alignment_);
  return t;
}

std::vector<io::IoRequest> NvmeTier::Requests(const Extent& e, uint64_t offset, void* buffer,
                                              uint64_t length, bool write) const {
  std::vector<io::IoRequest> out;
  // Extents are whole granules of at least the alignment, so this round-up stays inside one.
  length = RoundUp(length, alignment_).value_or(length);
  uint64_t done = 0;
  while (done < length) {
    const Place p = Locate(e.offset + offset + done);
    const uint64_t chunk = std::min<uint64_t>(p.run, length - done);
    const io::SwapFile& f = *p.file;
    io::IoRequest r;
    r.fd = f.fd();
    r.offset = p.offset;
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

NvmeTier::Place NvmeTier::Locate(uint64_t logical) const {
  const uint64_t n = files_.size();
  const uint64_t stripe_index = logical / stripe_;
  const uint64_t within = logical % stripe_;
  return Place{files_[stripe_index % n].get(), (stripe_index / n) * stripe_ + within,
               stripe_ - within};
}

std::string NvmeTier::Describe(const Extent& e, uint64_t offset, uint64_t length) const {
  std::string out;
  for (uint64_t done = 0; done < length;) {
    const Place p = Locate(e.offset + offset + done);
    const uint64_t run = std::min(p.run, length - done);
    absl::StrAppend(
        &out, out.empty() ? "" : ", ",
        absl::StrFormat("the swap file in \"%s\" (fd %d) at offset %llu (+%llu)", p.file->dir(),
                        p.file->fd(), static_cast<unsigned long long>(p.offset),
                        static_cast<unsigned long long>(run)));
    done += run;
  }
  return out;
}

void NvmeTier::EnableChecksums(uint64_t block) {
  checksums_ = std::make_unique<BlockChecksums>(block);
  space_->set_on_free([sums = checksums_.get()](const Extent& e) { sums->Forget(e.offset); });
}

namespace {
// A checksummed transfer longer than this is cut into segments of this size, so that hashing
// one segment overlaps the I/O of another instead of adding to it.
constexpr uint64_t kOverlapSegment = 64ull << 20;
}  // namespace

absl::Status NvmeTier::Run(io::IoEngine& engine, const Extent& e, uint64_t offset, char* buffer,
                           uint64_t length, bool write) const {
  return Retag(engine.Run(Requests(e, offset, buffer, length, write)), TM_ERR_IO);
}

absl::Status NvmeTier::Transfer(io::IoEngine& engine, const Extent& e, uint64_t offset,
                                char* buffer, uint64_t length, bool write) const {
  if (checksums_ == nullptr) return Run(engine, e, offset, buffer, length, write);
  const uint64_t segment = std::max(kOverlapSegment, checksums_->block());
  if (length <= segment || offset % checksums_->block() != 0) {
    absl::Status s = Run(engine, e, offset, buffer, length, write);
    if (!s.ok()) return s;
    // A write's sums come from the buffer it wrote, recorded only once the write is known good.
    if (write) return checksums_->Record(e.offset, offset, buffer, length);
    return VerifyRead(engine, e, offset, buffer, length);
  }
  if (write) {
    // The buffer holds still while it is written: it is hashed meanwhile, on this thread.
    auto io = std::async(std::launch::async,
                         [&] { return Run(engine, e, offset, buffer, length, true); });
    auto sums = checksums_->Hash(offset, buffer, length);
    absl::Status s = io.get();
    if (!s.ok()) return s;
    if (!sums.ok()) return sums.status();
    checksums_->Store(e.offset, offset, *sums);
    return absl::OkStatus();
  }
  // Segment k is checked while segment k + 1 is read. Segments start on block boundaries, so
  // only the last can cover a block in part.
  auto read = [&](uint64_t at) {
    return std::async(std::launch::async, [&, at] {
      return Run(engine, e, offset + at, buffer + at, std::min(segment, length - at), false);
    });
  };
  std::future<absl::Status> next = read(0);
  absl::Status status;
  for (uint64_t at = 0; at < length && status.ok(); at += segment) {
    status = next.get();
    if (status.ok() && at + segment < length) next = read(at + segment);
    if (status.ok()) {
      status = VerifyRead(engine, e, offset + at, buffer + at, std::min(segment, length - at));
    }
  }
  if (next.valid()) (void)next.get();  // never return while a read still lands in the buffer
  return status;
}

absl::Status NvmeTier::VerifyRead(io::IoEngine& engine, const Extent& e, uint64_t offset,
                                  char* buffer, uint64_t length) const {
  auto corrupt = [&](const BlockChecksums::Check::Mismatch& m) {
    return Error(TM_ERR_CORRUPT,
                 absl::StrFormat("the NVMe copy is corrupt and was not used: checksum mismatch in "
                                 "bytes [%llu, +%llu) of its extent, in %s (XXH3-64 written "
                                 "%016x, read %016x)",
                                 static_cast<unsigned long long>(m.offset),
                                 static_cast<unsigned long long>(m.length),
                                 Describe(e, m.offset, m.length), m.expected, m.actual));
  };
  auto unrecorded = [&](uint64_t at) {
    return Error(TM_ERR_INTERNAL,
                 absl::StrFormat("no checksum vouches for the NVMe bytes at offset %llu of an "
                                 "extent, in %s: they were never written",
                                 static_cast<unsigned long long>(at), Describe(e, at, alignment_)));
  };
  BlockChecksums::Check check = checksums_->Verify(e.offset, offset, buffer, length);
  if (check.unrecorded.has_value()) return unrecorded(*check.unrecorded);
  if (check.mismatch.has_value()) return corrupt(*check.mismatch);
  // Blocks read in part are read again whole, into a bounce buffer, checked there, and the part
  // asked for is copied from it: the bytes served are the bytes checked.
  for (const uint64_t start : check.partial) {
    const uint64_t len = checksums_->BlockLength(e.offset, start);
    const uint64_t padded = (len + alignment_ - 1) / alignment_ * alignment_;
    std::unique_ptr<char, decltype(&std::free)> whole(
        static_cast<char*>(std::aligned_alloc(alignment_, padded)), &std::free);
    if (whole == nullptr) {
      return Error(TM_ERR_OUT_OF_MEMORY, "no host memory to read a checksum block whole");
    }
    absl::Status s = Retag(engine.Run(Requests(e, start, whole.get(), len, false)), TM_ERR_IO);
    if (!s.ok()) return s;
    BlockChecksums::Check again = checksums_->Verify(e.offset, start, whole.get(), len);
    if (again.unrecorded.has_value()) return unrecorded(*again.unrecorded);
    if (again.mismatch.has_value()) return corrupt(*again.mismatch);
    const uint64_t from = std::max(start, offset);
    const uint64_t to = std::min(start + len, offset + length);
    std::memcpy(buffer + (from - offset), whole.get() + (from - start), to - from);
  }
  return absl::OkStatus();
}

}  // namespace tiermem
