// The emulated device: host memory with its own budget, and a copy engine with one worker
// thread per direction that can be throttled to a link bandwidth, so that overlap and
// prefetching behave as on a PCIe link, and streams whose host functions run in order, so that
// stream-ordered copies and releases are real asynchronous work here too. Like a DMA engine fed
// from several streams, a lane interleaves its queued copies slice by slice: a small copy is not
// stuck behind a huge one. A test's copy gate (io/copy_gate.h) may hold chosen copies.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "io/copy_gate.h"
#include "io/device.h"
#include "io/emulated_chunks.h"
#include "io/sync.h"

namespace tiermem::io {
namespace {

using Clock = std::chrono::steady_clock;

// The emulated device's fence: set once, by the work it follows.
class Completion final : public Fence {
 public:
  absl::Status Wait() override {
    MutexLock lock(&mu_);
    while (!done_) cv_.Wait(&mu_);
    return status_;
  }
  bool Passed() override {
    MutexLock lock(&mu_);
    return done_;
  }
  void Complete(absl::Status s) {
    MutexLock lock(&mu_);
    status_ = std::move(s);
    done_ = true;
    cv_.SignalAll();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

// A stream: one thread running launched work in order.
class EmulatedStream::Impl {
 public:
  Impl() : worker_([this] { Run(); }) {}
  ~Impl() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
      cv_.SignalAll();
    }
    worker_.join();
  }
  void Launch(std::function<void()> work) {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(work));
    cv_.SignalAll();
  }
  FencePtr Record() {
    auto c = std::make_shared<Completion>();
    Launch([c] { c->Complete(absl::OkStatus()); });
    return c;
  }
  void Synchronize() { (void)Record()->Wait(); }
  std::atomic<bool> capturing{false};

 private:
  void Run() {
    MutexLock lock(&mu_);
    for (;;) {
      while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      mu_.Unlock();
      work();
      mu_.Lock();
    }
  }
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

namespace {

// The live emulated streams by handle, so that a bad handle is told apart, never dereferenced.
struct StreamRegistry {
  Mutex mu;
  absl::flat_hash_map<const void*, std::weak_ptr<EmulatedStream::Impl>> live ABSL_GUARDED_BY(mu);
};
StreamRegistry& Streams() {
  static auto* r = new StreamRegistry;  // never destroyed: streams may outlive static teardown
  return *r;
}

// cudaStreamLegacy and cudaStreamPerThread: one process-wide emulated stream.
constexpr uintptr_t kLegacyStream = 0x1, kPerThreadStream = 0x2;
std::shared_ptr<EmulatedStream::Impl> DefaultStream() {
  static auto* s = new std::shared_ptr<EmulatedStream::Impl>(new EmulatedStream::Impl);
  return *s;
}

absl::StatusOr<std::shared_ptr<EmulatedStream::Impl>> LookupStream(void* stream) {
  const auto bits = reinterpret_cast<uintptr_t>(stream);
  if (bits == kLegacyStream || bits == kPerThreadStream) return DefaultStream();
  std::shared_ptr<EmulatedStream::Impl> impl;
  {
    MutexLock lock(&Streams().mu);
    if (auto it = Streams().live.find(stream); it != Streams().live.end()) impl = it->second.lock();
  }
  if (impl == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stream %p is not a live stream of the emulated device", stream));
  }
  if (impl->capturing.load()) {
    return absl::UnimplementedError(absl::StrFormat(
        "stream %p is being captured into a graph: a stream-ordered copy would run once, at "
        "capture, not at each replay",
        stream));
  }
  return impl;
}

}  // namespace

EmulatedStream::EmulatedStream() : impl_(std::make_shared<Impl>()) {
  MutexLock lock(&Streams().mu);
  Streams().live[this] = impl_;
}
EmulatedStream::~EmulatedStream() {
  {
    MutexLock lock(&Streams().mu);
    Streams().live.erase(this);
  }
  impl_->Synchronize();
}
void EmulatedStream::Launch(std::function<void()> work) { impl_->Launch(std::move(work)); }
void EmulatedStream::Synchronize() { impl_->Synchronize(); }
void EmulatedStream::SetCapturing(bool capturing) { impl_->capturing = capturing; }

namespace {

class EmulatedCopyEngine final : public CopyEngine {
 public:
  static constexpr uint64_t kSlice = 1u << 20;
  // Host <-> device copies cross the (capped) link one lane per direction; device-to-device and
  // host-to-host copies share an uncapped third lane.
  static constexpr int kLanes = 3;

