// Swap file creation: O_TMPFILE (or unlink right after mkstemp), O_DIRECT probing, fallocate.
#include "io/swap_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "io/checked.h"
#include "io/errno_status.h"
#include "io/log.h"

namespace tiermem::io {
namespace {

// One aligned write and read back: some file systems accept O_DIRECT at open and refuse it on I/O.
bool DirectIoWorks(int fd, uint32_t align) {
  void* buf = nullptr;
  if (posix_memalign(&buf, align, align) != 0) return false;
  std::memset(buf, 0, align);
  bool ok = pwrite(fd, buf, align, 0) == static_cast<ssize_t>(align) &&
            pread(fd, buf, align, 0) == static_cast<ssize_t>(align);
  std::free(buf);
  return ok;
}

// An unnamed file in `dir`, opened with O_DIRECT when the file system takes it (*direct):
// nothing is left behind, whatever way the process ends.
absl::StatusOr<int> OpenUnnamed(const std::string& dir, bool* direct) {
  int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC | O_DIRECT, 0600);
  *direct = fd >= 0;
  if (fd < 0 && errno == EINVAL) {
    fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  }
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No O_TMPFILE here: a named file, unlinked at once, is the next best thing.
    std::string templ = dir + "/.tiermem-swap-XXXXXX";
    std::vector<char> name(templ.begin(), templ.end());
    name.push_back('\0');
    fd = mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) {
      unlink(name.data());
      fchmod(fd, 0600);
      *direct = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_DIRECT) == 0;
    }
  }
  if (fd < 0) {
    int err = errno;
    return ErrnoStatus(err, absl::StrFormat("cannot create a swap file in \"%s\"", dir));
  }
  return fd;
}

// Reserves `bytes` of the file's blocks ahead (or only sizes it, where fallocate is not
// supported: *reserved false). Whatever errno the file system picks for "that much will not
// fit" (ENOSPC, EDQUOT; EFBIG beyond its largest file; EINVAL from some for sizes near 2^63),
// the caller hears one thing: the space cannot be reserved.
absl::Status Reserve(int fd, uint64_t bytes, const std::string& dir, bool* reserved) {
  auto cannot_reserve = [&](int err, const char* how) {
    absl::Status s =
        ErrnoStatus(err, absl::StrFormat("cannot %s %llu bytes for the swap file in \"%s\"", how,
                                         static_cast<unsigned long long>(bytes), dir));
    if (err == ENOSPC || err == EDQUOT || err == EFBIG || err == EINVAL) {
      return absl::ResourceExhaustedError(s.message());
    }
    return s;
  };
  *reserved = true;
  if (fallocate(fd, 0, 0, static_cast<off_t>(bytes)) == 0) return absl::OkStatus();
  const int err = errno;
  if (err != EOPNOTSUPP) return cannot_reserve(err, "reserve");
  // A warning, not a note: what creating the tier promises elsewhere (a full file system fails
  // here, not in the middle of training) does not hold on this one.
  *reserved = false;
  Log(LogSeverity::kWarn,
      "the file system of \"%s\" does not support fallocate: the swap file's %llu bytes are not "
      "reserved ahead, and a file system that fills up fails moves to NVMe later "
      "(TM_ERR_NO_SPACE) rather than this runtime's creation",
      dir.c_str(), static_cast<unsigned long long>(bytes));
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return cannot_reserve(errno, "size");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SwapFile>> SwapFile::Create(const std::string& dir, uint64_t bytes) {
  if (bytes > kMaxFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("a swap file of %llu bytes is beyond the largest file offset (2^63 - 1)",
                        static_cast<unsigned long long>(bytes)));
  }
  struct stat st = {};
  if (stat(dir.c_str(), &st) != 0) {
    int err = errno;
    return ErrnoStatus(err, absl::StrFormat("NVMe path \"%s\"", dir));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("NVMe path \"%s\" is not a directory", dir));
  }
  std::unique_ptr<SwapFile> f(new SwapFile());
  f->dir_ = dir;
  f->size_ = bytes;

  bool direct = false;
  absl::StatusOr<int> fd = OpenUnnamed(dir, &direct);
  if (!fd.ok()) return fd.status();
  f->fd_ = *fd;

  if (bytes > 0) {
    if (absl::Status s = Reserve(*fd, bytes, dir, &f->reserved_); !s.ok()) return s;
  }

  if (direct) {
    f->alignment_ = ProbeDirectIoAlignment(*fd, &f->alignment_source_);
    if (bytes >= f->alignment_ && !DirectIoWorks(*fd, f->alignment_)) {
      direct = fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_DIRECT) != 0;
    }
  }
  f->direct_ = direct;
  if (!direct) {
    f->alignment_ = 1;
    f->alignment_source_ = "buffered";
    Log(LogSeverity::kWarn,
        "the file system of \"%s\" refuses O_DIRECT: NVMe tier I/O goes through the page cache",
        dir.c_str());
  }
  return f;
}

SwapFile::~SwapFile() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace tiermem::io
