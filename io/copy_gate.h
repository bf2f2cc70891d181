// Test-only hold on the emulated device's copies: a gate that keeps chosen copies from starting
// (or from completing) until the test opens it, so that a test orders events by waiting for them
// instead of sleeping and hoping the other thread got there first (CONTRIBUTING.md, "Tests").
// Production code never makes one; while none is armed the copy engine's cost is one atomic load
// per copy enqueued.
//
//   io::CopyGate gate(io::CopyGate::Match().Of(io::CopyDirection::kHostToDevice).AtLeast(8 << 20));
//   ... start what enqueues the copy (a prefetch, a demand on another thread) ...
//   ASSERT_TRUE(gate.WaitHeld());  // enqueued and held: it has not started
//   ... what must happen while the copy is held, and the checks that it did ...
//   gate.Open();                   // the copy runs; later copies pass
//
// Which copies. The next `copies` copies enqueued on the emulated device's copy engine that match
// (direction, at least `min_bytes`), in the order they are enqueued, each numbered from 0. Where:
//  - Point::kStart: the copy is enqueued but does not start. It counts as held once enqueued.
//  - Point::kCompletion: its bytes are all copied, but its fence does not pass: whoever waits for
//    the copy still waits. It counts as held once its last byte is copied.
// A held copy is set aside, not its lane: the lane's other copies go on past it, as a GPU's copy
// engine serves other streams past a stalled one. A copy of zero bytes with nothing to wait for
// completes at enqueue and is never held.
//
// Reach. One gate at a time in a process (a second is a programming error, and aborts). It holds
// the copies of emulated devices made by this program's io/ (CreateEmulatedDevice): a test that
// uses it runs its runtime from the program itself (tiermem_core, or the C API linked in
// statically), not inside libtiermem.so, which keeps its own hidden copy of io/. A CUDA device's
// copies are never held.
//
// A gate never holds forever: `patience` after it is made it opens by itself and says so
// (expired()), so that a test whose ordering is broken fails instead of hanging.
//
// Thread-safe: any thread may wait on it, open it or read it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "io/copy_engine.h"

namespace tiermem::io {

class CopyGate {
 public:
  enum class Point { kStart, kCompletion };
  // Which copies, where, for how long; set by name: Match().Of(dir).AtLeast(bytes).
  struct Match {
    std::optional<CopyDirection> direction;  // unset: any direction
    uint64_t min_bytes = 0;
    int copies = 1;  // how many of the next matching copies are held
    Point point = Point::kStart;
    absl::Duration patience = absl::Seconds(60);  // then it opens by itself (expired())

    Match& Of(CopyDirection d) { return direction = d, *this; }
    Match& AtLeast(uint64_t bytes) { return min_bytes = bytes, *this; }
    Match& Copies(int n) { return copies = n, *this; }
    Match& At(Point p) { return point = p, *this; }
    Match& Patience(absl::Duration d) { return patience = d, *this; }
  };

  explicit CopyGate(const Match& match);
  ~CopyGate();  // opens (held copies go on) and removes the gate
  CopyGate(const CopyGate&) = delete;
  CopyGate& operator=(const CopyGate&) = delete;

  // Blocks until `n` copies have been held in all; false when the gate opened first (Open, or
  // its patience ran out).
  bool WaitHeld(int n = 1);
  // Lets every held copy go on; no copy is held after this.
  void Open();
  // Blocks until `n` of the held copies have completed (their fences passed); false when that
  // takes longer than the gate's patience.
  bool WaitCompleted(int n);
  // The held copies' numbers in the order they completed.
  std::vector<int> completed();
  int held();
  // Whether it opened by itself, its patience spent: what the test waited for never came.
  bool expired();

  // For the copy engine (io/emulated_device.cc): one copy the gate holds.
  class Hold;
  // Called for each copy enqueued: the hold when the gate takes this copy, else nullptr.
  static std::shared_ptr<Hold> Claim(CopyDirection direction, uint64_t bytes);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

class CopyGate::Hold {
 public:
  Hold(std::shared_ptr<State> state, Point point, int number);
  Point point() const { return point_; }
  // Passes when the gate opens: the engine makes the copy wait for it (at its start, or before
  // its own fence passes).
  const FencePtr& fence() const { return fence_; }
  // The copy has reached its point: it is held now.
  void Reached();
  // The copy's fence has passed.
  void Completed();

 private:
  std::shared_ptr<State> state_;
  Point point_;
  int number_;
  FencePtr fence_;
};

}  // namespace tiermem::io
