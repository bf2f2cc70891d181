// Many threads doing random prefetch / offload / acquire / release / write / destroy on 200
// tensors of mixed sizes, against small budgets, then every byte checked: nothing lost or torn.
// STRESS_SECONDS sets the duration (default 30).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::TempDir;

constexpr int kTensors = 200;
constexpr int kThreads = 8;
constexpr uint64_t kSizes[] = {1, 100, 4095, 4096, 65557, 1 << 20, (2 << 20) + 5};

// The bytes a tensor holds at a version: a function of (slot, version, size).
void Pattern(uint64_t slot, uint64_t version, std::vector<uint8_t>& out) {
  uint64_t x = (slot + 1) * 0x9E3779B97F4A7C15ull ^ (version + 1) * 0xC2B2AE3D27D4EB4Full;
  for (size_t i = 0; i < out.size(); ++i) {
    if (i % 8 == 0) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
    }
    out[i] = static_cast<uint8_t>(x >> (8 * (i % 8)));
  }
}

struct Slot {
  std::shared_mutex mu;  // writers (write, destroy+create) exclusive; readers shared
  tm_tensor tensor{};
  uint64_t bytes = 0;
  uint64_t version = 0;
};

int Seconds() {
  const char* s = std::getenv("STRESS_SECONDS");
  int v = s != nullptr ? std::atoi(s) : 30;
  return v > 0 ? v : 30;
}

bool Allowed(tm_status s) {
  return s == TM_OK || s == TM_ERR_OUT_OF_MEMORY || s == TM_ERR_NO_SPACE || s == TM_ERR_BUSY;
}

