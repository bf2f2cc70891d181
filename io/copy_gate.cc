// The test-only copy gate (io/copy_gate.h): its state, shared by the gate and its holds, and the
// one installed gate the copy engine asks.
#include "io/copy_gate.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "io/sync.h"

namespace tiermem::io {

struct CopyGate::State {
  explicit State(const Match& m) : match(m), deadline(absl::Now() + m.patience) {}

  // Whether the gate is open, opening it when its patience has run out.
  bool IsOpen() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!open && absl::Now() >= deadline) {
      open = true;
      expired = true;
      changed.SignalAll();
    }
    return open;
  }
  // Waits on `changed` until the deadline at most (the gate may expire meanwhile).
  void WaitChange(absl::Time until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const absl::Duration left = until - absl::Now();
    if (left > absl::ZeroDuration()) changed.WaitWithTimeout(&mu, left);
  }

  const Match match;
  const absl::Time deadline;
  Mutex mu;  // guards the fields below
  CondVar changed;
  bool open ABSL_GUARDED_BY(mu) = false;
  bool expired ABSL_GUARDED_BY(mu) = false;
  int claimed ABSL_GUARDED_BY(mu) = 0;  // copies taken so far: the next one's number
  int held ABSL_GUARDED_BY(mu) = 0;
  std::vector<int> completed ABSL_GUARDED_BY(mu);
};

namespace {

// The fence of a hold: it passes when the gate opens.
class OpenFence final : public Fence {
 public:
  explicit OpenFence(std::shared_ptr<CopyGate::State> s) : s_(std::move(s)) {}
  absl::Status Wait() override {
    MutexLock lock(&s_->mu);
    while (!s_->IsOpen()) s_->WaitChange(s_->deadline);
    return absl::OkStatus();
  }
  bool Passed() override {
    MutexLock lock(&s_->mu);
    return s_->IsOpen();
  }

 private:
  std::shared_ptr<CopyGate::State> s_;
};

// The installed gate. `armed` is the copy engine's fast check: false, it asks nothing more.
struct Installed {
  std::atomic<bool> armed{false};
  Mutex mu;  // guards `state`
  std::shared_ptr<CopyGate::State> state ABSL_GUARDED_BY(mu);
};
Installed& Current() {
  static auto* installed = new Installed;  // never destroyed: copies may outlive static teardown
  return *installed;
}

}  // namespace

CopyGate::CopyGate(const Match& match) : state_(std::make_shared<State>(match)) {
  Installed& in = Current();
  MutexLock lock(&in.mu);
  if (in.state != nullptr) {
    std::fprintf(stderr, "io::CopyGate: a second gate while one is installed\n");
    std::abort();
  }
  in.state = state_;
  in.armed.store(true, std::memory_order_release);
}

CopyGate::~CopyGate() {
  Open();
  Installed& in = Current();
  MutexLock lock(&in.mu);
  in.armed.store(false, std::memory_order_release);
  in.state = nullptr;
}

std::shared_ptr<CopyGate::Hold> CopyGate::Claim(CopyDirection direction, uint64_t bytes) {
  Installed& in = Current();
  if (!in.armed.load(std::memory_order_acquire)) return nullptr;
  MutexLock lock(&in.mu);
  if (in.state == nullptr) return nullptr;
  State& s = *in.state;
  MutexLock state_lock(&s.mu);
  if (s.IsOpen() || s.claimed >= s.match.copies || bytes < s.match.min_bytes) return nullptr;
  if (s.match.direction.has_value() && *s.match.direction != direction) return nullptr;
  return std::make_shared<Hold>(in.state, s.match.point, s.claimed++);
}

bool CopyGate::WaitHeld(int n) {
  MutexLock lock(&state_->mu);
  while (state_->held < n && !state_->IsOpen()) state_->WaitChange(state_->deadline);
  return state_->held >= n;
}

void CopyGate::Open() {
  MutexLock lock(&state_->mu);
  state_->open = true;
  state_->changed.SignalAll();
}

bool CopyGate::WaitCompleted(int n) {
  const absl::Time until = absl::Now() + state_->match.patience;
  MutexLock lock(&state_->mu);
  while (static_cast<int>(state_->completed.size()) < n && absl::Now() < until) {
    state_->WaitChange(until);
  }
  return static_cast<int>(state_->completed.size()) >= n;
}

std::vector<int> CopyGate::completed() {
  MutexLock lock(&state_->mu);
  return state_->completed;
}

int CopyGate::held() {
  MutexLock lock(&state_->mu);
  return state_->held;
}

bool CopyGate::expired() {
  MutexLock lock(&state_->mu);
  return state_->expired;
}

CopyGate::Hold::Hold(std::shared_ptr<State> state, Point point, int number)
    : state_(std::move(state)),
      point_(point),
      number_(number),
      fence_(std::make_shared<OpenFence>(state_)) {}

void CopyGate::Hold::Reached() {
  MutexLock lock(&state_->mu);
  ++state_->held;
  state_->changed.SignalAll();
}

void CopyGate::Hold::Completed() {
  MutexLock lock(&state_->mu);
  state_->completed.push_back(number_);
  state_->changed.SignalAll();
}

}  // namespace tiermem::io
