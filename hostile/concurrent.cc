// Hostile probe: threads doing copy_in/copy_out on their own and on shared tensors, mixed with
// offload/prefetch/acquire/destroy/sync under tight budgets: data never lost or torn, no hang.
#include <atomic>
#include <mutex>
#include <random>
#include <thread>

#include "common.h"

static const uint64_t kBytes = 65536 + 24;  // not a multiple of anything nice
static tm_runtime rt;
static std::atomic<int> unexpected{0}, torn{0}, lost{0};
static std::atomic<long> ops{0};
static std::mutex print_mu;

static void fill_version(std::vector<uint64_t>& v, uint64_t tag) {
  for (auto& w : v) w = tag;
}
static bool allowed(tm_status s) {
  return s == TM_OK || s == TM_ERR_BUSY || s == TM_ERR_OUT_OF_MEMORY || s == TM_ERR_INVALID_HANDLE;
}
static void note(const char* what, tm_status s) {
  if (!allowed(s)) {
    std::lock_guard<std::mutex> g(print_mu);
    if (unexpected++ < 10)
      printf("UNEXPECTED %s -> %s: %s\n", what, tm_status_string(s), tm_last_error());
  }
}

// A thread's own tensors: exact contents are known.
static void owner(int id, int iters) {
  std::mt19937 rng(id);
  const int n = 3;
  tm_tensor ts[n];
  uint64_t ver[n] = {0};
  std::vector<uint64_t> buf(kBytes / 8), out(kBytes / 8);
  for (int i = 0; i < n; i++) {
    char name[32];
    snprintf(name, sizeof name, "own%d.%d", id, i);
    ts[i] = make_t(rt, kBytes, i % 3, (id % 2) ? name : nullptr);
  }
  for (int it = 0; it < iters; it++) {
    int i = rng() % n;
    switch (rng() % 6) {
      case 0:
      case 1: {
        uint64_t tag = ((uint64_t)id << 48) | ((uint64_t)i << 40) | (ver[i] + 1);
        fill_version(buf, tag);
        tm_status s = tm_tensor_copy_in(rt, ts[i], 0, buf.data(), kBytes, nullptr);
        note("owner copy_in", s);
        tm_status s2 = tm_tensor_sync(rt, ts[i]);
        note("owner sync after copy_in", s2);
        if (s == TM_OK && s2 == TM_OK) ver[i]++;
        break;
      }
      case 2: {
        std::fill(out.begin(), out.end(), 0xEEEEEEEEEEEEEEEEull);
        uint64_t off = (rng() % 16) * 8;
        tm_status s = tm_tensor_copy_out(rt, ts[i], off, out.data(), kBytes - off, nullptr);
        note("owner copy_out", s);
        tm_status s2 = tm_tensor_sync(rt, ts[i]);
        note("owner sync after copy_out", s2);
        if (s == TM_OK && s2 == TM_OK) {
          uint64_t want = ver[i] ? (((uint64_t)id << 48) | ((uint64_t)i << 40) | ver[i]) : 0;
          for (size_t w = 0; w < (kBytes - off) / 8; w++) {
            if (out[w] != want) {
              std::lock_guard<std::mutex> g(print_mu);
              uint64_t got = out[w];
              usleep(20000);
              if (lost++ < 10)
                printf(
                    "LOST owner %d tensor %d home %d off %llu word %zu: want %llx got %llx; 20 ms "
                    "later %llx\n",
                    id, i, i % 3, (unsigned long long)off, w, (unsigned long long)want,
                    (unsigned long long)got, (unsigned long long)out[w]);
              break;
            }
          }
        }
        break;
      }
      case 3:
        note("owner offload", tm_tensor_offload(rt, ts[i], (tm_tier)(1 + rng() % 2)));
        break;
      case 4:
        note("owner prefetch", tm_tensor_prefetch(rt, ts[i], (tm_tier)(rng() % 2)));
        break;
      case 5: {
        void* p;
        tm_tier tier = (tm_tier)(rng() % 2);
        tm_status s = tm_tensor_acquire(rt, ts[i], tier, TM_ACCESS_READ, nullptr, &p);
        note("owner acquire", s);
        if (s == TM_OK) {
          uint64_t want = ver[i] ? (((uint64_t)id << 48) | ((uint64_t)i << 40) | ver[i]) : 0;
          if (((uint64_t*)p)[0] != want || ((uint64_t*)p)[kBytes / 8 - 1] != want) {
            std::lock_guard<std::mutex> g(print_mu);
            if (lost++ < 10)
              printf("LOST owner %d acquire tensor %d: want %llx got %llx\n", id, i,
                     (unsigned long long)want, (unsigned long long)((uint64_t*)p)[0]);
          }
          if (rng() % 2)
            note("owner release", tm_tensor_release(rt, ts[i], tier));
          else
            note("owner release_on_stream", tm_tensor_release_on_stream(rt, ts[i], tier, (void*)1));
        }
        break;
      }
    }
    ops++;
  }
  for (int i = 0; i < n; i++) note("owner destroy", tm_tensor_destroy(rt, ts[i]));
}