  explicit EmulatedCopyEngine(double link_gbps) : bytes_per_second_(link_gbps * 1e9) {
    for (int d = 0; d < kLanes; ++d) {
      lanes_[d].capped = d < 2;
      lanes_[d].worker = std::thread([this, d] { Work(lanes_[d]); });
    }
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

  absl::StatusOr<CopyTicket> Enqueue(CopyDirection dir, void* dst, const void* src, uint64_t bytes,
                                     const std::vector<FencePtr>& after) override {
    const int d = static_cast<int>(dir);
    Lane& lane = lanes_[d < 2 ? d : 2];
    auto done = std::make_shared<Completion>();
    if (bytes == 0 && after.empty()) {
      done->Complete(absl::OkStatus());
      return CopyTicket{done};
    }
    // A test's gate may hold this copy: a copy held at its start waits for the gate's fence.
    std::shared_ptr<CopyGate::Hold> hold = CopyGate::Claim(dir, bytes);
    Job job{
        static_cast<char*>(dst), static_cast<const char*>(src), bytes, 0, after, done, hold, false};
    const bool held_at_start = hold != nullptr && hold->point() == CopyGate::Point::kStart;
    if (held_at_start) job.after.push_back(hold->fence());
    MutexLock lock(&lane.mu);
    if (InlineCopy(lane, job)) return CopyTicket{done};
    lane.active.push_back(std::move(job));
    if (held_at_start) hold->Reached();
    lane.work.Signal();
    return CopyTicket{done};
  }

  absl::StatusOr<FencePtr> RecordOnStream(void* stream) override {
    auto impl = LookupStream(stream);
    if (!impl.ok()) return impl.status();
    return (*impl)->Record();
  }

  absl::Status StreamWait(void* stream, const FencePtr& fence) override {
    auto impl = LookupStream(stream);
    if (!impl.ok()) return impl.status();
    (*impl)->Launch([fence] { (void)fence->Wait(); });
    return absl::OkStatus();
  }

 private:
  struct Job {
    char* dst;
    const char* src;
    uint64_t bytes;
    uint64_t copied;
    std::vector<FencePtr> after;  // cleared once they have passed
    std::shared_ptr<Completion> done;
    std::shared_ptr<CopyGate::Hold> hold;  // a test's gate holds it (nullptr: none does)
    bool held_at_completion = false;       // its bytes copied, it has waited for the gate
  };
  // One lane of the link.
  struct Lane {
    Mutex mu;
    std::deque<Job> active ABSL_GUARDED_BY(mu);  // served round-robin, one slice each
    bool stop ABSL_GUARDED_BY(mu) = false;
    CondVar work;  // signalled on enqueue and stop
    bool capped = true;
    std::thread worker;
  };

  // A small copy on an uncapped lane with nothing queued and nothing to wait for is copied on
  // the caller's thread: handing it to the lane's thread would cost two thread wake-ups, several
  // times the memcpy, and on a machine with few cores that time is taken from the caller (a GPU's
  // copy engine costs the host only the call). Order is kept: nothing is ahead of it in the lane.
  bool InlineCopy(Lane& lane, Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu) {
    if (job.bytes > kInlineBytes || job.hold != nullptr || !lane.active.empty() ||
        (lane.capped && bytes_per_second_ > 0) || !Ready(job)) {
      return false;
    }
    std::memcpy(job.dst, job.src, job.bytes);
    job.done->Complete(absl::OkStatus());
    return true;
  }
  static constexpr uint64_t kInlineBytes = 64u << 10;

  static bool Ready(Job& job) {
    for (const FencePtr& f : job.after) {
      if (!f->Passed()) return false;
    }
    job.after.clear();
    return true;
  }

  void Work(Lane& lane) {
    // The link clock: when the emulated link is next free. A slice occupies the link for
    // slice / bandwidth from the moment it starts (the memcpy happens within that time). The
    // clock may lag real time by kSlack, so that a late wake-up is made up by the next slices,
    // but an idle lane banks no more credit than that.
    constexpr auto kSlack = std::chrono::microseconds(500);
    Clock::time_point link_free = Clock::now();
    const bool capped = lane.capped && bytes_per_second_ > 0;
    for (;;) {
      Job job;
      {
        MutexLock lock(&lane.mu);
        for (;;) {
          while (!lane.stop && lane.active.empty()) lane.work.Wait(&lane.mu);
          if (lane.active.empty()) return;  // stop requested and nothing left
          // The first job whose fences have passed; the others wait their turn, as copies
          // queued behind a cudaStreamWaitEvent do.
          auto it = std::find_if(lane.active.begin(), lane.active.end(), Ready);
          if (it != lane.active.end()) {
            job = std::move(*it);
            lane.active.erase(it);
            break;
          }
          lane.work.WaitWithTimeout(&lane.mu, absl::Microseconds(200));
        }
      }
      const uint64_t n = std::min(kSlice, job.bytes - job.copied);
      if (capped) {
        link_free = std::max(link_free, Clock::now() - kSlack) +
                    std::chrono::duration_cast<Clock::duration>(
                        std::chrono::duration<double>(static_cast<double>(n) / bytes_per_second_));
      }
      if (n > 0) std::memcpy(job.dst + job.copied, job.src + job.copied, n);
      job.copied += n;
      if (capped) std::this_thread::sleep_until(link_free);
      const bool hold_now = job.copied == job.bytes && job.hold != nullptr &&
                            job.hold->point() == CopyGate::Point::kCompletion &&
                            !job.held_at_completion;
      if (job.copied < job.bytes || hold_now) {
        // Held at its completion: back in the lane behind the gate's fence, its bytes copied.
        if (hold_now) {
          job.after.push_back(job.hold->fence());
          job.held_at_completion = true;
        }
        MutexLock lock(&lane.mu);
        if (hold_now) job.hold->Reached();
        lane.active.push_back(std::move(job));
      } else {
        job.done->Complete(absl::OkStatus());
        if (job.hold != nullptr) job.hold->Completed();
      }
    }
  }

  double bytes_per_second_;
  Lane lanes_[kLanes];
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
  uint64_t free_bytes() const override { return physical_; }
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
    MutexLock lock(&mu_);
    slabs_[p] = bytes;
    return p;
  }
  void FreeSlab(void* slab, uint64_t bytes) override {
    {
      MutexLock lock(&mu_);
      slabs_.erase(slab);
    }
    munmap(slab, bytes);
  }
  absl::StatusOr<std::unique_ptr<ChunkMapper>> CreateChunkMapper(uint64_t bytes,
                                                                 uint64_t range_multiple) override {
    auto m = CreateEmulatedChunkMapper(bytes, range_multiple, [this](void* base) {
      MutexLock lock(&mu_);
      slabs_.erase(base);
    });
    if (!m.ok()) return m.status();
    MutexLock lock(&mu_);
    slabs_[(*m)->base()] = (*m)->range_bytes();  // the whole range is device memory
    return std::move(*m);
  }
  bool IsDevicePointer(const void* p) override {
    MutexLock lock(&mu_);
    for (const auto& [base, bytes] : slabs_) {
      const char* b = static_cast<const char*>(base);
      if (p >= b && p < b + bytes) return true;
    }
    return false;
  }
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
  Mutex mu_;
  absl::flat_hash_map<void*, uint64_t> slabs_ ABSL_GUARDED_BY(mu_);  // device memory
};

}  // namespace

std::unique_ptr<Device> CreateEmulatedDevice(const EmulatedDeviceOptions& options) {
  return std::make_unique<EmulatedDevice>(options);
}

}  // namespace tiermem::io
