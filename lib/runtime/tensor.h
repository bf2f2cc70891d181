// Tensor records and the generation-checked handle table that names them.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "io/copy_engine.h"
#include "lib/base/slot_table.h"
#include "lib/tiers/tier_space.h"
#include "tiermem/tiermem.h"

namespace tiermem {

// The state of a tensor's copy in one tier. It changes only through the named transitions of
// Tensor below, always under the runtime's lock.
//
//   kAbsent  --BeginFill-->   kFilling  an extent is reserved; a move or host copy will fill it
//   kFilling --EndFill-->     kValid    every completion of the fill was checked
//   kFilling --Drop-->        kAbsent   the fill failed: the extent is freed, every other copy is
//                                       as it was
//   kValid   --PinWrite-->    kWriting  acquired for writing: its bytes are in flux
//   kFilling --PinWrite-->    kWriting  reserved for a whole overwrite (acquire for writing)
//   kWriting --PinWrite-->    kWriting  acquired for writing again in the same tier (pins count
//                                       the acquires; the last release ends the write)
//   kWriting --UnpinWrite-->  kValid    the last release of the writing acquire
//   kValid   --Land(ticket)-> kLanding  valid in a caller's stream order (a stream-ordered acquire,
//                                       a tm_tensor_copy_in), not yet on the host's
//   kLanding --Landed-->      kValid    the host waited for the ticket
//   kValid   --Drop-->        kAbsent   evicted, superseded or destroyed
//
// Invariants:
// - kAbsent holds no extent; every other state holds one.
// - kValid, kLanding and kWriting copies are the tensor's bytes; when several tiers hold
//   kValid/kLanding copies, they hold the same bytes. A kWriting copy is the only copy.
// - pins > 0 only for kValid, kLanding or kWriting; a pinned copy is never dropped or moved.
// - A copy is read by a move or a host copy only while its tensor is busy (see Tensor::busy).
// - Nothing of tiermem reads, writes or frees a copy's memory before its `uses` have passed:
//   fences on callers' streams (tm_tensor_release_on_stream) and copies to callers
//   (tm_tensor_copy_out) still reading it. A copy dropped with uses pending hands its extent to
//   the runtime's deferred frees instead of its tier.
enum class CopyState : uint8_t { kAbsent, kFilling, kValid, kLanding, kWriting };

const char* CopyStateName(CopyState s);

struct Tensor;
// Whether copy-state transitions check their starting state: on in builds without NDEBUG and in
// those with TIERMEM_CHECK_TRANSITIONS (the sanitizer builds), off otherwise; tests may switch.
bool TransitionChecksOn();
void SetTransitionChecks(bool on);
// A transition from a state it does not start from: says which, and aborts (a bug of tiermem's,
// never of a caller's: every caller error is refused before any transition).
[[noreturn]] void BadTransition(const Tensor& t, tm_tier tier, const char* transition);

struct TensorCopy {
  Extent extent;
  CopyState state = CopyState::kAbsent;
  uint32_t pins = 0;               // outstanding acquires
  uint32_t exports = 0;            // of those, DLPack exports' (tm_tensor_acquire_dlpack)
  std::vector<io::FencePtr> uses;  // must pass before tiermem touches the memory (see above)
  // A DRAM copy kept by an offload to NVMe, or by a prefetch that read through DRAM (inclusive
  // DRAM): a read of it while NVMe holds the same bytes is a read of NVMe saved
  // (tm_stats.clean_read_bytes). Forgotten with the copy.
  bool kept_clean = false;

  // Holds the tensor's bytes (the host may need to wait for a landing copy first).
  bool valid() const {
    return state == CopyState::kValid || state == CopyState::kLanding ||
           state == CopyState::kWriting;
  }
};

// All fields are guarded by the runtime's lock.
struct Tensor {
  uint64_t handle = 0;
  uint64_t key = 0;       // matches its uses across steps (see Schedule)
  uint64_t last_use = 0;  // runtime tick of the last use: LRU order without a schedule
  uint64_t bytes = 0;
  tm_tensor_class cls = TM_CLASS_OTHER;
  tm_tier home = TM_TIER_HBM;
  std::string name;
  std::array<TensorCopy, TM_TIER_COUNT> copies;
  // The thread of an operation that runs outside the runtime's lock on this tensor (a move, a
  // host copy, an eviction's write-down); empty when none. Every other operation on the tensor
  // waits, so the extents and copies it uses stay put. Set and cleared only by Runtime's
  // BusyScope. Eviction tells "busy by me" (a wall) from "busy by another thread" (a move in
  // flight that will finish: a demand may wait for it).
  std::thread::id busy_by{};
  bool busy() const { return busy_by != std::thread::id{}; }
  // The thread of an Adam step that holds this tensor as its state (Runtime::HoldForStep);
  // empty when none. Writes by other threads are refused until the step lets go; once the step
  // is prepared and waits for its commit (sealed, Runtime::SealForStep), writes by any thread,
  // another hold and a destroy are.
  std::thread::id held_by_step{};
  bool hold_sealed = false;
  // Asynchronous moves queued and not yet finished.
  uint32_t queued = 0;
  // The ticket of the kLanding copy (in `landing_tier`): a copy ordered on a caller's stream or
  // enqueued by tm_tensor_copy_in, that the host has not waited for.
  std::optional<io::CopyTicket> landing;
  tm_tier landing_tier = TM_TIER_HBM;
  // The landing copy replaces the others once it lands (tm_tensor_copy_in): until then they
  // keep the old bytes, so that a copy that fails loses nothing.
  bool landing_replaces = false;
  // The landing copy is tiermem's own copy down (an eviction's write-down that handed its HBM
  // memory on, lib/runtime/vacate.cc), not ordered on a caller's stream: tm_tensor_copy_done
  // and tm_tensor_swap do not count it, and a failure loses the bytes (Tensor::lost).
  bool landing_own = false;
  // The caller's callback that rebuilds the bytes (tm_tensor_set_recompute; lib/runtime/
  // recompute.cc), and whether the tensor is dropped: no copy holds its bytes, the callback
  // rebuilds them. A copy becoming valid (EndFill, PinWrite) ends the drop.
  struct Recompute {
    tm_recompute_fn fn = nullptr;
    void* user = nullptr;
    double cost_seconds = 0;
  } recompute;
  bool dropped = false;
  // Dropped because its bytes were lost: a device error failed its copy down after its HBM
  // memory was handed on (lib/runtime/vacate.cc). Only a rebuild or a whole overwrite ends it.
  bool lost = false;
  // tm_tensor_destroy ran while only DLPack exports pinned it (TensorCopy::exports): the handle
  // is gone for callers (Core::Find) and the last export's release frees it (exports.cc).
  bool orphaned = false;

