// io_uring engine: one ring per I/O thread, each created on its own thread (so SINGLE_ISSUER and
// DEFER_TASKRUN can apply) with the DRAM pool as fixed buffers and the swap files registered.
// Pieces of block_size are kept queue_depth deep per ring, every completion's res is checked,
// short transfers continue from an aligned offset, EAGAIN/EINTR are reissued.
#include <liburing.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "io/fault_injection.h"
#include "io/io_engine.h"
#include "io/log.h"
#include "io/piece_queue.h"

namespace tiermem::io {
namespace {

// Registration limits (io_uring_register_buffers): at most 1 GiB per iovec.
constexpr uint64_t kMaxIovec = 1ull << 30;

class Ring {
 public:
  Ring(const IoEngineOptions& o, PieceQueue& q) : options_(o), queue_(q) {}
  ~Ring() {
    if (initialized_) io_uring_queue_exit(&ring_);
  }

  // Runs on the ring's own thread: set-up, then the loop until the queue stops.
  void Serve(std::promise<absl::Status> ready) {
    absl::Status s = Init();
    ready.set_value(s);
    if (s.ok()) Loop();
  }

  bool buffers_registered() const { return !iovecs_.empty(); }
  bool files_registered() const { return !files_.empty(); }

 private:
  absl::Status Init() {
    if (FaultInjector* f = CurrentFaultInjector(); f != nullptr && f->FailUringSetup()) {
      return absl::UnavailableError(
          "io_uring_queue_init: Operation not permitted (errno 1, injected)");
    }
    unsigned entries = 1;
    while (entries < options_.queue_depth) entries <<= 1;
    // The cheapest completion modes first, dropped one by one on EINVAL, as fio does.
    const unsigned kFlagSets[] = {
        IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN,
        IORING_SETUP_COOP_TASKRUN, 0u};
    int rc = -EINVAL;
    for (unsigned flags : kFlagSets) {
      io_uring_params p = {};
      p.flags = flags;
      rc = io_uring_queue_init_params(entries, &ring_, &p);
      if (rc != -EINVAL) break;
    }
    if (rc != 0) {
      return absl::UnavailableError(
          absl::StrFormat("io_uring_queue_init: %s (errno %d)", std::strerror(-rc), -rc));
    }
    initialized_ = true;
    RegisterBuffers();
    RegisterFiles();
    return absl::OkStatus();
  }

  void RegisterBuffers() {
    std::vector<iovec> v;
    for (const iovec& b : options_.buffers) {
      for (uint64_t off = 0; off < b.iov_len; off += kMaxIovec) {
        v.push_back({static_cast<char*>(b.iov_base) + off, std::min(kMaxIovec, b.iov_len - off)});
      }
    }
    if (v.empty()) return;
    int rc = io_uring_register_buffers(&ring_, v.data(), static_cast<unsigned>(v.size()));
    if (rc != 0) {
      uint64_t bytes = 0;
      for (const iovec& b : v) bytes += b.iov_len;
      rlimit lim{};
      std::string limit = "unknown";
      if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0) {
        limit =
            lim.rlim_cur == RLIM_INFINITY
                ? std::string("unlimited")
                : absl::StrFormat("%llu KiB", static_cast<unsigned long long>(lim.rlim_cur >> 10));
      }
      Log(LogSeverity::kWarn,
          "io_uring: cannot register the DRAM pool (%llu MiB) as fixed buffers (%s): I/O runs "
          "correct but unregistered, a little slower; the locked-memory limit (ulimit -l) is %s: "
          "raise it above the pool (docs/environment.md, \"Without root\")",
          static_cast<unsigned long long>(bytes >> 20), std::strerror(-rc), limit.c_str());
      return;
    }
    iovecs_ = std::move(v);
  }

  void RegisterFiles() {
    if (options_.files.empty()) return;
    int rc = io_uring_register_files(&ring_, options_.files.data(),
                                     static_cast<unsigned>(options_.files.size()));
    if (rc != 0) {
      Log(LogSeverity::kInfo, "io_uring: cannot register the swap files (%s)", std::strerror(-rc));
      return;
    }
    files_ = options_.files;
  }

  // Index of the registered buffer holding [p, p+n), or -1.
  int BufferIndex(const char* p, uint64_t n) const {
    for (size_t i = 0; i < iovecs_.size(); ++i) {
      const char* b = static_cast<const char*>(iovecs_[i].iov_base);
      if (p >= b && p + n <= b + iovecs_[i].iov_len) return static_cast<int>(i);
    }
    return -1;
  }
  int FileIndex(int fd) const {
    for (size_t i = 0; i < files_.size(); ++i) {
      if (files_[i] == fd) return static_cast<int>(i);
    }
    return -1;
  }

