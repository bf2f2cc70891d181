// The emulated device: host memory with its own budget, and a copy engine with one worker
// thread per direction that can be throttled to a link bandwidth, so that overlap and
// prefetching behave as on a PCIe link. Like a DMA engine fed from several streams, a lane
// interleaves its queued copies slice by slice: a small copy is not stuck behind a huge one.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"
#include "io/device.h"
#include "io/sync.h"

namespace tiermem::io {
namespace {

using Clock = std::chrono::steady_clock;

class EmulatedCopyEngine final : public CopyEngine {
 public:
  static constexpr uint64_t kSlice = 1u << 20;

  explicit EmulatedCopyEngine(double link_gbps) : bytes_per_second_(link_gbps * 1e9) {
    for (int d = 0; d < 2; ++d) lanes_[d].worker = std::thread([this, d] { Work(lanes_[d]); });
  }
  ~EmulatedCopyEngine() override {
    for (Lane& lane : lanes_) {
      {
        MutexLock lock(&lane.mu);
        lane.stop = true;
        lane.work.Signal();
      }
      lane.worker.join();
    }
  }

  absl::StatusOr<CopyTicket> Enqueue(CopyDirection dir, void* dst, const void* src,
                                     uint64_t bytes) override {
    Lane& lane = lanes_[static_cast<int>(dir)];
    MutexLock lock(&lane.mu);
    uint64_t seq = ++lane.enqueued;
    if (bytes == 0) {
      lane.done_set.insert(seq);
    } else {
      lane.active.push_back(
          Job{seq, static_cast<char*>(dst), static_cast<const char*>(src), bytes, 0});
      lane.work.Signal();
    }
    return CopyTicket{seq << 1 | static_cast<uint64_t>(dir)};
  }

  absl::Status Wait(CopyTicket ticket) override {
    Lane& lane = lanes_[ticket.id & 1];
    uint64_t seq = ticket.id >> 1;
    MutexLock lock(&lane.mu);
    if (seq == 0 || seq > lane.enqueued) {
      return absl::InvalidArgumentError("waiting for a copy that was never enqueued");
    }
    while (!lane.done_set.contains(seq)) lane.done.Wait(&lane.mu);
    lane.done_set.erase(seq);
    return absl::OkStatus();
  }

 private:
  struct Job {
    uint64_t seq;
    char* dst;
    const char* src;
    uint64_t bytes;
    uint64_t copied;
  };
  // One direction of the link.
  struct Lane {
    Mutex mu;
    std::deque<Job> active ABSL_GUARDED_BY(mu);  // served round-robin, one slice each
    uint64_t enqueued ABSL_GUARDED_BY(mu) = 0;
    absl::flat_hash_set<uint64_t> done_set ABSL_GUARDED_BY(mu);  // finished, not yet waited
    bool stop ABSL_GUARDED_BY(mu) = false;
    CondVar work;  // signalled on enqueue and stop
    CondVar done;  // signalled when a copy finishes
    std::thread worker;
  };

  void Work(Lane& lane) {
    // The link clock: when the emulated link is next free. A slice occupies the link for
    // slice / bandwidth from the moment it starts (the memcpy happens within that time). The
    // clock may lag real time by kSlack, so that a late wake-up is made up by the next slices,
    // but an idle lane banks no more credit than that.
    constexpr auto kSlack = std::chrono::microseconds(500);
    Clock::time_point link_free = Clock::now();
    for (;;) {
      Job job;
      {
        MutexLock lock(&lane.mu);
        while (!lane.stop && lane.active.empty()) lane.work.Wait(&lane.mu);
        if (lane.active.empty()) return;  // stop requested and nothing left
        job = lane.active.front();
        lane.active.pop_front();
      }
      const uint64_t n = std::min(kSlice, job.bytes - job.copied);
      if (bytes_per_second_ > 0) {
        link_free = std::max(link_free, Clock::now() - kSlack) +
                    std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(static_cast<double>(n) / bytes_per_second_));
      }
      std::memcpy(job.dst + job.copied, job.src + job.copied, n);
      job.copied += n;
      if (bytes_per_second_ > 0) std::this_thread::sleep_until(link_free);
      MutexLock lock(&lane.mu);
      if (job.copied < job.bytes) {
        lane.active.push_back(job);
      } else {
        lane.done_set.insert(job.seq);
        lane.done.SignalAll();
      }
    }
  }

  double bytes_per_second_;
  Lane lanes_[2];
};

class EmulatedDevice final : public Device {
 public:
  explicit EmulatedDevice(const EmulatedDeviceOptions& o)
      : physical_(o.physical_bytes), link_gbps_(o.link_gbps), engine_(o.link_gbps) {
    if (physical_ == 0) {
      physical_ = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                  static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    }
  }

  absl::string_view kind() const override { return "emulated"; }
  std::string Describe() const override {
    return link_gbps_ > 0
               ? absl::StrFormat("emulated device (host memory, link capped at %.3g GB/s)",
                                 link_gbps_)
               : std::string("emulated device (host memory, link uncapped)");
  }
  uint64_t physical_bytes() const override { return physical_; }
  uint64_t default_budget() const override { return std::min<uint64_t>(1ull << 30, physical_ / 4); }
  std::optional<std::string> pci_bus_id() const override { return std::nullopt; }

  absl::StatusOr<void*> AllocateSlab(uint64_t bytes) override {
    // Reserved, not touched: the budget is enforced by the HBM tier's allocator.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("emulated device: cannot map %llu bytes: %s",
                          static_cast<unsigned long long>(bytes), std::strerror(errno)));
    }
    return p;
  }
  void FreeSlab(void* slab, uint64_t bytes) override { munmap(slab, bytes); }
  absl::Status RegisterHost(void*, uint64_t) override { return absl::OkStatus(); }
  void UnregisterHost(void*) override {}
  absl::Status Fill(void* addr, int value, uint64_t bytes) override {
    std::memset(addr, value, bytes);
    return absl::OkStatus();
  }
  CopyEngine& copy_engine() override { return engine_; }

  absl::StatusOr<std::vector<double>> TimeCopies(CopyKind kind, void* dst, const void* src,
                                                 uint64_t bytes, int repeats) override {
    std::vector<double> seconds;
    for (int i = -1; i < repeats; ++i) {  // i == -1: the warm-up
      auto t0 = Clock::now();
      if (kind == CopyKind::kDeviceToDevice) {
        std::memcpy(dst, src, bytes);
      } else {
        auto dir = kind == CopyKind::kHostToDevice ? CopyDirection::kHostToDevice
                                                   : CopyDirection::kDeviceToHost;
        if (auto s = engine_.Copy(dir, dst, src, bytes); !s.ok()) return s;
      }
      if (i >= 0) seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return seconds;
  }

 private:
  uint64_t physical_;
  double link_gbps_;
  EmulatedCopyEngine engine_;
};

}  // namespace

std::unique_ptr<Device> CreateEmulatedDevice(const EmulatedDeviceOptions& options) {
  return std::make_unique<EmulatedDevice>(options);
}

}  // namespace tiermem::io
