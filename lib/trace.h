// The timeline: transfers, acquire stalls and evictions as Chrome-trace JSON ("X" events, one
// track per engine direction), for Perfetto and chrome://tracing. Thread-safe; bounded.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "io/sync.h"

namespace tiermem {

// `s` as the inside of a JSON string.
std::string JsonEscape(const std::string& s);

class Trace {
 public:
  // Tracks, one per row in the viewer.
  enum Track : int {
    kAcquire = 1,   // acquire stalls: an acquire that had to wait or move
    kHostToDevice,  // DRAM -> HBM
    kDeviceToHost,  // HBM -> DRAM
    kNvmeRead,      // NVMe -> DRAM
    kNvmeWrite,     // DRAM -> NVMe
    kNvmeToHbm,     // NVMe -> HBM through staging
    kHbmToNvme,     // HBM -> NVMe through staging
    kEviction,
    kTrackCount
  };
  using Clock = std::chrono::steady_clock;

  explicit Trace(std::string path);
  bool enabled() const { return !path_.empty(); }
  void Add(Track track, std::string name, Clock::time_point start, Clock::time_point end,
           uint64_t bytes);
  // Writes the JSON file. Called once, at runtime destruction.
  absl::Status Write() const;

 private:
  struct Event {
    Track track;
    std::string name;
    int64_t start_ns, dur_ns;
    uint64_t bytes;
  };
  static constexpr size_t kMaxEvents = 1 << 20;
  std::string path_;
  Clock::time_point origin_;
  mutable Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tiermem
