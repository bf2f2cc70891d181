// The schedule: Belady eviction against LRU on a cyclic schedule larger than HBM (by count of
// misses), relearning a departed step, the prefetch knobs doing what the docs say, placement
// presets, and the trace file parsed as JSON with its transfer and stall events, its NVMe tracks
// summing to bytes_moved.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "io/copy_gate.h"
#include "json_check.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::RandomBytes;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

class Scheduled : public ::testing::Test {
 protected:
  // HBM holds 8 of the 12 tensors of 8 MiB; DRAM holds them all.
  tm_config Config() {
    tm_config c = testing::SmallConfig(dir_.path());
    c.hbm_bytes = 64 * kMiB;
    c.dram_bytes = 192 * kMiB;
    c.nvme_bytes = 256 * kMiB;
    return c;
  }
  void Create(tm_runtime rt, int n, uint64_t bytes, tm_tier home) {
    tensors_.clear();
    for (int i = 0; i < n; ++i) {
      tm_tensor_desc d = TM_TENSOR_DESC_INIT;
      d.bytes = bytes;
      d.home_tier = home;
      std::string name = "w" + std::to_string(i);
      d.name = name.c_str();
      tm_tensor t;
      ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK);
      auto data = RandomBytes(bytes, i);
      ASSERT_EQ(tm_tensor_write(rt, t, 0, data.data(), bytes), TM_OK) << tm_last_error();
      tensors_.push_back(t);
    }
  }
  // One pass over the tensors in order: acquire in HBM for reading, release.
  // compute_us: a training step's compute between uses, the time prefetches can hide. With
  // `landed`, the compute lasts until the moves queued so far have landed (tm_runtime_sync), as
  // long compute would: a sleep alone was not long enough under TSan, whose instrumented copies
  // of 8 MiB outlast 20 ms on two loaded cores (Scheduled.PrefetchHidesTransfers failed there).
  void Pass(tm_runtime rt, bool step, int compute_us = 0, bool landed = false) {
    if (step) {
      ASSERT_EQ(tm_step_begin(rt), TM_OK);
    }
    for (tm_tensor t : tensors_) {
      void* p = nullptr;
      ASSERT_EQ(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
          << tm_last_error();
      if (compute_us > 0) {  // not ordering
        std::this_thread::sleep_for(std::chrono::microseconds(compute_us));
      }
      if (landed) {
        ASSERT_EQ(tm_runtime_sync(rt), TM_OK) << tm_last_error();
      }
      ASSERT_EQ(tm_tensor_release(rt, t, TM_TIER_HBM), TM_OK);
    }
    if (step) {
      ASSERT_EQ(tm_step_end(rt), TM_OK);
    }
  }
  tm_stats Stats(tm_runtime rt) {
    tm_stats s = TM_STATS_INIT;
    EXPECT_EQ(tm_runtime_stats(rt, &s), TM_OK);
    return s;
  }
  uint64_t Misses(bool schedule) {
    tm_config c = Config();
    c.prefetch_depth = 0;  // eviction alone
    tm_runtime rt;
    EXPECT_EQ(tm_runtime_create(&c, &rt), TM_OK) << tm_last_error();
    Create(rt, 12, 8 * kMiB, TM_TIER_DRAM);
    Pass(rt, schedule);  // learn (or warm up)
    const uint64_t before = Stats(rt).acquire_misses;
    for (int i = 0; i < 4; ++i) Pass(rt, schedule);
    const tm_stats after = Stats(rt);
    EXPECT_EQ(after.prefetches, 0u);
    EXPECT_EQ(after.schedule_length, schedule ? 12u : 0u);
    EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
    return after.acquire_misses - before;
  }

  TempDir dir_;
  std::vector<tm_tensor> tensors_;
};

TEST_F(Scheduled, BeladyMissesLessThanLru) {
  const uint64_t lru = Misses(false);
  const uint64_t belady = Misses(true);
  std::printf("cyclic 12 tensors, HBM for 8, 4 passes: LRU %llu misses, Belady %llu misses\n",
              static_cast<unsigned long long>(lru), static_cast<unsigned long long>(belady));
  EXPECT_EQ(lru, 48u) << "LRU on a cycle longer than the cache misses every time";
  EXPECT_LT(belady, lru);
  EXPECT_LE(belady, 4u * 5) << "Belady keeps 7 of 12 resident across each pass";
}

