#include "lib/optim/stream_pool.h"

#include "absl/strings/str_format.h"
#include "io/log.h"
#include "io/numa.h"
#include "lib/base/status.h"

namespace tiermem::optim {

absl::StatusOr<std::unique_ptr<StreamPool>> StreamPool::Create(int threads, int numa_node) {
  if (threads < 1 || threads > 1024) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("threads = %d, want 1 to 1024", threads));
  }
  std::unique_ptr<StreamPool> pool(new StreamPool());
  pool->numa_node_ = numa_node;
  // The caller's memory is as near as the workers' when they are not bound, or when there is
  // one node only. On a host with several, the caller may sit on another node than the one the
  // state is bound to: it only waits there, as before.
  pool->caller_works_ = numa_node < 0;
  if (!pool->caller_works_) {
    auto topo = io::Topology::Load(/*with_pci=*/false);
    pool->caller_works_ = topo.ok() && (*topo)->NodeCount() <= 1;
  }
  const int first = pool->caller_works_ ? 1 : 0;  // the caller's share is 0
  pool->share_count_ = threads;
  pool->shares_.reset(new Share[static_cast<size_t>(threads)]);
  pool->workers_.reserve(static_cast<size_t>(threads - first));
  for (int share = first; share < threads; ++share) {
    pool->workers_.emplace_back(
        [p = pool.get(), share, numa_node] { p->WorkerLoop(share, numa_node); });
  }
  return pool;
}

StreamPool::~StreamPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    wake_.SignalAll();
  }
  for (std::thread& t : workers_) t.join();
}

size_t StreamPool::TakeTasks(const absl::FunctionRef<void(size_t)>& job, int share) {
  size_t ran = 0;
  for (int k = 0; k < share_count_; ++k) {
    Share& s = shares_[static_cast<size_t>((share + k) % share_count_)];
    for (size_t t = s.next.fetch_add(1, std::memory_order_relaxed); t < s.end;
         t = s.next.fetch_add(1, std::memory_order_relaxed)) {
      job(t);
      ++ran;
    }
  }
  return ran;
}

void StreamPool::Run(size_t tasks, absl::FunctionRef<void(size_t)> fn) {
  if (tasks == 0) return;
  MutexLock run_lock(&run_mu_);
  const bool wake = !workers_.empty() && (tasks > 1 || !caller_works_);
  {
    MutexLock lock(&mu_);
    job_ = &fn;
    tasks_ = tasks;
    finished_ = 0;
    // No worker is inside (the last Run waited for them): the shares are the new job's.
    const size_t n = static_cast<size_t>(share_count_);
    for (size_t k = 0; k < n; ++k) {
      shares_[k].next.store(tasks * k / n, std::memory_order_relaxed);
      shares_[k].end = tasks * (k + 1) / n;
    }
    if (wake) {
      ++generation_;
      wake_.SignalAll();
    }
  }
  const size_t ran = caller_works_ ? TakeTasks(fn, 0) : 0;
  MutexLock lock(&mu_);
  finished_ += ran;
  while (finished_ < tasks_ || inside_ > 0) done_.Wait(&mu_);
  job_ = nullptr;
}

void StreamPool::WorkerLoop(int share, int numa_node) {
  if (numa_node >= 0) {
    // A topology per worker: hwloc topologies are not to be shared across threads while
    // binding, and loading one without PCI is quick.
    absl::Status bound = absl::OkStatus();
    auto topo = io::Topology::Load(/*with_pci=*/false);
    if (topo.ok()) {
      bound = (*topo)->BindCallingThreadToNode(numa_node);
    } else {
      bound = topo.status();
    }
    if (!bound.ok()) {
      io::Log(io::LogSeverity::kWarn, "optimizer worker left unbound: %s",
              std::string(bound.message()).c_str());
    }
  }
  uint64_t seen = 0;
  while (true) {
    const absl::FunctionRef<void(size_t)>* job;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && generation_ == seen) wake_.Wait(&mu_);
      if (stopping_) return;
      seen = generation_;
      // Woken too late: the job is over (or done but for the workers inside it, whose tasks
      // are all taken). Nothing to do; back to sleep.
      if (job_ == nullptr || finished_ >= tasks_) continue;
      job = job_;
      ++inside_;
    }
    const size_t ran = TakeTasks(*job, share);
    MutexLock lock(&mu_);
    finished_ += ran;
    --inside_;
    if (finished_ >= tasks_ && inside_ == 0) done_.Signal();
  }
}

}  // namespace tiermem::optim
