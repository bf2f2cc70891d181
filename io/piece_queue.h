// Work shared by an engine's I/O threads: each Run() call is a job cut into pieces of at most
// block_size; threads take pieces from one queue, so concurrent calls share the device.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "io/io_engine.h"
#include "io/sync.h"

namespace tiermem::io {

struct IoJob;

struct Piece {
  // Shared: the last piece's completer may still be unlocking the job when its waiter returns.
  std::shared_ptr<IoJob> job;
  const IoRequest* request = nullptr;
  uint64_t start = 0;  // offset of the piece within the request
  uint64_t length = 0;
  uint64_t done = 0;  // bytes of the piece already moved
  int stalls = 0;     // completions that moved nothing

  char* buffer() const { return static_cast<char*>(request->buffer) + start + done; }
  uint64_t file_offset() const { return request->offset + start + done; }
  uint64_t remaining() const { return length - done; }
};

// One Run() call. Its pieces complete in any order; the caller waits for all of them.
struct IoJob {
  Mutex mu;
  CondVar finished;  // signalled when remaining reaches 0
  size_t remaining ABSL_GUARDED_BY(mu) = 0;
  absl::Status error ABSL_GUARDED_BY(mu);
  bool failed ABSL_GUARDED_BY(mu) = false;  // later pieces are dropped, not started

  bool Failed() {
    MutexLock lock(&mu);
    return failed;
  }
};

class PieceQueue {
 public:
  // Cuts the requests into pieces, queues them, and blocks until the job is done.
  absl::Status RunJob(std::span<const IoRequest> requests, uint64_t block_size);
  // Takes a piece; blocks while the queue is empty. False once Stop() was called and the
  // queue is empty.
  bool Pop(Piece** out);
  // Takes a piece if one is queued.
  bool TryPop(Piece** out);
  void Stop();
  // Finishes a piece with `s` (ok, or its error: the job's first error is kept). Statuses are
  // moved, never shared, between threads.
  static void Complete(Piece* p, absl::Status s);

 private:
  Mutex mu_;
  CondVar nonempty_;  // signalled on push and stop
  std::deque<Piece*> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// The result a piece's completion is acted on: the kernel's, or an installed fault's.
int FilterResult(const Piece& p, int result);
// The error for a failed piece: errno-derived code, the operation, length, offset and file.
absl::Status PieceError(const Piece& p, int err);

}  // namespace tiermem::io