TEST(Stress, EightThreadsTwoHundredTensors) {
  TempDir dir;
  tm_config cfg = testing::SmallConfig(dir.path());
  cfg.hbm_bytes = 32 << 20;
  cfg.dram_bytes = 48 << 20;
  cfg.nvme_bytes = 512 << 20;
  cfg.io_block_size = 256 << 10;
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();

  std::vector<Slot> slots(kTensors);
  auto create = [&](int i, std::mt19937_64& rng) {
    Slot& s = slots[i];
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    s.bytes = kSizes[rng() % std::size(kSizes)];
    d.bytes = s.bytes;
    std::string name = "stress-" + std::to_string(i);
    d.name = name.c_str();
    d.home_tier = static_cast<int32_t>(rng() % TM_TIER_COUNT);
    ++s.version;
    std::vector<uint8_t> data(s.bytes);
    Pattern(i, s.version, data);
    // A full HBM or DRAM tier refuses the first write; an NVMe home always has room.
    for (;;) {
      EXPECT_EQ(tm_tensor_create(rt, &d, &s.tensor), TM_OK) << tm_last_error();
      tm_status st = tm_tensor_write(rt, s.tensor, 0, data.data(), s.bytes);
      if (st == TM_OK) break;
      EXPECT_EQ(st, TM_ERR_OUT_OF_MEMORY) << tm_last_error();
      EXPECT_EQ(tm_tensor_destroy(rt, s.tensor), TM_OK);
      ASSERT_NE(d.home_tier, TM_TIER_NVME);
      d.home_tier = TM_TIER_NVME;
    }
  };
  {
    std::mt19937_64 rng(1);
    for (int i = 0; i < kTensors; ++i) {
      create(i, rng);
      EXPECT_EQ(testing::OffloadNow(rt, slots[i].tensor, TM_TIER_NVME), TM_OK) << tm_last_error();
    }
  }

  std::atomic<bool> stop{false};
  std::atomic<int> corrupt{0}, unexpected{0};
  std::atomic<uint64_t> ops[7] = {};  // prefetch, offload, acquire, write, destroy, read, sync
  auto worker = [&](int id) {
    std::mt19937_64 rng(100 + id);
    std::vector<uint8_t> expect, got;
    auto check = [&](tm_status s) {
      if (!Allowed(s)) {
        ++unexpected;
        ADD_FAILURE() << tm_status_string(s) << ": " << tm_last_error();
      }
      return s == TM_OK;
    };
    while (!stop.load()) {
      int i = static_cast<int>(rng() % kTensors);
      Slot& s = slots[i];
      switch (rng() % 10) {
        case 0:
        case 1: {  // prefetch, unlocked: races with everything
          std::shared_lock lock(s.mu);
          check(tm_tensor_prefetch(rt, s.tensor, rng() % 2 ? TM_TIER_HBM : TM_TIER_DRAM));
          ++ops[0];
          break;
        }
        case 2:
        case 3: {  // offload, unlocked
          std::shared_lock lock(s.mu);
          check(tm_tensor_offload(rt, s.tensor, rng() % 2 ? TM_TIER_DRAM : TM_TIER_NVME));
          ++ops[1];
          break;
        }
        case 4:
        case 5: {  // acquire for reading, check, release
          std::shared_lock lock(s.mu);
          tm_tier tier = rng() % 2 ? TM_TIER_HBM : TM_TIER_DRAM;
          void* p = nullptr;
          if (check(tm_tensor_acquire(rt, s.tensor, tier, TM_ACCESS_READ, nullptr, &p))) {
            expect.resize(s.bytes);
            Pattern(i, s.version, expect);
            // The emulated device's memory is host memory: it can be compared directly.
            if (std::memcmp(p, expect.data(), s.bytes) != 0) ++corrupt;
            EXPECT_EQ(tm_tensor_release(rt, s.tensor, tier), TM_OK);
            ++ops[2];
          }
          break;
        }
        case 6: {  // a new version, by write or by write-acquire
          std::unique_lock lock(s.mu);
          expect.resize(s.bytes);
          Pattern(i, s.version + 1, expect);
          if (rng() % 2) {
            if (check(tm_tensor_write(rt, s.tensor, 0, expect.data(), s.bytes))) {
              ++s.version;
              ++ops[3];
            }
          } else {
            tm_tier tier = rng() % 2 ? TM_TIER_HBM : TM_TIER_DRAM;
            void* p = nullptr;
            if (check(tm_tensor_acquire(rt, s.tensor, tier, TM_ACCESS_WRITE, nullptr, &p))) {
              std::memcpy(p, expect.data(), s.bytes);
              ++s.version;
              EXPECT_EQ(tm_tensor_release(rt, s.tensor, tier), TM_OK);
              ++ops[3];
            }
          }
          break;
        }
        case 7: {  // destroy and create again, maybe another size
          std::unique_lock lock(s.mu);
          if (check(tm_tensor_destroy(rt, s.tensor))) {
            create(i, rng);
            ++ops[4];
          }
          break;
        }
        case 8: {  // read a slice through the API
          std::shared_lock lock(s.mu);
          uint64_t off = rng() % s.bytes;
          uint64_t n = 1 + rng() % (s.bytes - off);
          got.resize(n);
          if (check(tm_tensor_read(rt, s.tensor, off, got.data(), n))) {
            expect.resize(s.bytes);
            Pattern(i, s.version, expect);
            if (std::memcmp(got.data(), expect.data() + off, n) != 0) ++corrupt;
            ++ops[5];
          }
          break;
        }
        default: {  // sync: failures of async moves are allowed kinds only
          std::shared_lock lock(s.mu);
          check(tm_tensor_sync(rt, s.tensor));
          ++ops[6];
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  // not ordering: how long the threads race each other (STRESS_SECONDS); what they do is random
  std::this_thread::sleep_for(std::chrono::seconds(Seconds()));
  stop = true;
  for (auto& t : threads) t.join();

  tm_status last = tm_runtime_sync(rt);
  EXPECT_TRUE(Allowed(last)) << tm_last_error();
  // Every byte of every tensor.
  std::vector<uint8_t> expect, got;
  for (int i = 0; i < kTensors; ++i) {
    expect.resize(slots[i].bytes);
    got.assign(slots[i].bytes, 0);
    Pattern(i, slots[i].version, expect);
    ASSERT_EQ(tm_tensor_read(rt, slots[i].tensor, 0, got.data(), got.size()), TM_OK)
        << tm_last_error();
    EXPECT_TRUE(got == expect) << "tensor " << i << " lost or tore its bytes";
  }
  EXPECT_EQ(corrupt.load(), 0);
  EXPECT_EQ(unexpected.load(), 0);
  const char* names[] = {"prefetch", "offload", "acquire", "write", "destroy", "read", "sync"};
  for (int k = 0; k < 7; ++k) {
    EXPECT_GT(ops[k].load(), 0u) << names[k] << " never succeeded";
    std::printf("stress: %-8s %llu\n", names[k], static_cast<unsigned long long>(ops[k].load()));
  }
  tm_stats st = TM_STATS_INIT;
  ASSERT_EQ(tm_runtime_stats(rt, &st), TM_OK);
  std::printf(
      "stress: moved hbm->dram %llu, dram->nvme %llu, nvme->dram %llu, dram->hbm %llu bytes\n",
      static_cast<unsigned long long>(st.bytes_moved[0][1]),
      static_cast<unsigned long long>(st.bytes_moved[1][2]),
      static_cast<unsigned long long>(st.bytes_moved[2][1]),
      static_cast<unsigned long long>(st.bytes_moved[1][0]));
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

}  // namespace
}  // namespace tiermem
