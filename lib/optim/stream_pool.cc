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
  pool->workers_.reserve(static_cast<size_t>(threads));
  for (int i = 0; i < threads; ++i) {
    pool->workers_.emplace_back([p = pool.get(), numa_node] { p->WorkerLoop(numa_node); });
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

void StreamPool::Run(size_t tasks, absl::FunctionRef<void(size_t)> fn) {
  if (tasks == 0) return;
  MutexLock run_lock(&run_mu_);
  MutexLock lock(&mu_);
  job_ = &fn;
  tasks_ = tasks;
  next_task_.store(0, std::memory_order_relaxed);
  busy_ = threads();
  ++generation_;
  wake_.SignalAll();
  while (busy_ > 0) done_.Wait(&mu_);
  job_ = nullptr;
}

void StreamPool::WorkerLoop(int numa_node) {
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
    size_t tasks;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && generation_ == seen) wake_.Wait(&mu_);
      if (stopping_) return;
      seen = generation_;
      job = job_;
      tasks = tasks_;
    }
    for (size_t t = next_task_.fetch_add(1, std::memory_order_relaxed); t < tasks;
         t = next_task_.fetch_add(1, std::memory_order_relaxed)) {
      (*job)(t);
    }
    MutexLock lock(&mu_);
    if (--busy_ == 0) done_.Signal();
  }
}

}  // namespace tiermem::optim
