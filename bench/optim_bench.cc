// The CPU Adam against its roofline and against torch, side by side in one run.
//
// Every figure is the best of its repetitions, taken alike for every row (the machine may be
// shared). For each size: a STREAM-like triad (a = b + s*c over three arrays of N floats) with the
// same threads gives the DRAM bandwidth, STREAM-counted (12 B per element); the roofline of a fused
// AdamW step is 28 B per parameter over it. tiermem's step (tm_adam_step, fp32 gradients) is
// timed at each thread count, and torch.optim.AdamW (foreach=True; fused=True where the torch has
// it) through bench/optim_torch_ref.py under --python (default: $TIERMEM_PYTHON, else the
// python3 on PATH; a run whose Python has no torch says why, and its checks fail). Each row
// prints `check` lines for tools/gpu_check_judge.sh with the CPU Adam's targets: at least 0.8x
// of the roofline (x roof) and at least 3x torch's foreach step (x foreach). With the state on NVMe
// (tm_adam_step_buckets over tensors homed there), the step is set beside max(CPU step,
// state bytes read / read bandwidth + written / write bandwidth), the NVMe bandwidths measured
// over that same state through the same runtime just before each step (medians of the rounds).
// "rd/wr x state": the bytes the steps read from and wrote to NVMe (tm_stats' bytes_moved), over
// the state's bytes: 1.00/1.00 is the least a step can move, and what the bound assumes.
//
// Usage: optim_bench [--sizes=16,64,256] [--threads=1,2] [--reps=5] [--nvme=DIR]
//                    [--nvme_sizes=16,64] [--bucket_m=4] [--depth=2]
//                    [--torch=PATH_TO_optim_torch_ref.py] [--python=PYTHON]
// --sizes= (empty): the NVMe rows alone.
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tiermem/tiermem.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Check(tm_status s, const char* what) {
  if (s != TM_OK) {
    std::fprintf(stderr, "%s: %s: %s\n", what, tm_status_string(s), tm_last_error());
    std::exit(1);
  }
}

// The timed bodies: a STREAM triad (12 B/element, STREAM-counted) and tiermem's fused step
// (28 B/param). They are timed in alternation and the best of each kept, so that both see the
// same moments of a shared machine.
class Triad {
 public:
  Triad(size_t n, int threads)
      : n_(n), threads_(threads), a_(new float[n]), b_(new float[n]), c_(new float[n]) {
    Run([&](size_t lo, size_t hi) {  // first touch by the thread that streams it
      for (size_t i = lo; i < hi; ++i) a_[i] = 0.0f, b_[i] = 1.0f, c_[i] = 2.0f;
    });
  }
  double Time() {
    const double t0 = Now();
    Run([&](size_t lo, size_t hi) {
      float* __restrict pa = a_.get();
      const float* __restrict pb = b_.get();
      const float* __restrict pc = c_.get();
      for (size_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.0f * pc[i];
    });
    return Now() - t0;
  }
  double Bytes() const { return 12.0 * static_cast<double>(n_); }

 private:
  template <typename Body>
  void Run(Body&& body) {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads_; ++t) {
      ts.emplace_back([&, t] { body(n_ * t / threads_, n_ * (t + 1) / threads_); });
    }
    for (auto& t : ts) t.join();
  }
  size_t n_;
  int threads_;
  std::unique_ptr<float[]> a_, b_, c_;
};

class AdamRun {
 public:
  AdamRun(size_t n, int threads) : p_(n, 0.5f), m_(n, 0.0f), v_(n, 0.0f), g_(n, 0.01f) {
    tm_adam_config c = TM_ADAM_CONFIG_INIT;
    c.threads = threads;
    c.numa_node = TM_NUMA_OFF;
    Check(tm_adam_create({0}, &c, &adam_), "tm_adam_create");
    span_ = {p_.data(),    m_.data(), v_.data(),    nullptr, g_.data(),
             TM_DTYPE_F32, nullptr,   TM_DTYPE_F32, n};
  }
  ~AdamRun() { tm_adam_destroy(adam_); }
  double Time() {
    const double t0 = Now();
    Check(tm_adam_step(adam_, ++step_, 1.0f, &span_, 1), "tm_adam_step");
    return Now() - t0;
  }

