// A pool of worker threads bound to the cores of one NUMA node (the DRAM tier's), for kernels
// that stream memory bound there. Work is handed out as numbered tasks (tiles): each thread
// starts on a contiguous share of them (one stream per thread through memory, as a static
// split gives: with tiles dealt in turn from one counter, two threads interleaving 64 KiB tiles
// stepped 64M parameters ~15-20% slower when the host had bandwidth to spare), and a thread
// that finishes its share takes the tiles left in the others', so a slow or descheduled worker
// holds up no one; any thread count works, more threads than cores included.
//
// The calling thread takes tiles too where its memory is as near as the workers' (the pool is
// unbound, or the machine has one NUMA node): `threads` counts it, so one thread steps on the
// caller alone, without a hand-off. A Run returns once every tile is done and no worker is
// still inside it: a worker that has not woken by then (its core busy with another process)
// is not waited for, and finds nothing left when it does wake.
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

  // The threads that take tiles: the workers, and the caller where it joins them.
  int threads() const { return static_cast<int>(workers_.size()) + (caller_works_ ? 1 : 0); }
  int numa_node() const { return numa_node_; }
  // Whether the calling thread of Run takes tiles too.
  bool caller_works() const { return caller_works_; }
  // Runs fn(task) for each task in [0, tasks) on the workers (and the caller) and returns when
  // all are done. Calls are serialized.
  void Run(size_t tasks, absl::FunctionRef<void(size_t)> fn);

 private:
  StreamPool() = default;
  void WorkerLoop(int share, int numa_node);
  // Runs the tasks of share `share`, then those left in the others'; returns how many it ran.
  size_t TakeTasks(const absl::FunctionRef<void(size_t)>& job, int share);

  // One thread's share of the tasks: [next, end), `next` taken by whoever runs the task.
  struct alignas(64) Share {
    std::atomic<size_t> next{0};
    size_t end = 0;
  };

  int numa_node_ = -1;
  bool caller_works_ = false;
  Mutex run_mu_;  // one Run at a time
  Mutex mu_;
  CondVar wake_;
  CondVar done_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Workers inside the current job (they read job_ and the counter): Run waits for them.
  int inside_ ABSL_GUARDED_BY(mu_) = 0;
  // Tasks of the current job finished so far.
  size_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  // The current job; null between Runs, so that a worker waking late takes nothing.
  const absl::FunctionRef<void(size_t)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  size_t tasks_ ABSL_GUARDED_BY(mu_) = 0;
  // One per thread that takes tiles (the caller's first where it works); set by Run while no
  // worker is inside a job, read by those inside it.
  std::unique_ptr<Share[]> shares_;
  int share_count_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace tiermem::optim