TEST_F(Scheduled, DepartedStepIsRelearnedAndStaysCorrect) {
  tm_config c = Config();
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&c, &rt), TM_OK);
  Create(rt, 12, 8 * kMiB, TM_TIER_DRAM);
  Pass(rt, true);
  Pass(rt, true);
  EXPECT_EQ(Stats(rt).schedule_relearned, 0u);
  std::reverse(tensors_.begin(), tensors_.end());
  Pass(rt, true);  // departs
  EXPECT_EQ(Stats(rt).schedule_relearned, 1u);
  Pass(rt, true);  // the new order is the schedule now
  Pass(rt, true);
  EXPECT_EQ(Stats(rt).schedule_relearned, 1u);
  // A step with no uses keeps the schedule: nothing relearned (it counted one).
  ASSERT_EQ(tm_step_begin(rt), TM_OK);
  ASSERT_EQ(tm_step_end(rt), TM_OK);
  EXPECT_EQ(Stats(rt).schedule_relearned, 1u);
  Pass(rt, true);
  EXPECT_EQ(Stats(rt).schedule_relearned, 1u);
  ASSERT_EQ(tm_runtime_sync(rt), TM_OK) << tm_last_error();
  for (size_t i = 0; i < tensors_.size(); ++i) {
    std::vector<uint8_t> back(8 * kMiB);
    ASSERT_EQ(tm_tensor_read(rt, tensors_[i], 0, back.data(), back.size()), TM_OK);
    EXPECT_TRUE(back == RandomBytes(8 * kMiB, 11 - i)) << i;
  }
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

TEST_F(Scheduled, ExplicitScheduleIsReplayed) {
  tm_config c = Config();
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&c, &rt), TM_OK);
  Create(rt, 6, kMiB, TM_TIER_NVME);
  EXPECT_EQ(tm_schedule_set(rt, tensors_.data(), nullptr, tensors_.size()), TM_OK);
  EXPECT_EQ(Stats(rt).schedule_length, 6u);
  ASSERT_EQ(tm_step_begin(rt), TM_OK);
  EXPECT_GT(Stats(rt).prefetches, 0u) << "the first tensors move before the first acquire";
  ASSERT_EQ(tm_step_end(rt), TM_OK);
  tm_tensor bad{0};
  EXPECT_EQ(tm_schedule_set(rt, &bad, nullptr, 1), TM_ERR_INVALID_HANDLE);
  EXPECT_EQ(tm_schedule_set(rt, nullptr, nullptr, 3), TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(tm_step_end(rt), TM_ERR_INVALID_ARGUMENT) << "no step open";
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

// TIERMEM_PREFETCH_DEPTH sets how many scheduled uses are queued ahead; TIERMEM_PREFETCH_BYTES
// bounds the bytes in flight (at least one tensor always moves).
TEST_F(Scheduled, PrefetchKnobs) {
  auto queued_at_step_begin = [&](int32_t depth, uint64_t bytes) {
    tm_config c = Config();
    c.prefetch_depth = depth;
    c.prefetch_bytes = bytes;
    tm_runtime rt;
    EXPECT_EQ(tm_runtime_create(&c, &rt), TM_OK);
    Create(rt, 12, 4 * kMiB, TM_TIER_DRAM);
    EXPECT_EQ(tm_schedule_set(rt, tensors_.data(), nullptr, tensors_.size()), TM_OK);
    // Every prefetch up the link held at its start: none lands (which would let the next one go)
    // before the count is read.
    io::CopyGate held(io::CopyGate::Match().Of(io::CopyDirection::kHostToDevice).Copies(12));
    EXPECT_EQ(tm_step_begin(rt), TM_OK);
    uint64_t queued = Stats(rt).prefetches;
    held.Open();
    EXPECT_EQ(tm_step_end(rt), TM_OK);
    EXPECT_EQ(tm_runtime_sync(rt), TM_OK);
    EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
    return queued;
  };
  EXPECT_EQ(queued_at_step_begin(0, 0), 0u);
  EXPECT_EQ(queued_at_step_begin(1, 0), 1u);
  EXPECT_EQ(queued_at_step_begin(4, 0), 4u);
  EXPECT_EQ(queued_at_step_begin(4, 8 * kMiB), 2u) << "two 4 MiB tensors fill 8 MiB";
  EXPECT_EQ(queued_at_step_begin(4, 1), 1u) << "a bound below one tensor still moves one";
}

// A prefetch held back by TIERMEM_PREFETCH_BYTES goes as soon as the one before it lands, not at
// the caller's next acquire: a framework computing between acquires would leave the link idle
// for the rest of that compute. Here nothing is acquired after tm_step_begin, and the four
// scheduled uses within the depth still all move, one at a time.
TEST_F(Scheduled, PrefetchHeldBackByBytesGoesWhenTheOneBeforeLands) {
  tm_config c = Config();
  c.prefetch_depth = 4;
  c.prefetch_bytes = 8 * kMiB;  // one tensor in flight at a time
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&c, &rt), TM_OK) << tm_last_error();
  Create(rt, 12, 8 * kMiB, TM_TIER_DRAM);
  ASSERT_EQ(tm_schedule_set(rt, tensors_.data(), nullptr, tensors_.size()), TM_OK);
  {
    // The first prefetch held at its start: nothing has landed when the count is read.
    io::CopyGate first(io::CopyGate::Match().Of(io::CopyDirection::kHostToDevice));
    ASSERT_EQ(tm_step_begin(rt), TM_OK);
    ASSERT_TRUE(first.WaitHeld());
    EXPECT_EQ(Stats(rt).prefetches, 1u) << "the byte bound lets one go at first";
  }
  // Nothing is acquired: each landing must let the next go by itself.
  EXPECT_TRUE(testing::WaitUntil([&] {
    return Stats(rt).bytes_moved[TM_TIER_DRAM][TM_TIER_HBM] >= 4 * 8 * kMiB;
  })) << "the prefetches held back by the bytes never went";
  const tm_stats s = Stats(rt);
  EXPECT_EQ(s.prefetches, 4u) << "each landing lets the next use within the depth go";
  EXPECT_EQ(s.bytes_moved[TM_TIER_DRAM][TM_TIER_HBM], 4 * 8 * kMiB);
  for (int i = 0; i < 4; ++i) {
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt, tensors_[i], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK);
    ASSERT_EQ(tm_tensor_release(rt, tensors_[i], TM_TIER_HBM), TM_OK);
  }
  EXPECT_EQ(Stats(rt).acquire_misses, 0u) << "all four were there before their acquires";
  EXPECT_EQ(tm_step_end(rt), TM_OK);
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