 private:
  std::vector<float> p_, m_, v_, g_;
  tm_adam adam_{0};
  tm_adam_span span_;
  uint64_t step_ = 0;
};

// Best of `reps` alternated timings (after one warm-up each): {triad bytes/s, adam seconds}.
std::pair<double, double> TriadAndAdam(size_t n, int threads, int reps) {
  // The triad's arrays need only be far larger than the caches: at most 64M floats each.
  Triad triad(std::min<size_t>(n, size_t{64} << 20), threads);
  AdamRun adam(n, threads);
  triad.Time();
  adam.Time();
  double best_triad = 1e30, best_adam = 1e30;
  for (int r = 0; r < reps; ++r) {
    best_triad = std::min(best_triad, triad.Time());
    best_adam = std::min(best_adam, adam.Time());
  }
  return {triad.Bytes() / best_triad, best_adam};
}

double TiermemStep(size_t n, int threads, int reps) {
  AdamRun adam(n, threads);
  adam.Time();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) best = std::min(best, adam.Time());
  return best;
}

struct TorchTimes {
  double foreach = 0, fused = 0;
  std::string fused_note;
  std::string failed;  // why there is no foreach time: the reference's last line of output
};

TorchTimes TorchStep(const std::string& python, const std::string& script, size_t n, int threads,
                     int reps) {
  TorchTimes t;
  const std::string cmd = python + " " + script + " " + std::to_string(n) + " " +
                          std::to_string(threads) + " " + std::to_string(reps) + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) {
    t.failed.append("popen failed: ").append(cmd);
    return t;
  }
  char line[512];
  std::string last;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    std::string l(line);
    while (!l.empty() && (l.back() == '\n' || l.back() == '\r')) l.pop_back();
    if (!l.empty()) last = l;
    if (std::sscanf(line, "foreach %lf", &t.foreach) == 1) continue;
    if (std::sscanf(line, "fused %lf", &t.fused) == 1) continue;
    if (std::strncmp(line, "fused unavailable", 17) == 0) t.fused_note = l.substr(6);
  }
  const int status = pclose(f);
  if (!(t.foreach > 0)) {
    const int code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    // Appended piece by piece: GCC 12 warns (-Wrestrict) on a literal + std::string chain.
    t.failed.append("`").append(cmd, 0, cmd.size() - 5).append("` exited ");
    t.failed.append(std::to_string(code));
    if (!last.empty()) t.failed.append(": ").append(last);
  }
  return t;
}

struct Args {
  std::vector<size_t> sizes_m = {16, 64, 256};
  std::vector<int> threads = {1, 2};
  int reps = 5;
  std::string nvme;
  std::vector<size_t> nvme_sizes_m = {16, 64};
  size_t bucket_m = 4;
  int depth = 2;
  std::string torch = "bench/optim_torch_ref.py";
  std::string python = getenv("TIERMEM_PYTHON") != nullptr && *getenv("TIERMEM_PYTHON") != '\0'
                           ? getenv("TIERMEM_PYTHON")
                           : "python3";
};

