// The piece queue and the fault hook shared by both engines.
#include "io/piece_queue.h"

#include <atomic>

#include "absl/strings/str_format.h"
#include "io/errno_status.h"
#include "io/fault_injection.h"

namespace tiermem::io {
namespace {
std::atomic<FaultInjector*> g_injector{nullptr};
}  // namespace

void SetFaultInjector(FaultInjector* f) { g_injector.store(f); }
FaultInjector* CurrentFaultInjector() { return g_injector.load(std::memory_order_acquire); }

int FilterResult(const Piece& p, int result) {
  FaultInjector* f = CurrentFaultInjector();
  if (f == nullptr) return result;
  return f->OnCompletion(*p.request, p.file_offset(), p.remaining(), result);
}

absl::Status PieceError(const Piece& p, int err) {
  return ErrnoStatus(
      err, absl::StrFormat("%s of %llu bytes at offset %llu of the swap file in %s",
                           p.request->write ? "write" : "read",
                           static_cast<unsigned long long>(p.remaining()),
                           static_cast<unsigned long long>(p.file_offset()), p.request->label));
}

absl::Status PieceQueue::RunJob(std::span<const IoRequest> requests, uint64_t block_size) {
  auto job = std::make_shared<IoJob>();
  std::vector<Piece> pieces;
  for (const IoRequest& r : requests) {
    for (uint64_t s = 0; s < r.length; s += block_size) {
      pieces.push_back(Piece{job, &r, s, std::min(block_size, r.length - s), 0, 0});
    }
  }
  if (pieces.empty()) return absl::OkStatus();
  {
    MutexLock lock(&job->mu);
    job->remaining = pieces.size();
  }
  {
    MutexLock lock(&mu_);
    for (Piece& p : pieces) queue_.push_back(&p);
    nonempty_.SignalAll();
  }
  MutexLock lock(&job->mu);
  while (job->remaining > 0) job->finished.Wait(&job->mu);
  return std::move(job->error);
}

bool PieceQueue::Pop(Piece** out) {
  MutexLock lock(&mu_);
  while (!stop_ && queue_.empty()) nonempty_.Wait(&mu_);
  if (queue_.empty()) return false;
  *out = queue_.front();
  queue_.pop_front();
  return true;
}

bool PieceQueue::TryPop(Piece** out) {
  MutexLock lock(&mu_);
  if (queue_.empty()) return false;
  *out = queue_.front();
  queue_.pop_front();
  return true;
}

void PieceQueue::Stop() {
  MutexLock lock(&mu_);
  stop_ = true;
  nonempty_.SignalAll();
}

void PieceQueue::Complete(Piece* p, absl::Status s) {
  std::shared_ptr<IoJob> job = p->job;  // outlives the unlock below
  MutexLock lock(&job->mu);
  if (!s.ok() && !job->failed) {
    job->failed = true;
    job->error = std::move(s);
  }
  if (--job->remaining == 0) job->finished.SignalAll();
}

}  // namespace tiermem::io