  TensorCopy& copy(tm_tier t) { return copies[t]; }
  const TensorCopy& copy(tm_tier t) const { return copies[t]; }

  // ---- transitions (the runtime holds its lock) ----
  // Each checks its starting state when checks are on (see TransitionChecksOn).
  void BeginFill(tm_tier t, const Extent& e) {
    Expect(t, "BeginFill", {CopyState::kAbsent});
    copies[t].extent = e;
    copies[t].state = CopyState::kFilling;
  }
  // On success the copy is valid; on failure the caller frees the extent (Drop).
  void EndFill(tm_tier t) {
    Expect(t, "EndFill", {CopyState::kFilling});
    copies[t].state = CopyState::kValid;
    dropped = false;
    lost = false;
  }
  void PinWrite(tm_tier t) {
    Expect(t, "PinWrite", {CopyState::kValid, CopyState::kFilling, CopyState::kWriting});
    copies[t].state = CopyState::kWriting;
    dropped = false;  // overwritten whole: nothing to rebuild
    lost = false;
  }
  void UnpinWrite(tm_tier t) {
    Expect(t, "UnpinWrite", {CopyState::kWriting});
    copies[t].state = CopyState::kValid;
  }
  void Land(tm_tier t, io::CopyTicket ticket, bool replaces = false, bool own = false) {
    Expect(t, "Land", {CopyState::kValid});
    copies[t].state = CopyState::kLanding;
    landing = std::move(ticket);
    landing_tier = t;
    landing_replaces = replaces;
    landing_own = own;
  }
  void Landed(tm_tier t) {
    Expect(t, "Landed", {CopyState::kLanding});
    copies[t].state = CopyState::kValid;
    landing.reset();
  }
  // Forgets the copy; returns the extent for the caller to free in its tier. Never of a pinned
  // copy.
  Extent Drop(tm_tier t) {
    if (copies[t].pins > 0 && TransitionChecksOn()) BadTransition(*this, t, "Drop (pinned)");
    Extent e = copies[t].extent;
    copies[t] = TensorCopy{};
    if (t == landing_tier) landing.reset();
    return e;
  }

  // ---- queries ----
  // Whether any tier holds it; a tensor never written reads as zeros.
  bool materialized() const {
    for (const auto& c : copies) {
      if (c.valid()) return true;
    }
    return false;
  }
  uint32_t ResidencyMask() const {
    uint32_t m = 0;
    for (int t = 0; t < TM_TIER_COUNT; ++t) {
      if (copies[t].valid()) m |= TM_TIER_BIT(t);
    }
    return m;
  }
  // The tier whose copy is being written through an acquire, or -1.
  int writing_tier() const {
    for (int t = 0; t < TM_TIER_COUNT; ++t) {
      if (copies[t].state == CopyState::kWriting) return t;
    }
    return -1;
  }
  bool pinned() const {
    for (const auto& c : copies) {
      if (c.pins > 0) return true;
    }
    return false;
  }
  // The copy in `t` is the tensor's only valid one: evicting it means writing it down first.
  bool only_copy(tm_tier t) const { return (ResidencyMask() & ~TM_TIER_BIT(t)) == 0; }

 private:
  void Expect(tm_tier t, const char* transition, std::initializer_list<CopyState> from) const {
    if (!TransitionChecksOn()) return;
    for (CopyState s : from) {
      if (copies[t].state == s) return;
    }
    BadTransition(*this, t, transition);
  }
};

// The runtime's tensors, named by generation-checked handles of the tensor kind (see SlotTable).
class TensorTable {
 public:
  uint64_t Insert(std::unique_ptr<Tensor> t) { return slots_.Insert(std::move(t)); }
  // nullptr for zero, destroyed, stale or foreign handles.
  Tensor* Find(uint64_t handle) const {
    const std::unique_ptr<Tensor>* t = slots_.Find(handle);
    return t != nullptr ? t->get() : nullptr;
  }
  std::unique_ptr<Tensor> Remove(uint64_t handle) { return slots_.Remove(handle); }
  size_t size() const { return slots_.size(); }
  template <typename F>
  void ForEach(F&& f) {
    slots_.ForEach([&](std::unique_ptr<Tensor>& t) { f(*t); });
  }

 private:
  SlotTable<std::unique_ptr<Tensor>, HandleKind::kTensor> slots_;
};

}  // namespace tiermem