template <typename T>
std::vector<T> ParseList(const char* s) {
  std::vector<T> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int64_t x = 0;
    if (!absl::SimpleAtoi(part, &x) || x <= 0) {
      std::fprintf(stderr, "bad list entry '%.*s'\n", static_cast<int>(part.size()), part.data());
      std::exit(2);
    }
    out.push_back(static_cast<T>(x));
  }
  return out;
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const char* s = argv[i];
    if (std::strncmp(s, "--sizes=", 8) == 0) {
      a.sizes_m = s[8] == '\0' ? std::vector<size_t>{} : ParseList<size_t>(s + 8);  // none
    } else if (std::strncmp(s, "--threads=", 10) == 0) {
      a.threads = ParseList<int>(s + 10);
    } else if (std::strncmp(s, "--reps=", 7) == 0) {
      a.reps = std::max(1, std::atoi(s + 7));
    } else if (std::strncmp(s, "--nvme=", 7) == 0) {
      a.nvme = s + 7;
    } else if (std::strncmp(s, "--nvme_sizes=", 13) == 0) {
      a.nvme_sizes_m = ParseList<size_t>(s + 13);
    } else if (std::strncmp(s, "--bucket_m=", 11) == 0) {
      a.bucket_m = static_cast<size_t>(std::max(1, std::atoi(s + 11)));
    } else if (std::strncmp(s, "--depth=", 8) == 0) {
      a.depth = std::max(0, std::atoi(s + 8));
    } else if (std::strncmp(s, "--torch=", 8) == 0) {
      a.torch = s + 8;
    } else if (std::strncmp(s, "--python=", 9) == 0) {
      a.python = s + 9;
    } else {
      std::fprintf(stderr, "unknown flag %s (see the comment at the top of optim_bench.cc)\n", s);
      std::exit(2);
    }
  }
  return a;
}

void NvmeRows(const Args& a);

}  // namespace

int main(int argc, char** argv) {
  const Args a = Parse(argc, argv);
  tm_optim_isa isa;
  tm_optim_isa_get(nullptr, &isa);
  std::printf("CPU Adam, kernel %s, %u hardware threads\n",
              isa == TM_OPTIM_ISA_AVX512 ? "avx512"
              : isa == TM_OPTIM_ISA_AVX2 ? "avx2"
                                         : "baseline",
              std::thread::hardware_concurrency());
  std::printf("%8s %3s %9s %10s %10s %8s %11s %11s %9s %s\n", "params", "thr", "triad GB/s",
              "roofline", "tiermem", "x roof", "torch each", "torch fused", "x foreach",
              "(times: ms per step)");
  for (size_t mega : a.sizes_m) {
    const size_t n = mega << 20;
    for (int t : a.threads) {
      const auto [bw, ours] = TriadAndAdam(n, t, a.reps);
      const double roof = 28.0 * static_cast<double>(n) / bw;
      const TorchTimes tt = TorchStep(a.python, a.torch, n, t, std::max(2, a.reps / 2));
      char fused[32];
      if (tt.fused > 0) {
        std::snprintf(fused, sizeof fused, "%11.1f", tt.fused * 1e3);
      } else {
        std::snprintf(fused, sizeof fused, "%11s", "n/a");
      }
      std::printf("%7zuM %3d %9.2f %10.1f %10.1f %8.2f %11.1f %s %9.2f\n", mega, t, bw / 1e9,
                  roof * 1e3, ours * 1e3, roof / ours, tt.foreach * 1e3, fused,
                  tt.foreach > 0 ? tt.foreach / ours : 0.0);
      if (!tt.fused_note.empty())
        std::printf("          torch fused=True %s\n", tt.fused_note.c_str());
      if (!tt.failed.empty())
        std::printf("          torch reference failed: %s\n", tt.failed.c_str());
      // The targets (tools/gpu_check_judge.sh evaluates these lines): the roofline's 0.8x, torch's
      // foreach step 3x. No torch time is "nan": unparsable, so the judge fails it.
      std::printf("check roofline_%zuM_%dt %.3f >= 0.8\n", mega, t, roof / ours);
      if (tt.foreach > 0) {
        std::printf("check over_torch_foreach_%zuM_%dt %.3f >= 3\n", mega, t, tt.foreach / ours);
      } else {
        std::printf("check over_torch_foreach_%zuM_%dt nan >= 3\n", mega, t);
      }
      if (tt.fused > 0)
        std::printf("info over_torch_fused_%zuM_%dt %.3f\n", mega, t, tt.fused / ours);
      std::fflush(stdout);
    }
  }
  if (!a.nvme.empty()) NvmeRows(a);
  return 0;
}

