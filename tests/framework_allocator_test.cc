// The framework's device allocator (tm_config.device_alloc / device_free) on the emulated device:
// every allocation matched by a free (eviction, destroy, runtime destroy), the HBM budget held
// through the callbacks under pressure, bytes bit-exact, a failing callback reported and the
// tensor kept, evict-and-retry, the counted TierSpace and its eviction order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "lib/policy/eviction.h"
#include "lib/tiers/tier_space.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

// The default tiers (inclusive DRAM) but where a test needs its bytes to come back from NVMe
// itself, for which inclusive DRAM's clean copies would stand in (tests/inclusive_test.cc).

namespace tiermem {
namespace {

using testing::RandomBytes;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

// A framework's allocator that counts: what is outstanding, the peak, and every call that broke
// the contract (a wrong user pointer, device or stream; a free of memory it did not give out, or
// with another size). `cap` is its own limit (the GPU's memory as the framework sees it).
class CountingAllocator {
 public:
  CountingAllocator() {
    std::lock_guard<std::mutex> lock(registry_mu());
    registry().insert(this);
  }
  ~CountingAllocator() {
    std::lock_guard<std::mutex> lock(registry_mu());
    registry().erase(this);
  }

  static void* Alloc(void* user, size_t bytes, int32_t device, void* stream) {
    CountingAllocator* a = Known(user);
    if (a == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(a->mu_);
    ++a->calls;
    if (device != -1 || stream != nullptr || bytes == 0) ++a->contract_broken;
    if (a->fail || a->outstanding + bytes > a->cap) {
      ++a->failed;
      return nullptr;
    }
    void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (p == nullptr) return nullptr;
    a->live[p] = bytes;
    ++a->allocs;
    a->outstanding += bytes;
    a->peak = std::max(a->peak, a->outstanding);
    return p;
  }
  static void Free(void* user, void* ptr, size_t bytes, int32_t device, void* stream) {
    CountingAllocator* a = Known(user);
    if (a == nullptr) return;
    std::lock_guard<std::mutex> lock(a->mu_);
    if (device != -1 || stream != nullptr) ++a->contract_broken;
    auto it = a->live.find(ptr);
    if (it == a->live.end() || it->second != bytes) {
      ++a->contract_broken;  // not ours, freed twice, or another size: never free it
      return;
    }
    a->live.erase(it);
    ++a->frees;
    a->outstanding -= bytes;
    std::free(ptr);
  }

  void Wire(tm_config& c) {
    c.device_alloc = &CountingAllocator::Alloc;
    c.device_free = &CountingAllocator::Free;
    c.device_allocator_user = this;
  }
  bool Live(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    return live.count(const_cast<void*>(p)) > 0;
  }
  // Counters, read by the test between calls into tiermem.
  struct Snapshot {
    uint64_t allocs, frees, outstanding, peak, failed, calls, contract_broken;
  };
  Snapshot Now() {
    std::lock_guard<std::mutex> lock(mu_);
    return {allocs, frees, outstanding, peak, failed, calls, contract_broken};
  }
  void SetFail(bool f) {
    std::lock_guard<std::mutex> lock(mu_);
    fail = f;
  }
  void SetCap(uint64_t c) {
    std::lock_guard<std::mutex> lock(mu_);
    cap = c;
  }
  // Calls whose user pointer was no live CountingAllocator.
  static int WrongUser() { return wrong_user(); }

 private:
  static std::mutex& registry_mu() {
    static std::mutex m;
    return m;
  }
  static std::set<CountingAllocator*>& registry() {
    static std::set<CountingAllocator*> r;
    return r;
  }
  static int& wrong_user() {
    static int n = 0;
    return n;
  }
  static CountingAllocator* Known(void* user) {
    std::lock_guard<std::mutex> lock(registry_mu());
    auto* a = static_cast<CountingAllocator*>(user);
    if (registry().count(a) == 0) {
      ++wrong_user();
      return nullptr;
    }
    return a;
  }

  std::mutex mu_;
  std::map<void*, size_t> live;
  uint64_t allocs = 0, frees = 0, outstanding = 0, peak = 0, failed = 0, calls = 0;
  uint64_t contract_broken = 0;
  uint64_t cap = UINT64_MAX;
  bool fail = false;
};

class Allocator : public ::testing::Test {
 public:
  void Open(uint64_t hbm_bytes, int prefetch_depth = 0) {
    tm_config c = testing::SmallConfig(dir_.path());
    c.hbm_bytes = hbm_bytes;
    c.prefetch_depth = prefetch_depth;
    c.log_level = TM_LOG_ERROR;
    alloc_.Wire(c);
    ASSERT_EQ(tm_runtime_create(&c, &rt_), TM_OK) << tm_last_error();
  }
  void Close() {
    if (rt_.bits != 0) {
      TM_ASSERT_OK(tm_runtime_destroy(rt_));
    }
    rt_ = tm_runtime{0};
  }
  void TearDown() override {
    Close();
    const auto n = alloc_.Now();
    EXPECT_EQ(n.allocs, n.frees) << "every allocation is given back by runtime destroy";
    EXPECT_EQ(n.outstanding, 0u);
    EXPECT_EQ(n.contract_broken, 0u) << "a wrong device/stream, or a bad free";
    EXPECT_EQ(CountingAllocator::WrongUser(), 0) << "the user pointer was not passed through";
  }
  tm_tensor Make(uint64_t bytes, const char* name, int home = TM_TIER_HBM) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = bytes;
    d.name = name;
    d.home_tier = home;
    tm_tensor t{0};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    return t;
  }
  uint32_t Residency(tm_tensor t) {
    uint32_t mask = 0;
    EXPECT_EQ(tm_tensor_residency(rt_, t, &mask), TM_OK) << tm_last_error();
    return mask;
  }
  tm_stats Stats() {
    tm_stats s = TM_STATS_INIT;
    EXPECT_EQ(tm_runtime_stats(rt_, &s), TM_OK) << tm_last_error();
    return s;
  }
  std::vector<uint8_t> Read(tm_tensor t, uint64_t bytes) {
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(tm_tensor_read(rt_, t, 0, out.data(), bytes), TM_OK) << tm_last_error();
    return out;
  }

