// A pool of worker threads bound to the cores of one NUMA node (the DRAM tier's), for kernels
// that stream memory bound there. Work is handed out as numbered tasks (tiles) from a shared
// counter, so a slow or descheduled worker holds up no one; any thread count works, more
// threads than cores included.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "io/sync.h"

namespace tiermem::optim {

class StreamPool {
 public:
  // `numa_node` < 0: workers are not bound. Binding that fails is logged, not fatal.
  static absl::StatusOr<std::unique_ptr<StreamPool>> Create(int threads, int numa_node);
  ~StreamPool();
  StreamPool(const StreamPool&) = delete;
  StreamPool& operator=(const StreamPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()); }
  int numa_node() const { return numa_node_; }
  // Runs fn(task) for each task in [0, tasks) on the workers and returns when all are done.
  // Calls are serialized.
  void Run(size_t tasks, absl::FunctionRef<void(size_t)> fn);

 private:
  StreamPool() = default;
  void WorkerLoop(int numa_node);

  int numa_node_ = -1;
  Mutex run_mu_;  // one Run at a time
  Mutex mu_;
  CondVar wake_;
  CondVar done_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int busy_ ABSL_GUARDED_BY(mu_) = 0;
  // The job of the current generation; read by workers after they saw the generation change.
  const absl::FunctionRef<void(size_t)>* job_ = nullptr;
  size_t tasks_ = 0;
  std::atomic<size_t> next_task_{0};
  std::vector<std::thread> workers_;
};

}  // namespace tiermem::optim