namespace {

// Fills each bucket's state in DRAM (untimed) and writes it to NVMe, `group` buckets at a time
// (as many as DRAM holds), then reads it back into DRAM `group` buckets at a time (as many as the
// pipeline holds): the NVMe bandwidths over the very state the step moves, timed to the last
// sync. Leaves the state on NVMe only. Returns {read, write} in bytes/s.
std::pair<double, double> MeasureNvme(tm_runtime rt, const std::vector<tm_tensor>& ts,
                                      uint64_t bytes, size_t group) {
  double writing = 0, reading = 0;
  for (size_t b = 0; b < ts.size(); b += group) {
    const size_t e = std::min(ts.size(), b + group);
    for (size_t i = b; i < e; ++i) {
      uint64_t size = 0;
      Check(tm_tensor_bytes(rt, ts[i], &size), "bytes");
      void* p = nullptr;
      Check(tm_tensor_acquire(rt, ts[i], TM_TIER_DRAM, TM_ACCESS_WRITE, nullptr, &p), "acquire");
      std::memset(p, 0, size);
      Check(tm_tensor_release(rt, ts[i], TM_TIER_DRAM), "release");
    }
    const double t0 = Now();
    for (size_t i = b; i < e; ++i) Check(tm_tensor_offload(rt, ts[i], TM_TIER_NVME), "offload");
    Check(tm_runtime_sync(rt), "sync");
    writing += Now() - t0;
  }
  for (size_t b = 0; b < ts.size(); b += group) {
    const size_t e = std::min(ts.size(), b + group);
    const double t0 = Now();
    for (size_t i = b; i < e; ++i) Check(tm_tensor_prefetch(rt, ts[i], TM_TIER_DRAM), "prefetch");
    for (size_t i = b; i < e; ++i) Check(tm_tensor_sync(rt, ts[i]), "sync");
    reading += Now() - t0;
    // NVMe still holds the state: the offload only drops the DRAM copies.
    for (size_t i = b; i < e; ++i) Check(tm_tensor_offload(rt, ts[i], TM_TIER_NVME), "offload");
    Check(tm_runtime_sync(rt), "sync");
  }
  return {static_cast<double>(bytes) / reading, static_cast<double>(bytes) / writing};
}

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One size: `reps` rounds of (bandwidths, step), each step set beside the bound of its own
// round, so that the disk's swings between rounds do not enter the ratio; medians printed.
void NvmeRow(tm_runtime rt, tm_adam adam, const Args& a, size_t mega, double cpu) {
  const size_t bucket = a.bucket_m << 20, n = mega << 20, nb = (n + bucket - 1) / bucket;
  std::vector<float> grad(n, 0.01f);
  std::vector<tm_tensor> ts(nb);
  std::vector<tm_adam_bucket> bs(nb);
  for (size_t b = 0; b < nb; ++b) {
    const size_t cnt = std::min(bucket, n - b * bucket);
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = 12ull * cnt;
    d.cls = TM_CLASS_OPTIMIZER_STATE;
    d.home_tier = TM_TIER_NVME;
    Check(tm_tensor_create(rt, &d, &ts[b]), "tm_tensor_create");
    bs[b] = {ts[b], cnt, grad.data() + b * bucket, TM_DTYPE_F32, nullptr, TM_DTYPE_F32};
  }
  std::vector<double> reads, writes, ios, ours, ratios;
  uint64_t dropped = 0, waits_ns = 0;  // where a step lost its overlap, summed over the rounds
  uint64_t read_bytes = 0, written_bytes = 0;  // NVMe traffic of the steps, against 12 B/param
  for (int r = 0; r < std::max(3, a.reps); ++r) {
    const auto [read_bw, write_bw] =
        MeasureNvme(rt, ts, 12ull * n, static_cast<size_t>(a.depth) + 1);
    tm_stats before = TM_STATS_INIT, after = TM_STATS_INIT;
    Check(tm_runtime_stats(rt, &before), "stats");
    const double t0 = Now();
    size_t done = 0;
    Check(tm_adam_step_buckets(adam, static_cast<uint64_t>(r + 1), 1.0f, bs.data(), nb, &done),
          "tm_adam_step_buckets");
    const double step = Now() - t0;
    Check(tm_runtime_stats(rt, &after), "stats");
    dropped += after.prefetches_dropped - before.prefetches_dropped;
    waits_ns += after.demand_wait_ns - before.demand_wait_ns;
    read_bytes += after.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM] -
                  before.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM];
    written_bytes += after.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME] -
                     before.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME];
    const double io = 12.0 * n / read_bw + 12.0 * n / write_bw;
    reads.push_back(read_bw);
    writes.push_back(write_bw);
    ios.push_back(io);
    ours.push_back(step);
    ratios.push_back(step / std::max(cpu, io));
  }
  const double least = 12.0 * static_cast<double>(n) * static_cast<double>(ratios.size());
  std::printf("%7zuM %10.2f %10.2f %10.1f %10.1f %10.1f %8.2f %6.2f-%.2f %8zu %8.1f %5.2f/%.2f\n",
              mega, MedianOf(reads) / 1e9, MedianOf(writes) / 1e9, cpu * 1e3, MedianOf(ios) * 1e3,
              MedianOf(ours) * 1e3, MedianOf(ratios),
              *std::min_element(ratios.begin(), ratios.end()),
              *std::max_element(ratios.begin(), ratios.end()), static_cast<size_t>(dropped),
              static_cast<double>(waits_ns) / 1e6 / static_cast<double>(ratios.size()),
              static_cast<double>(read_bytes) / least, static_cast<double>(written_bytes) / least);
  std::fflush(stdout);
  for (auto& t : ts) Check(tm_tensor_destroy(rt, t), "destroy");
}