 protected:
  TempDir dir_;
  CountingAllocator alloc_;
  tm_runtime rt_{0};
};

constexpr uint32_t Bit(tm_tier t) { return 1u << t; }

TEST_F(Allocator, InfoSaysSoAndNoSlabIsTaken) {
  Open(8 * kMiB);
  tm_info info = TM_INFO_INIT;
  TM_ASSERT_OK(tm_runtime_info(rt_, &info));
  EXPECT_EQ(info.device_allocator, 1);
  EXPECT_EQ(info.tier_bytes[TM_TIER_HBM], 8 * kMiB);  // the budget stays tiermem's
  EXPECT_EQ(alloc_.Now().calls, 0u) << "nothing is asked for before a copy needs it";
}

TEST(AllocatorConfig, InfoWithoutHooksIsZero) {
  TempDir dir;
  tm_config c = testing::SmallConfig(dir.path());
  tm_runtime rt{0};
  ASSERT_EQ(tm_runtime_create(&c, &rt), TM_OK) << tm_last_error();
  tm_info info = TM_INFO_INIT;
  EXPECT_EQ(tm_runtime_info(rt, &info), TM_OK);
  EXPECT_EQ(info.device_allocator, 0);
  tm_runtime_destroy(rt);
}

TEST(AllocatorConfig, OnlyOneCallbackIsAConfigError) {
  TempDir dir;
  for (int which = 0; which < 2; ++which) {
    tm_config c = testing::SmallConfig(dir.path());
    if (which == 0) {
      c.device_alloc = &CountingAllocator::Alloc;
    } else {
      c.device_free = &CountingAllocator::Free;
    }
    tm_runtime rt{0};
    EXPECT_EQ(tm_runtime_create(&c, &rt), TM_ERR_CONFIG) << which;
    EXPECT_NE(std::string(tm_last_error()).find("device_alloc"), std::string::npos)
        << tm_last_error();
    EXPECT_EQ(rt.bits, 0u);
  }
}

TEST_F(Allocator, EachCopyIsAllocatedAndFreedOnOffloadEvictionAndDestroy) {
  Open(2 * kMiB);
  const uint64_t n = kMiB - 1;  // rounded to 1 MiB: two fit in the budget
  const auto a = RandomBytes(n, 1), b = RandomBytes(n, 2), c = RandomBytes(n, 3);
  tm_tensor ta = Make(n, "a"), tb = Make(n, "b"), tc = Make(n, "c");
  TM_ASSERT_OK(tm_tensor_write(rt_, ta, 0, a.data(), n));
  TM_ASSERT_OK(tm_tensor_write(rt_, tb, 0, b.data(), n));
  auto s = alloc_.Now();
  EXPECT_EQ(s.allocs, 2u);
  EXPECT_EQ(s.outstanding, 2 * kMiB) << "asked for whole granules";
  EXPECT_EQ(Stats().tiers[TM_TIER_HBM].used, 2 * kMiB);

  // The budget is full: c evicts the copy used least recently (a), which is given back.
  TM_ASSERT_OK(tm_tensor_write(rt_, tc, 0, c.data(), n));
  s = alloc_.Now();
  EXPECT_EQ(s.allocs, 3u);
  EXPECT_EQ(s.frees, 1u);
  EXPECT_EQ(Residency(ta), Bit(TM_TIER_DRAM));
  const tm_stats st = Stats();
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_EQ(st.fragmentation_evictions, 0u);

  // An offload frees the HBM copy once the lower one is written.
  TM_ASSERT_OK(testing::OffloadNow(rt_, tb, TM_TIER_DRAM));
  EXPECT_EQ(alloc_.Now().frees, 2u);
  // Destroy frees it.
  TM_ASSERT_OK(tm_tensor_destroy(rt_, tc));
  s = alloc_.Now();
  EXPECT_EQ(s.frees, 3u);
  EXPECT_EQ(s.outstanding, 0u);
  EXPECT_EQ(Stats().tiers[TM_TIER_HBM].used, 0u);

  EXPECT_EQ(Read(ta, n), a);
  EXPECT_EQ(Read(tb, n), b);
}

TEST_F(Allocator, RuntimeDestroyGivesBackWhatTensorsStillHold) {
  Open(8 * kMiB);
  for (int i = 0; i < 5; ++i) {
    const auto bytes = RandomBytes(100000 + i, i);
    tm_tensor t = Make(bytes.size(), "kept");
    TM_ASSERT_OK(tm_tensor_write(rt_, t, 0, bytes.data(), bytes.size()));
  }
  EXPECT_EQ(alloc_.Now().allocs, 5u);
  EXPECT_EQ(alloc_.Now().frees, 0u);
  Close();
  const auto s = alloc_.Now();
  EXPECT_EQ(s.frees, 5u);
  EXPECT_EQ(s.outstanding, 0u);
}

TEST_F(Allocator, BytesRoundTripThroughHbmFromTheCallbacks) {
  testing::ScopedEnv exclusive("TIERMEM_DRAM_INCLUSIVE", "off");  // the bytes come from NVMe
  Open(8 * kMiB);
  for (uint64_t n :
       {uint64_t{1}, uint64_t{255}, uint64_t{256}, uint64_t{257}, uint64_t{4099}, kMiB + 7}) {
    SCOPED_TRACE(n);
    const auto bytes = RandomBytes(n, n);
    tm_tensor t = Make(n, "rt");
    TM_ASSERT_OK(tm_tensor_write(rt_, t, 0, bytes.data(), n));
    TM_ASSERT_OK(testing::OffloadNow(rt_, t, TM_TIER_NVME));
    EXPECT_EQ(Residency(t), Bit(TM_TIER_NVME));
    void* p = nullptr;
    TM_ASSERT_OK(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
    EXPECT_TRUE(alloc_.Live(p)) << "the HBM copy is the callback's memory";
    EXPECT_EQ(std::memcmp(p, bytes.data(), n), 0);  // emulated: host memory
    TM_ASSERT_OK(tm_tensor_release(rt_, t, TM_TIER_HBM));
    TM_ASSERT_OK(testing::OffloadNow(rt_, t, TM_TIER_DRAM));
    EXPECT_EQ(Read(t, n), bytes);
    TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
  }
  const auto s = alloc_.Now();
  EXPECT_EQ(s.allocs, s.frees);
}

TEST_F(Allocator, FreeBytesAnywhereSufficeWithoutEviction) {
  // With a slab, two 1 MiB holes around b would not hold 2 MiB (a fragmentation eviction);
  // memory per copy has no holes.
  Open(3 * kMiB);
  tm_tensor ta = Make(kMiB, "a"), tb = Make(kMiB, "b"), tc = Make(kMiB, "c");
  const auto bytes = RandomBytes(kMiB, 9);
  for (tm_tensor t : {ta, tb, tc}) {
    TM_ASSERT_OK(tm_tensor_write(rt_, t, 0, bytes.data(), kMiB));
  }
  TM_ASSERT_OK(tm_tensor_destroy(rt_, ta));
  TM_ASSERT_OK(tm_tensor_destroy(rt_, tc));
  const auto big = RandomBytes(2 * kMiB, 10);
  tm_tensor td = Make(2 * kMiB, "d");
  TM_ASSERT_OK(tm_tensor_write(rt_, td, 0, big.data(), big.size()));
  const tm_stats s = Stats();
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.fragmentation_evictions, 0u);
  EXPECT_EQ(Residency(tb), Bit(TM_TIER_HBM));
  EXPECT_EQ(Read(td, big.size()), big);
}

TEST_F(Allocator, APinnedCopyIsNoWallBetweenVictims) {
  // a, b, c fill the budget, b is acquired: with a slab it splits the tier into two 1 MiB runs
  // and 2 MiB could never fit; with memory per copy, evicting a and c makes room.
  Open(3 * kMiB);
  tm_tensor ta = Make(kMiB, "a"), tb = Make(kMiB, "b"), tc = Make(kMiB, "c");
  const auto bytes = RandomBytes(kMiB, 11);
  for (tm_tensor t : {ta, tb, tc}) {
    TM_ASSERT_OK(tm_tensor_write(rt_, t, 0, bytes.data(), kMiB));
  }
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, tb, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  const auto big = RandomBytes(2 * kMiB, 12);
  tm_tensor td = Make(2 * kMiB, "d");
  TM_ASSERT_OK(tm_tensor_write(rt_, td, 0, big.data(), big.size()));
  const tm_stats s = Stats();
  EXPECT_EQ(s.evictions, 2u);
  EXPECT_EQ(s.fragmentation_evictions, 0u);
  EXPECT_EQ(Residency(ta), Bit(TM_TIER_DRAM));
  EXPECT_EQ(Residency(tc), Bit(TM_TIER_DRAM));
  TM_ASSERT_OK(tm_tensor_release(rt_, tb, TM_TIER_HBM));
  EXPECT_EQ(Read(ta, kMiB), bytes);
  EXPECT_EQ(Read(td, big.size()), big);
}

TEST_F(Allocator, BudgetHeldUnderPressureWithOddSizesAndFreshHandles) {
  const uint64_t budget = 3 * kMiB + 1000;
  Open(budget, /*prefetch_depth=*/2);
  std::mt19937_64 rng(42);
  struct Live {
    tm_tensor t;
    std::vector<uint8_t> bytes;
  };
  std::vector<Live> live;
  for (int i = 0; i < 160; ++i) {
    SCOPED_TRACE(i);
    const uint64_t n = 1 + rng() % (budget / 3);
    Live l{Make(n, "p"), RandomBytes(n, i)};
    TM_ASSERT_OK(tm_tensor_write(rt_, l.t, 0, l.bytes.data(), n));
    live.push_back(std::move(l));
    const uint64_t what = rng() % 8;
    Live& old = live[rng() % live.size()];
    if (what == 0) {
      EXPECT_EQ(Read(old.t, old.bytes.size()), old.bytes);
    } else if (what == 1) {
      void* p = nullptr;
      TM_ASSERT_OK(tm_tensor_acquire(rt_, old.t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
      EXPECT_EQ(std::memcmp(p, old.bytes.data(), old.bytes.size()), 0);
      TM_ASSERT_OK(tm_tensor_release(rt_, old.t, TM_TIER_HBM));
    } else if (what == 2) {
      TM_ASSERT_OK(tm_tensor_prefetch(rt_, old.t, TM_TIER_HBM));
    } else if (what == 3) {
      TM_ASSERT_OK(tm_tensor_offload(rt_, old.t, TM_TIER_DRAM));
    }
    if (live.size() > 12) {  // fresh handles: the oldest go
      const size_t k = rng() % live.size();
      TM_ASSERT_OK(tm_tensor_sync(rt_, live[k].t));
      TM_ASSERT_OK(tm_tensor_destroy(rt_, live[k].t));
      live.erase(live.begin() + static_cast<ptrdiff_t>(k));
    }
    ASSERT_LE(alloc_.Now().outstanding, budget);
  }
  TM_ASSERT_OK(tm_runtime_sync(rt_));
  for (const Live& l : live) EXPECT_EQ(Read(l.t, l.bytes.size()), l.bytes);
  const auto s = alloc_.Now();
  EXPECT_LE(s.peak, budget) << "never more than TIERMEM_HBM_BYTES through the callbacks";
  EXPECT_GT(s.peak, budget / 2) << "the loop did press on the budget";
  const tm_stats st = Stats();
  EXPECT_GT(st.evictions, 0u);
  EXPECT_EQ(st.fragmentation_evictions, 0u);
  EXPECT_EQ(st.tiers[TM_TIER_HBM].used, s.outstanding);
}

TEST_F(Allocator, FailingCallbackIsOutOfMemoryNamingItAndTheTensorStays) {
  Open(8 * kMiB);
  const uint64_t n = 300000;
  const auto bytes = RandomBytes(n, 5);
  tm_tensor t = Make(n, "act", TM_TIER_DRAM);
  TM_ASSERT_OK(tm_tensor_write(rt_, t, 0, bytes.data(), n));
  alloc_.SetFail(true);
  void* p = nullptr;
  EXPECT_EQ(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p),
            TM_ERR_OUT_OF_MEMORY);
  const std::string msg = tm_last_error();
  EXPECT_NE(msg.find("tm_config.device_alloc returned NULL for"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"act\""), std::string::npos) << msg;
  EXPECT_EQ(Residency(t), Bit(TM_TIER_DRAM));
  EXPECT_EQ(Read(t, n), bytes);
  EXPECT_EQ(Stats().tiers[TM_TIER_HBM].used, 0u) << "the budget is not left reserved";

  // A fresh HBM tensor's write fails the same way; a prefetch is dropped, not an error.
  tm_tensor u = Make(n, "fresh");
  EXPECT_EQ(tm_tensor_write(rt_, u, 0, bytes.data(), n), TM_ERR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(tm_last_error()).find("device_alloc"), std::string::npos);
  TM_ASSERT_OK(tm_tensor_prefetch(rt_, t, TM_TIER_HBM));
  TM_ASSERT_OK(tm_tensor_sync(rt_, t));
  EXPECT_GE(Stats().prefetches_dropped_no_room, 1u);

  alloc_.SetFail(false);
  TM_ASSERT_OK(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  EXPECT_EQ(std::memcmp(p, bytes.data(), n), 0);
  TM_ASSERT_OK(tm_tensor_release(rt_, t, TM_TIER_HBM));
}

TEST_F(Allocator, ShortFrameworkAllocatorMakesADemandEvictAndRetryOnce) {
  // The framework's allocator holds 1.5 MiB for tiermem though the budget is 8 MiB: the
  // second copy does not fit until tiermem gives the first back.
  Open(8 * kMiB);
  alloc_.SetCap(kMiB + kMiB / 2);
  const auto a = RandomBytes(kMiB, 1), b = RandomBytes(kMiB, 2);
  tm_tensor ta = Make(kMiB, "a"), tb = Make(kMiB, "b");
  TM_ASSERT_OK(tm_tensor_write(rt_, ta, 0, a.data(), kMiB));
  TM_ASSERT_OK(tm_tensor_write(rt_, tb, 0, b.data(), kMiB));
  EXPECT_EQ(alloc_.Now().failed, 1u);
  tm_stats s = Stats();
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_EQ(s.fragmentation_evictions, 0u);
  EXPECT_EQ(Residency(ta), Bit(TM_TIER_DRAM));
  EXPECT_EQ(Residency(tb), Bit(TM_TIER_HBM));
  EXPECT_EQ(Read(ta, kMiB), a);

  // Nothing to give back (b is pinned): the failure stands, named, and a stays where it is.
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, tb, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  EXPECT_EQ(tm_tensor_acquire(rt_, ta, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p),
            TM_ERR_OUT_OF_MEMORY);
  EXPECT_NE(std::string(tm_last_error()).find("tm_config.device_alloc returned NULL"),
            std::string::npos)
      << tm_last_error();
  TM_ASSERT_OK(tm_tensor_release(rt_, tb, TM_TIER_HBM));
  EXPECT_EQ(Residency(ta), Bit(TM_TIER_DRAM));
  EXPECT_EQ(Read(ta, kMiB), a);
  EXPECT_EQ(Read(tb, kMiB), b);
}

// ---- the counted TierSpace and its eviction order, without a runtime ----

struct Backed {
  std::map<void*, uint64_t> live;
  bool fail = false;
  TierBacking Backing() {
    TierBacking b;
    b.allocate = [this](uint64_t n, absl::string_view) -> absl::StatusOr<void*> {
      if (fail) return absl::ResourceExhaustedError("no memory");
      void* p = std::malloc(n);
      live[p] = n;
      return p;
    };
    b.free = [this](void* p, uint64_t n) {
      EXPECT_EQ(live[p], n);
      live.erase(p);
      std::free(p);
    };
    return b;
  }
};

TEST(CountedSpace, CountsBytesAndHasNoHoles) {
  Backed backed;
  {
    TierSpace space(TM_TIER_HBM, 4096, 256, backed.Backing());
    EXPECT_TRUE(space.counted());
    auto a = space.Allocate(1000, "a", 7);  // 1024
    auto b = space.Allocate(1024, "b", 8);
    auto c = space.Allocate(2048, "c", 9);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(space.free_bytes(), 0u);
    EXPECT_NE(a->memory, nullptr);
    auto d = space.Allocate(1, "d");
    EXPECT_FALSE(d.ok());
    EXPECT_FALSE(IsBackingShort(d.status())) << "the budget was short, not the backing";
    space.Free(*a);
    space.Free(*c);
    EXPECT_TRUE(a->empty());
    // 3 KiB free in what a slab would have as two holes: one request takes it.
    auto e = space.Allocate(3000, "e", 10);
    ASSERT_TRUE(e.ok()) << e.status();
    const auto layout = space.Layout();
    ASSERT_EQ(layout.size(), 2u);  // b and e; no free block left
    EXPECT_EQ(layout[0].owner, 8u);
    EXPECT_EQ(layout[1].owner, 10u);
    EXPECT_EQ(space.Stats().peak, 4096u);

    backed.fail = true;
    space.Free(*e);
    auto f = space.Allocate(100, "f");
    ASSERT_FALSE(f.ok());
    EXPECT_TRUE(IsBackingShort(f.status()));
    EXPECT_EQ(space.free_bytes(), 3072u) << "a failed backing reserves nothing";
    EXPECT_EQ(backed.live.size(), 1u);
  }  // b is still reserved: the space gives it back
  EXPECT_TRUE(backed.live.empty());
}

TEST(CountedSpace, EvictionOrderFindsVictimsAcrossWalls) {
  using K = EvictionSlot::Kind;
  // Holes and copies as a slab would lay them out: walls split every window below 3 MiB.
  std::vector<EvictionSlot> slots = {{kMiB, K::kEvictable, 4.0}, {kMiB, K::kWall, 0},
                                     {kMiB, K::kFree, 0},        {kMiB, K::kWall, 0},
                                     {kMiB, K::kEvictable, 1},   {kMiB, K::kEvictable, 2}};
  EXPECT_FALSE(CheapestWindow(slots, 3 * kMiB).has_value());
  const std::vector<size_t> order = CountedOrder(slots);
  EXPECT_EQ(order, (std::vector<size_t>{2, 4, 5, 0, 1, 3}));
  std::vector<EvictionSlot> ordered;
  for (size_t i : order) ordered.push_back(slots[i]);
  auto w = CheapestWindow(ordered, 3 * kMiB);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->victims, 2u);  // the hole and the two cheapest copies
  EXPECT_EQ(w->cost, 3.0);
}

}  // namespace
}  // namespace tiermem