  void Prepare(Piece* pc) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);  // never null: at most queue_depth in flight
    const IoRequest& r = *pc->request;
    char* buf = pc->buffer();
    unsigned len = static_cast<unsigned>(pc->remaining());
    uint64_t off = pc->file_offset();
    int file = FileIndex(r.fd);
    int fd = file >= 0 ? file : r.fd;
    int index = BufferIndex(buf, len);
    if (index >= 0) {
      if (r.write) {
        io_uring_prep_write_fixed(sqe, fd, buf, len, off, index);
      } else {
        io_uring_prep_read_fixed(sqe, fd, buf, len, off, index);
      }
    } else if (r.write) {
      io_uring_prep_write(sqe, fd, buf, len, off);
    } else {
      io_uring_prep_read(sqe, fd, buf, len, off);
    }
    if (file >= 0) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, pc);
  }

  void Loop() {
    std::deque<Piece*> retry;  // pieces to reissue: EAGAIN, EINTR, short transfers
    std::vector<Piece*> batch;
    batch.reserve(options_.queue_depth);
    unsigned in_flight = 0;
    for (;;) {
      batch.clear();
      while (in_flight + batch.size() < options_.queue_depth) {
        Piece* pc = nullptr;
        if (!retry.empty()) {
          pc = retry.front();
          retry.pop_front();
        } else if (in_flight == 0 && batch.empty()) {
          if (!queue_.Pop(&pc)) return;  // stopped and drained
        } else if (!queue_.TryPop(&pc)) {
          break;
        }
        if (pc->job->Failed()) {
          PieceQueue::Complete(pc, absl::OkStatus());  // its job already failed: drop it
          continue;
        }
        batch.push_back(pc);
      }
      // One submission's pieces go to the block layer under one plug, which merges a request
      // with the one queued just before it when their bytes are adjacent: a job's pieces in
      // order would reach the device as requests of up to max_sectors_kb, not of block_size,
      // the size asked for (and on some devices the faster one). Every other piece first, then
      // the rest: no piece follows its neighbour.
      for (size_t i = 0; i < batch.size(); i += 2) Prepare(batch[i]);
      for (size_t i = 1; i < batch.size(); i += 2) Prepare(batch[i]);
      in_flight += static_cast<unsigned>(batch.size());
      if (in_flight == 0) continue;
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        Log(LogSeverity::kError, "io_uring_submit_and_wait: %s", std::strerror(-rc));
      }
      io_uring_cqe* cqe = nullptr;
      unsigned head = 0, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        --in_flight;
        Piece* pc = static_cast<Piece*>(io_uring_cqe_get_data(cqe));
        Handle(pc, FilterResult(*pc, cqe->res), retry);
      }
      io_uring_cq_advance(&ring_, seen);
    }
  }

  static void Handle(Piece* pc, int res, std::deque<Piece*>& retry) {
    const IoRequest& r = *pc->request;
    if (res == -EAGAIN || res == -EINTR) {
      retry.push_back(pc);
      return;
    }
    if (res < 0) {
      PieceQueue::Complete(pc, PieceError(*pc, -res));
      return;
    }
    // A short O_DIRECT transfer resumes from an aligned position; nothing moved at all, many
    // times over, means the end of the file (read) or a full disk (write).
    uint64_t advanced = static_cast<uint64_t>(res) / r.alignment * r.alignment;
    if (advanced == 0 && ++pc->stalls > 16) {
      PieceQueue::Complete(pc, PieceError(*pc, r.write ? ENOSPC : EIO));
      return;
    }
    pc->done += advanced;
    if (pc->done < pc->length) {
      retry.push_back(pc);
    } else {
      PieceQueue::Complete(pc, absl::OkStatus());
    }
  }

  const IoEngineOptions& options_;
  PieceQueue& queue_;
  io_uring ring_ = {};
  bool initialized_ = false;
  std::vector<iovec> iovecs_;
  std::vector<int> files_;
};

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const IoEngineOptions& o) : options_(o) {}
  ~UringEngine() override {
    queue_.Stop();
    for (auto& t : threads_) t.join();
  }

  absl::Status Start() {
    const uint32_t n = std::max<uint32_t>(options_.threads, 1);
    for (uint32_t i = 0; i < n; ++i) {
      rings_.push_back(std::make_unique<Ring>(options_, queue_));
      std::promise<absl::Status> ready;
      auto f = ready.get_future();
      Ring* ring = rings_.back().get();
      threads_.emplace_back([ring, r = std::move(ready)]() mutable { ring->Serve(std::move(r)); });
      if (absl::Status s = f.get(); !s.ok()) return s;  // the destructor stops and joins
    }
    return absl::OkStatus();
  }

  absl::string_view name() const override { return "uring"; }
  absl::Status Run(std::span<const IoRequest> requests) override {
    return queue_.RunJob(requests, options_.block_size);
  }
  bool buffers_registered() const override { return rings_[0]->buffers_registered(); }
  bool files_registered() const override { return rings_[0]->files_registered(); }

 private:
  IoEngineOptions options_;
  PieceQueue queue_;
  std::vector<std::unique_ptr<Ring>> rings_;
  std::vector<std::thread> threads_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> CreateUringEngine(const IoEngineOptions& options) {
  auto engine = std::make_unique<UringEngine>(options);
  if (auto s = engine->Start(); !s.ok()) return s;
  return engine;
}

}  // namespace tiermem::io
