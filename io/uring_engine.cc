// io_uring engine: pieces of block_size kept queue_depth deep, every completion's res checked,
// short transfers continued from an aligned offset, EAGAIN/EINTR reissued.
#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "io/io_engine.h"
#include "io/log.h"

namespace tiermem::io {
namespace {

struct Piece {
  const IoRequest* request = nullptr;
  uint64_t start = 0;   // offset of the piece within the request
  uint64_t length = 0;
  uint64_t done = 0;    // bytes of the piece already moved
  int stalls = 0;       // completions that moved nothing
};

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const IoEngineOptions& o) : options_(o) {}
  ~UringEngine() override {
    if (initialized_) io_uring_queue_exit(&ring_);
  }

  absl::Status Init() {
    unsigned entries = 1;
    while (entries < options_.queue_depth) entries <<= 1;
    // Try the cheaper completion mode first and drop it on EINVAL, as fio does.
    for (unsigned flags : {unsigned{IORING_SETUP_COOP_TASKRUN}, 0u}) {
      io_uring_params p = {};
      p.flags = flags;
      int rc = io_uring_queue_init_params(entries, &ring_, &p);
      if (rc == 0) {
        initialized_ = true;
        return absl::OkStatus();
      }
      if (rc != -EINVAL) {
        return absl::UnavailableError(absl::StrFormat("io_uring_queue_init: %s (errno %d)",
                                                      std::strerror(-rc), -rc));
      }
    }
    return absl::UnavailableError("io_uring_queue_init: no supported setup flags");
  }

  absl::string_view name() const override { return "uring"; }

  absl::Status Run(std::span<const IoRequest> requests) override {
    std::deque<Piece> storage;
    std::deque<Piece*> pending;
    for (const IoRequest& r : requests) {
      for (uint64_t s = 0; s < r.length; s += options_.block_size) {
        uint64_t n = r.length - s < options_.block_size ? r.length - s : options_.block_size;
        storage.push_back(Piece{&r, s, n, 0, 0});
        pending.push_back(&storage.back());
      }
    }
    absl::MutexLock lock(&mu_);
    absl::Status first_error;
    unsigned in_flight = 0;
    while (in_flight > 0 || (!pending.empty() && first_error.ok())) {
      while (first_error.ok() && !pending.empty() && in_flight < options_.queue_depth) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
        if (sqe == nullptr) break;
        Piece* pc = pending.front();
        pending.pop_front();
        const IoRequest& r = *pc->request;
        char* buf = static_cast<char*>(r.buffer) + pc->start + pc->done;
        unsigned len = static_cast<unsigned>(pc->length - pc->done);
        uint64_t off = r.offset + pc->start + pc->done;
        if (r.write) {
          io_uring_prep_write(sqe, r.fd, buf, len, off);
        } else {
          io_uring_prep_read(sqe, r.fd, buf, len, off);
        }
        io_uring_sqe_set_data(sqe, pc);
        ++in_flight;
      }
      int rc = io_uring_submit_and_wait(&ring_, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        // The ring itself failed: nothing more completes, so nothing may still be in flight.
        return absl::InternalError(absl::StrFormat("io_uring_submit_and_wait: %s (errno %d)",
                                                   std::strerror(-rc), -rc));
      }
      io_uring_cqe* cqe = nullptr;
      unsigned head = 0, seen = 0;
      io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        --in_flight;
        Piece* pc = static_cast<Piece*>(io_uring_cqe_get_data(cqe));
        const IoRequest& r = *pc->request;
        int res = cqe->res;
        if (res == -EAGAIN || res == -EINTR) {
          pending.push_front(pc);
          continue;
        }
        if (res < 0 || (res == 0 && ++pc->stalls > 16)) {
          if (first_error.ok()) {
            first_error = IoError(r, pc->start + pc->done, pc->length - pc->done,
                                  res < 0 ? -res : (r.write ? ENOSPC : EIO));
          }
          continue;
        }
        // A short O_DIRECT transfer resumes from an aligned position.
        uint64_t advanced = static_cast<uint64_t>(res) / r.alignment * r.alignment;
        if (advanced == 0 && ++pc->stalls > 16 && first_error.ok()) {
          first_error = IoError(r, pc->start + pc->done, pc->length - pc->done, EIO);
          continue;
        }
        pc->done += advanced;
        if (pc->done < pc->length) pending.push_front(pc);
      }
      io_uring_cq_advance(&ring_, seen);
    }
    return first_error;
  }

 private:
  IoEngineOptions options_;
  absl::Mutex mu_;
  io_uring ring_ ABSL_GUARDED_BY(mu_) = {};
  bool initialized_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<IoEngine>> CreateUringEngine(const IoEngineOptions& options) {
  auto engine = std::make_unique<UringEngine>(options);
  if (auto s = engine->Init(); !s.ok()) return s;
  return engine;
}

}  // namespace tiermem::io