void NvmeRows(const Args& a) {
  const uint64_t bucket_bytes = 12ull * (a.bucket_m << 20);
  const int threads = *std::max_element(a.threads.begin(), a.threads.end());
  size_t most = 0;
  for (size_t m : a.nvme_sizes_m) most = std::max(most, m << 20);
  // Exclusive tiers: every step reads its state from NVMe (inclusive DRAM's clean copies would
  // stand in for some of it), as the bound assumes.
  setenv("TIERMEM_DRAM_INCLUSIVE", "off", 1);
  tm_config c = TM_CONFIG_INIT;
  c.device = TM_DEVICE_EMULATED;
  c.hbm_bytes = 64ull << 20;
  // The pipeline's 2 + 2 x depth buckets (bucket_step.cc), and two more for the staging ring's
  // share and slack (8 at the default depth 2, as before).
  c.dram_bytes = bucket_bytes * (2 * a.depth + 4);
  c.nvme_paths = a.nvme.c_str();
  // The state and its shadow versions (the all-or-nothing step writes the new state aside).
  c.nvme_bytes = 24ull * most + bucket_bytes * 8 + (256ull << 20);
  c.prefetch_depth = a.depth;
  tm_runtime rt{0};
  Check(tm_runtime_create(&c, &rt), "tm_runtime_create");
  tm_info info = TM_INFO_INIT;
  Check(tm_runtime_info(rt, &info), "tm_runtime_info");
  std::printf(
      "\nState on NVMe (%s, %s, O_DIRECT %s; buckets of %zuM params, prefetch depth %d,"
      " %d threads; medians of %d rounds of bandwidths then step)\n",
      a.nvme.c_str(), info.io_engine == TM_IO_ENGINE_URING ? "io_uring" : "posix",
      info.nvme_alignment > 1 ? "on" : "off", a.bucket_m, a.depth, threads, std::max(3, a.reps));
  std::printf("%8s %10s %10s %10s %10s %10s %8s %11s %8s %8s %s\n", "params", "read GB/s",
              "write GB/s", "CPU step", "NVMe I/O", "tiermem", "x bound", "range", "pf drop",
              "wait ms", "rd/wr x state");
  for (size_t mega : a.nvme_sizes_m) {
    const double cpu = TiermemStep(mega << 20, threads, std::max(2, a.reps / 2));
    tm_adam_config ac = TM_ADAM_CONFIG_INIT;
    ac.threads = threads;
    tm_adam adam{0};
    Check(tm_adam_create(rt, &ac, &adam), "tm_adam_create");
    NvmeRow(rt, adam, a, mega, cpu);
    tm_adam_destroy(adam);  // and its shadows
  }
  tm_runtime_destroy(rt);
}

}  // namespace