// Shared tensors: any thread writes whole versions; reads must see one version, never a mix.
static const int kShared = 4;
static std::atomic<uint64_t> shared_bits[kShared];
static void chaos(int id, int iters) {
  std::mt19937 rng(1000 + id);
  std::vector<uint64_t> buf(kBytes / 8), out(kBytes / 8);
  for (int it = 0; it < iters; it++) {
    int i = rng() % kShared;
    tm_tensor t = {shared_bits[i].load()};
    static int mask = getenv("CHAOS_MASK") ? atoi(getenv("CHAOS_MASK")) : 255;
    int op = rng() % 8;
    if (!(mask & (1 << op))) continue;
    switch (op) {
      case 0:
      case 1: {
        fill_version(buf, ((uint64_t)(100 + id) << 48) | it);
        note("chaos copy_in", tm_tensor_copy_in(rt, t, 0, buf.data(), kBytes, nullptr));
        note("chaos sync", tm_tensor_sync(rt, t));  // buf must live until then
        break;
      }
      case 2: {
        tm_status s = tm_tensor_copy_out(rt, t, 0, out.data(), kBytes, nullptr);
        note("chaos copy_out", s);
        tm_status s2 = tm_tensor_sync(rt, t);
        note("chaos sync", s2);
        if (s == TM_OK && s2 == TM_OK) {
          for (size_t w = 1; w < kBytes / 8; w++) {
            if (out[w] != out[0]) {
              std::lock_guard<std::mutex> g(print_mu);
              if (torn++ < 5)
                printf("TORN shared %d word %zu: %llx vs word 0 %llx\n", i, w,
                       (unsigned long long)out[w], (unsigned long long)out[0]);
              break;
            }
          }
        }
        break;
      }
      case 3:
        note("chaos offload", tm_tensor_offload(rt, t, (tm_tier)(1 + rng() % 2)));
        break;
      case 4:
        note("chaos prefetch", tm_tensor_prefetch(rt, t, (tm_tier)(rng() % 2)));
        break;
      case 5: {
        void* p;
        tm_tier tier = (tm_tier)(rng() % 2);
        tm_status s = tm_tensor_acquire(rt, t, tier, TM_ACCESS_READ, nullptr, &p);
        note("chaos acquire", s);
        if (s == TM_OK) note("chaos release", tm_tensor_release(rt, t, tier));
        break;
      }
      case 6: {  // destroy and replace with a fresh tensor (named or not)
        tm_status s = tm_tensor_destroy(rt, t);
        note("chaos destroy", s);
        if (s == TM_OK) {
          char name[32];
          snprintf(name, sizeof name, "shared%d", i);
          tm_tensor n = make_t(rt, kBytes, rng() % 3, (rng() % 2) ? name : nullptr);
          uint64_t expect = t.bits;
          if (!shared_bits[i].compare_exchange_strong(expect, n.bits)) tm_tensor_destroy(rt, n);
        }
        break;
      }
      case 7: {
        tm_status s = tm_runtime_sync(rt);
        if (s) {
          std::lock_guard<std::mutex> g(print_mu);
          printf("chaos runtime_sync -> %s: %s\n", tm_status_string(s), tm_last_error());
        }
        break;
      }
    }
    ops++;
  }
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 400;
  int owners = argc > 2 ? atoi(argv[2]) : 4;
  int chaoses = argc > 3 ? atoi(argv[3]) : 3;
  uint64_t hbm = argc > 4 ? strtoull(argv[4], 0, 0) : 3 * 65792;
  uint64_t dram = argc > 5 ? strtoull(argv[5], 0, 0) : 4 << 20;
  rt = make_rt(hbm, dram, 32 << 20);
  if (!rt.bits) return 2;
  for (int i = 0; i < kShared; i++) shared_bits[i] = make_t(rt, kBytes, i % 3).bits;
  std::vector<std::thread> th;
  for (int i = 0; i < owners; i++) th.emplace_back(owner, i, iters);
  for (int i = 0; i < chaoses; i++) th.emplace_back(chaos, i, iters);
  std::thread step([&] {
    for (int i = 0; i < 50; i++) {
      tm_status s = tm_step_begin(rt);
      if (s != TM_OK && s != TM_ERR_INVALID_ARGUMENT) note("step_begin", s);
      usleep(2000);
      s = tm_step_end(rt);
      if (s != TM_OK && s != TM_ERR_INVALID_ARGUMENT) note("step_end", s);
    }
  });
  for (auto& t : th) t.join();
  step.join();
  note("final runtime_sync", tm_runtime_sync(rt));
  for (int i = 0; i < kShared; i++)
    note("final destroy", tm_tensor_destroy(rt, tm_tensor{shared_bits[i]}));
  tm_runtime_sync(rt);
  tm_stats st = TM_STATS_INIT;
  tm_runtime_stats(rt, &st);
  printf("ops %ld, tensors left %llu, used hbm %llu dram %llu nvme %llu, moves_failed %llu\n",
         (long)ops, (unsigned long long)st.tensors, (unsigned long long)st.tiers[0].used,
         (unsigned long long)st.tiers[1].used, (unsigned long long)st.tiers[2].used,
         (unsigned long long)st.moves_failed);
  CHECK(st.tensors == 0, "tensors left");
  CHECK(unexpected == 0 && lost == 0 && torn == 0, "unexpected %d lost %d torn %d", (int)unexpected,
        (int)lost, (int)torn);
  EXPECT_ST(tm_runtime_destroy(rt), TM_OK);
  return finish("concurrent");
}