// A demand up the link has it to itself: a scheduled prefetch issued while the demand's copy
// runs starts after it, rather than share the link and double the demand's wait (LinkOrder).
// The gate holds the demand's copy (its copy 0) until the prefetch's (copy 1) is enqueued too,
// then lets both go: sharing the link, the smaller prefetch would finish first.
TEST_F(Scheduled, APrefetchIssuedDuringADemandWaitsForIt) {
  tm_config c = Config();
  c.prefetch_depth = 1;
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&c, &rt), TM_OK) << tm_last_error();
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = 16 * kMiB;
  d.home_tier = TM_TIER_DRAM;
  d.name = "demanded";
  tm_tensor demanded;
  ASSERT_EQ(tm_tensor_create(rt, &d, &demanded), TM_OK);
  auto bytes = RandomBytes(d.bytes, 7);
  ASSERT_EQ(tm_tensor_write(rt, demanded, 0, bytes.data(), d.bytes), TM_OK) << tm_last_error();
  Create(rt, 2, 4 * kMiB, TM_TIER_DRAM);  // w0 (in HBM from the start), w1
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt, tensors_[0], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK);
  ASSERT_EQ(tm_tensor_release(rt, tensors_[0], TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_schedule_set(rt, tensors_.data(), nullptr, tensors_.size()), TM_OK);
  ASSERT_EQ(tm_step_begin(rt), TM_OK);  // its first use is in HBM: nothing moves
  const uint64_t before = Stats(rt).bytes_moved[TM_TIER_DRAM][TM_TIER_HBM];
  io::CopyGate gate(
      io::CopyGate::Match().Of(io::CopyDirection::kHostToDevice).AtLeast(4 * kMiB).Copies(2));
  std::thread demand([&] {
    void* q = nullptr;
    EXPECT_EQ(tm_tensor_acquire(rt, demanded, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &q), TM_OK)
        << tm_last_error();
    EXPECT_EQ(std::memcmp(q, bytes.data(), bytes.size()), 0);
    EXPECT_EQ(tm_tensor_release(rt, demanded, TM_TIER_HBM), TM_OK);
  });
  ASSERT_TRUE(gate.WaitHeld(1)) << "the demand's copy was never enqueued";
  // The first scheduled use: its lookahead prefetches w1, used next.
  ASSERT_EQ(tm_tensor_acquire(rt, tensors_[0], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK);
  ASSERT_TRUE(gate.WaitHeld(2)) << "the prefetch of w1 was never enqueued";
  gate.Open();
  demand.join();
  ASSERT_TRUE(gate.WaitCompleted(2));
  EXPECT_EQ(gate.completed(), (std::vector<int>{0, 1}))
      << "the prefetch shared the link with the demand and finished first";
  ASSERT_EQ(tm_tensor_release(rt, tensors_[0], TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_tensor_acquire(rt, tensors_[1], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK);
  auto want = RandomBytes(4 * kMiB, 1);
  EXPECT_EQ(std::memcmp(p, want.data(), want.size()), 0);
  ASSERT_EQ(tm_tensor_release(rt, tensors_[1], TM_TIER_HBM), TM_OK);
  EXPECT_EQ(Stats(rt).bytes_moved[TM_TIER_DRAM][TM_TIER_HBM] - before, 20 * kMiB);
  EXPECT_EQ(tm_step_end(rt), TM_OK);
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

// With compute between acquires long enough for the moves it hides to land, and a capped link,
// prefetching turns misses into hits. (How much, and at what step time, is bench/step_bench's
// business: this checks the direction.)
TEST_F(Scheduled, PrefetchHidesTransfers) {
  auto hits = [&](int32_t depth) {
    tm_config c = Config();
    c.prefetch_depth = depth;
    c.emu_link_gbps = 4;  // 8 MiB in 2 ms
    tm_runtime rt;
    EXPECT_EQ(tm_runtime_create(&c, &rt), TM_OK);
    Create(rt, 12, 8 * kMiB, TM_TIER_DRAM);
    Pass(rt, true);
    const tm_stats before = Stats(rt);
    for (int i = 0; i < 3; ++i) Pass(rt, true, 2000, /*landed=*/true);
    const tm_stats after = Stats(rt);
    EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
    return after.acquire_hits - before.acquire_hits;
  };
  const uint64_t none = 36 - hits(0), two = 36 - hits(2);
  std::printf("misses over 36 acquires: depth 0 -> %llu, depth 2 -> %llu\n",
              static_cast<unsigned long long>(none), static_cast<unsigned long long>(two));
  EXPECT_LT(two, none) << "prefetching must turn misses into hits";
}

TEST_F(Scheduled, PlacementPresets) {
  struct Case {
    tm_placement placement;
    tm_tensor_class cls;
    uint32_t residency;
  } cases[] = {
      {TM_PLACEMENT_NONE, TM_CLASS_PARAM, TM_TIER_BIT(TM_TIER_HBM)},
      {TM_PLACEMENT_ZERO_OFFLOAD, TM_CLASS_OPTIMIZER_STATE, TM_TIER_BIT(TM_TIER_DRAM)},
      {TM_PLACEMENT_ZERO_OFFLOAD, TM_CLASS_PARAM, TM_TIER_BIT(TM_TIER_HBM)},
      {TM_PLACEMENT_ZERO_INFINITY, TM_CLASS_PARAM, TM_TIER_BIT(TM_TIER_NVME)},
      {TM_PLACEMENT_ZERO_INFINITY, TM_CLASS_OPTIMIZER_STATE, TM_TIER_BIT(TM_TIER_NVME)},
      {TM_PLACEMENT_ZERO_INFINITY, TM_CLASS_ACTIVATION, TM_TIER_BIT(TM_TIER_HBM)},
      {TM_PLACEMENT_ACTIVATIONS, TM_CLASS_ACTIVATION, TM_TIER_BIT(TM_TIER_DRAM)},
  };
  for (const Case& k : cases) {
    tm_config c = Config();
    c.placement = k.placement;
    tm_runtime rt;
    ASSERT_EQ(tm_runtime_create(&c, &rt), TM_OK);
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = 10000;
    d.cls = k.cls;
    tm_tensor t;
    ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK);
    auto data = RandomBytes(d.bytes, 1);
    ASSERT_EQ(tm_tensor_write(rt, t, 0, data.data(), d.bytes), TM_OK);
    uint32_t mask = 0;
    ASSERT_EQ(tm_tensor_residency(rt, t, &mask), TM_OK);
    EXPECT_EQ(mask, k.residency) << "placement " << k.placement << " class " << k.cls;
    // A home given at create wins over the preset.
    d.home_tier = TM_TIER_DRAM;
    ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK);
    ASSERT_EQ(tm_tensor_write(rt, t, 0, data.data(), d.bytes), TM_OK);
    ASSERT_EQ(tm_tensor_residency(rt, t, &mask), TM_OK);
    EXPECT_EQ(mask, TM_TIER_BIT(TM_TIER_DRAM));
    EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
  }
}

TEST_F(Scheduled, TraceIsJsonWithTransfersAndStalls) {
  const std::string path = dir_.path() + "/trace.json";
  tm_config c = Config();
  c.trace = path.c_str();
  c.emu_link_gbps = 2;
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&c, &rt), TM_OK);
  Create(rt, 12, 4 * kMiB, TM_TIER_NVME);
  for (int i = 0; i < 3; ++i) Pass(rt, true, 500);
  ASSERT_EQ(tm_runtime_destroy(rt), TM_OK);  // writes the file
  const std::string text = testing::ReadText(path);
  ASSERT_FALSE(text.empty()) << path;
  EXPECT_TRUE(testing::Json(text).Valid()) << text.substr(0, 400);
  EXPECT_NE(text.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(text.find("\"cat\":\"transfer\""), std::string::npos);
  EXPECT_NE(text.find("\"cat\":\"stall\""), std::string::npos);
  EXPECT_NE(text.find("\"nvme->hbm (staged)\""), std::string::npos) << "a named track";
  EXPECT_NE(text.find("\"name\":\"w3\""), std::string::npos);
}

// Every NVMe byte that bytes_moved counts is on the trace's NVMe tracks, whichever path moved it:
// moves (staged or through DRAM), and the caller copies' own staged reads and writes (a whole
// write, a partial one that reads the chunks it covers in part, a read).
TEST_F(Scheduled, TraceNvmeTracksMatchBytesMoved) {
  const std::string path = dir_.path() + "/trace.json";
  tm_config c = Config();
  c.trace = path.c_str();
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&c, &rt), TM_OK);
  Create(rt, 4, 4 * kMiB, TM_TIER_NVME);  // whole writes of tensors on NVMe only
  std::vector<unsigned char> out(4 * kMiB);
  ASSERT_EQ(tm_tensor_write(rt, tensors_[0], 3 * kMiB + 5, out.data(), 1000), TM_OK);
  ASSERT_EQ(tm_tensor_read(rt, tensors_[1], 0, out.data(), out.size()), TM_OK);
  Pass(rt, false);                                  // NVMe -> HBM
  for (tm_tensor t : {tensors_[2], tensors_[3]}) {  // changed in HBM, then offloaded
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt, t, TM_TIER_HBM, TM_ACCESS_READ_WRITE, nullptr, &p), TM_OK);
    ASSERT_EQ(tm_tensor_release(rt, t, TM_TIER_HBM), TM_OK);
  }
  ASSERT_EQ(tm_tensor_offload(rt, tensors_[2], TM_TIER_DRAM), TM_OK);
  ASSERT_EQ(tm_tensor_offload(rt, tensors_[2], TM_TIER_NVME), TM_OK);  // through DRAM
  ASSERT_EQ(tm_tensor_offload(rt, tensors_[3], TM_TIER_NVME), TM_OK);
  ASSERT_EQ(tm_runtime_sync(rt), TM_OK);
  tm_stats st = TM_STATS_INIT;
  ASSERT_EQ(tm_runtime_stats(rt, &st), TM_OK);
  ASSERT_EQ(tm_runtime_destroy(rt), TM_OK);
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  std::map<int, std::string> track;
  std::map<std::string, uint64_t> bytes;
  for (std::string line; std::getline(f, line);) {
    int tid = 0;
    const size_t at = line.find("\"tid\":");
    if (at == std::string::npos || std::sscanf(line.c_str() + at, "\"tid\":%d", &tid) != 1)
      continue;
    if (line.find("\"thread_name\"") != std::string::npos) {
      const size_t n = line.find("{\"name\":\"");
      ASSERT_NE(n, std::string::npos) << line;
      track[tid] = line.substr(n + 9, line.find('"', n + 9) - (n + 9));
      continue;
    }
    unsigned long long b = 0;
    const size_t a = line.find("\"bytes\":");
    if (a != std::string::npos && std::sscanf(line.c_str() + a, "\"bytes\":%llu", &b) == 1) {
      bytes[track[tid]] += b;
    }
  }
  EXPECT_GT(bytes["nvme write"], 4 * 4 * kMiB);  // the writes, the partial one, the offloads
  EXPECT_GT(bytes["nvme read"], 4 * kMiB);       // the read, the partial write's chunk
  EXPECT_EQ(bytes["nvme write"] + bytes["hbm->nvme (staged)"],
            st.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME]);
  EXPECT_EQ(bytes["nvme read"] + bytes["nvme->hbm (staged)"],
            st.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM]);
}

}  // namespace
}  // namespace tiermem
