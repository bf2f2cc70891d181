// The timeline: transfers, acquire stalls and evictions as Chrome-trace JSON ("X" events, one
// track per engine direction), for Perfetto and chrome://tracing. Thread-safe; bounded.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/sync.h"

namespace tiermem {

// `s` as the inside of a JSON string: quotes, backslashes and every control character
// (U+0000-U+001F, U+007F) escaped, and each byte that is not part of valid UTF-8 replaced by
// U+FFFD, so the result is always a valid JSON string whatever bytes a caller named a tensor.
std::string JsonEscape(absl::string_view s);

// The longest prefix of `s` of at most `max` bytes that does not end inside a UTF-8 character.
absl::string_view Utf8Prefix(absl::string_view s, size_t max);

// A TIERMEM_TRACE path with %p (the process id), %r (the local rank) and %% expanded.
std::string ExpandTracePath(absl::string_view path, int64_t pid, int local_rank);

class Trace {
 public:
  // Tracks, one per row in the viewer.
  enum Track : int {
    kAcquire = 1,    // acquire stalls: an acquire that had to wait or move
    kHostToDevice,   // DRAM -> HBM
    kDeviceToHost,   // HBM -> DRAM
    kNvmeRead,       // NVMe -> DRAM
    kNvmeWrite,      // DRAM -> NVMe
    kNvmeToHbm,      // NVMe -> HBM through staging
    kHbmToNvme,      // HBM -> NVMe through staging
    kEviction,       // a copy written down (if it was the only one) and freed
    kCleanDrop,      // a clean copy freed without a write: another tier held its bytes
    kCleanRead,      // DRAM -> HBM from a clean DRAM copy (NVMe holds the bytes too): a read of
                     // NVMe saved by inclusive DRAM; the same copy is on "copy dram->hbm"
    kRecomputeDrop,  // an only copy freed without a write: its recompute callback rebuilds it
    kRecompute,      // a recompute callback rebuilding a dropped tensor
    kRelocation,     // a copy slid down within HBM to merge holes (compaction)
    kPrefetchDrop,   // a prefetch not done (tm_stats.prefetches_dropped), with the reason
    kTrackCount
  };
  using Clock = std::chrono::steady_clock;

  // Tracing off.
  Trace();
  // Tracing to `path` (a TIERMEM_TRACE value; empty: off), opened now so that a path that
  // cannot be written fails runtime creation: TM_ERR_CONFIG naming it. The events go to a new
  // file beside it (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600), renamed over `path` by Write, so
  // nothing at `path` is ever opened: a regular file or symlink there is replaced (the link,
  // not its target), a directory, FIFO or device refused; and no reader sees half a trace.
  // `setting` names the path in messages (where it was set: Config::SettingName). A process
  // that exits (exit(), the end of main, an interpreter's exit after an uncaught exception)
  // with the runtime never destroyed writes it then (an atexit handler, in the process that
  // opened it only); one killed, or ended by _exit, leaves its hidden file (.NAME.PID-N.tmp).
  static absl::StatusOr<std::unique_ptr<Trace>> Open(const std::string& path, int local_rank,
                                                     absl::string_view setting = "TIERMEM_TRACE");
  // Removes the unfinished file when Write never ran.
  ~Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  bool enabled() const { return fd_.load(std::memory_order_relaxed) >= 0; }
  // The expanded path the trace is written to.
  const std::string& path() const { return path_; }
  void Add(Track track, std::string name, Clock::time_point start, Clock::time_point end,
           uint64_t bytes);
  // The same, with a `reason` in the event's args (a dropped prefetch: why).
  void Add(Track track, std::string name, Clock::time_point start, Clock::time_point end,
           uint64_t bytes, std::string reason);
  // Writes the JSON and renames it into place: at runtime destruction, or at the process's
  // exit; once (a second call does nothing).
  absl::Status Write();
  // Write, in the process that opened it (at exit: see Open).
  absl::Status WriteAtExit();

 private:
  struct Event {
    Track track;
    std::string name;
    int64_t start_ns, dur_ns;
    uint64_t bytes;
    std::string reason;  // empty: none
  };
  static constexpr size_t kMaxEvents = 1 << 20;
  std::string setting_;      // how messages name the path
  std::string path_;         // where the trace ends up
  std::string temp_path_;    // where it is written until then
  std::atomic<int> fd_{-1};  // temp_path_, open for writing; -1 once written
  int pid_ = 0;              // the process that opened it (a fork()ed child's exit writes nothing)
  Mutex write_mu_;           // one Write at a time (the runtime's destroy, the exit handler)
  Clock::time_point origin_;
  mutable Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tiermem
