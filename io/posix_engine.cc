// pread/pwrite engine: the fallback where io_uring is unavailable (sandboxes, old kernels).
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/string_view.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "io/errno_status.h"
#include "io/io_engine.h"

namespace tiermem::io {

absl::Status IoError(const IoRequest& r, uint64_t done, uint64_t piece_length, int err) {
  return ErrnoStatus(err, absl::StrFormat("%s of %llu bytes at offset %llu of the swap file in %s",
                                          r.write ? "write" : "read",
                                          static_cast<unsigned long long>(piece_length),
                                          static_cast<unsigned long long>(r.offset + done),
                                          r.label));
}

namespace {

class PosixEngine final : public IoEngine {
 public:
  explicit PosixEngine(const IoEngineOptions& o) : options_(o) {}
  absl::string_view name() const override { return "posix"; }

  absl::Status Run(std::span<const IoRequest> requests) override {
    for (const IoRequest& r : requests) {
      uint64_t done = 0;
      int stalls = 0;
      while (done < r.length) {
        uint64_t n = r.length - done;
        if (n > options_.block_size) n = options_.block_size;
        char* p = static_cast<char*>(r.buffer) + done;
        off_t off = static_cast<off_t>(r.offset + done);
        ssize_t got = r.write ? pwrite(r.fd, p, n, off) : pread(r.fd, p, n, off);
        if (got < 0) {
          if (errno == EINTR || errno == EAGAIN) continue;
          return IoError(r, done, n, errno);
        }
        if (got == 0) {
          return IoError(r, done, n, r.write ? ENOSPC : EIO);
        }
        // A short O_DIRECT transfer resumes from an aligned position.
        uint64_t advanced = static_cast<uint64_t>(got) / r.alignment * r.alignment;
        if (advanced == 0 && ++stalls > 16) return IoError(r, done, n, EIO);
        done += advanced;
      }
    }
    return absl::OkStatus();
  }

 private:
  IoEngineOptions options_;
};

}  // namespace

std::unique_ptr<IoEngine> CreatePosixEngine(const IoEngineOptions& options) {
  return std::make_unique<PosixEngine>(options);
}

}  // namespace tiermem::io
