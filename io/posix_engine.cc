// pread/pwrite engine: the fallback where io_uring is unavailable (sandboxes, old kernels).
// queue_depth x threads worker threads each keep one piece in flight.
#include <unistd.h>

#include <cerrno>
#include <thread>
#include <vector>

#include "io/io_engine.h"
#include "io/piece_queue.h"

namespace tiermem::io {
namespace {

class PosixEngine final : public IoEngine {
 public:
  explicit PosixEngine(const IoEngineOptions& o) : options_(o) {
    uint32_t n = std::clamp<uint32_t>(o.queue_depth * std::max<uint32_t>(o.threads, 1), 1, 128);
    for (uint32_t i = 0; i < n; ++i) workers_.emplace_back([this] { Work(); });
  }
  ~PosixEngine() override {
    queue_.Stop();
    for (auto& w : workers_) w.join();
  }
  absl::string_view name() const override { return "posix"; }
  absl::Status Run(std::span<const IoRequest> requests) override {
    return queue_.RunJob(requests, options_.block_size);
  }

 private:
  void Work() {
    Piece* p = nullptr;
    while (queue_.Pop(&p)) {
      if (p->job->Failed()) {
        PieceQueue::Complete(p, absl::OkStatus());
        continue;
      }
      PieceQueue::Complete(p, Move(*p));
    }
  }

  static absl::Status Move(Piece& p) {
    const IoRequest& r = *p.request;
    while (p.done < p.length) {
      uint64_t n = p.remaining();
      off_t off = static_cast<off_t>(p.file_offset());
      ssize_t got = r.write ? pwrite(r.fd, p.buffer(), n, off) : pread(r.fd, p.buffer(), n, off);
      int res = FilterResult(p, got < 0 ? -errno : static_cast<int>(got));
      if (res == -EINTR || res == -EAGAIN) continue;
      if (res < 0) return PieceError(p, -res);
      // A short O_DIRECT transfer resumes from an aligned position; nothing moved at all means
      // the end of the file (read) or a full disk (write).
      uint64_t advanced = static_cast<uint64_t>(res) / r.alignment * r.alignment;
      if (advanced == 0 && ++p.stalls > 16) return PieceError(p, r.write ? ENOSPC : EIO);
      p.done += advanced;
    }
    return absl::OkStatus();
  }

  IoEngineOptions options_;
  PieceQueue queue_;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> CreatePosixEngine(const IoEngineOptions& options) {
  return std::make_unique<PosixEngine>(options);
}

}  // namespace tiermem::io
