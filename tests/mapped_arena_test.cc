// HBM mapped in chunks (lib/tiers/mapped_arena.h, TIERMEM_HBM_LAYOUT=mapped): a request is met
// whenever its chunks are free, wherever they lie, and every copy keeps its own bytes while
// others come and go over the same chunks. On the emulated device always; on a GPU when there
// is one (skipped, with the reason, without).
#include "lib/tiers/mapped_arena.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "io/device.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using tiermem::testing::kSanitized;

// Under a sanitizer (kSanitized) the runtime's own allocator maps and unmaps memory too
// (ThreadSanitizer aborts when an unmap of its own is refused), so the process cannot be taken
// to vm.max_map_count; and every byte copied is checked, so the churn runs fewer operations.
class Arena : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (std::string(GetParam()) == "cuda") {
      if (!io::CudaBackendCompiled()) GTEST_SKIP() << "this build has no CUDA backend";
      auto d = io::CreateCudaDevice(0);
      if (!d.ok()) GTEST_SKIP() << "no usable GPU: " << d.status().message();
      device_ = std::move(*d);
    } else {
      device_ = io::CreateEmulatedDevice({});
    }
    // The chunk size is the device's: learned from an arena of a few MiB.
    auto probe = MappedArena::Create(*device_, 16 << 20);
    if (absl::IsUnimplemented(probe.status())) {
      GTEST_SKIP() << "the device cannot map chunks: " << probe.status().message();
    }
    ASSERT_TRUE(probe.ok()) << probe.status();
    chunk_ = (*probe)->chunk_bytes();
  }
  std::unique_ptr<MappedArena> Make(uint64_t chunks) {
    auto a = MappedArena::Create(*device_, chunks * chunk_);
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return nullptr;
    EXPECT_EQ((*a)->capacity(), chunks * chunk_);
    EXPECT_EQ((*a)->free_chunks(), chunks);
    return std::move(*a);
  }
  // Fills `bytes` at `p` with `value` through the device's copy engine, as the runtime does.
  void Put(void* p, uint64_t bytes, uint8_t value) {
    std::vector<uint8_t> host(bytes, value);
    ASSERT_TRUE(device_->RegisterHost(host.data(), bytes).ok());
    auto s = device_->copy_engine().Copy(io::CopyDirection::kHostToDevice, p, host.data(), bytes);
    device_->UnregisterHost(host.data());
    ASSERT_TRUE(s.ok()) << s;
  }
  // How many of the `bytes` at `p` are not `value`.
  uint64_t Wrong(const void* p, uint64_t bytes, uint8_t value) {
    std::vector<uint8_t> host(bytes, static_cast<uint8_t>(~value));
    EXPECT_TRUE(device_->RegisterHost(host.data(), bytes).ok());
    auto s = device_->copy_engine().Copy(io::CopyDirection::kDeviceToHost, host.data(), p, bytes);
    device_->UnregisterHost(host.data());
    EXPECT_TRUE(s.ok()) << s;
    return bytes - static_cast<uint64_t>(std::count(host.begin(), host.end(), value));
  }
  std::unique_ptr<io::Device> device_;
  uint64_t chunk_ = 0;
};

// Four copies of two chunks fill eight; with the first and third freed, a copy of four chunks
// fits in their two holes, where a slab would need one hole of four. The copies left keep
// their bytes, and the new one holds its own.
TEST_P(Arena, FillsHolesThatCopiesInUseSplit) {
  auto arena = Make(8);
  ASSERT_NE(arena, nullptr);
  std::vector<void*> p;
  for (uint8_t i = 0; i < 4; ++i) {
    auto m = arena->Allocate(2 * chunk_);
    ASSERT_TRUE(m.ok()) << m.status();
    p.push_back(*m);
    Put(*m, 2 * chunk_, static_cast<uint8_t>(i + 1));
  }
  auto full = arena->Allocate(chunk_);
  EXPECT_TRUE(absl::IsResourceExhausted(full.status())) << full.status();
  EXPECT_EQ(arena->free_chunks(), 0u);
  arena->Free(p[0]);
  arena->Free(p[2]);
  EXPECT_EQ(arena->free_chunks(), 4u);
  auto wide = arena->Allocate(4 * chunk_);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(arena->free_chunks(), 0u);
  Put(*wide, 4 * chunk_, 9);
  EXPECT_TRUE(device_->IsDevicePointer(*wide));
  EXPECT_TRUE(device_->IsDevicePointer(static_cast<char*>(*wide) + 4 * chunk_ - 1));
  EXPECT_EQ(Wrong(p[1], 2 * chunk_, 2), 0u);
  EXPECT_EQ(Wrong(p[3], 2 * chunk_, 4), 0u);
  EXPECT_EQ(Wrong(*wide, 4 * chunk_, 9), 0u);
}

TEST_P(Arena, RefusesSizesThatAreNotWholeChunks) {
  auto arena = Make(4);
  ASSERT_NE(arena, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(arena->Allocate(0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(arena->Allocate(chunk_ + 1).status()));
  EXPECT_TRUE(absl::IsResourceExhausted(arena->Allocate(5 * chunk_).status()));
  EXPECT_EQ(arena->free_chunks(), 4u) << "a refused request took chunks";
  auto below = MappedArena::Create(*device_, chunk_ - 1);
  EXPECT_TRUE(absl::IsInvalidArgument(below.status())) << below.status();
}

// Copies of random sizes come and go over the same chunks for a while: every live copy keeps
// the bytes written to it, and the arena ends with every chunk free. Copies still mapped when
// an arena goes are unmapped with it (the sanitizer builds check that nothing leaks).
TEST_P(Arena, ChurnKeepsEveryCopysBytes) {
  auto arena = Make(32);
  ASSERT_NE(arena, nullptr);
  std::mt19937 rng(7);
  struct Live {
    uint64_t bytes;
    uint8_t value;
  };
  std::map<void*, Live> live;
  uint8_t next = 1;
  const int ops = kSanitized ? 100 : 300;
  for (int op = 0; op < ops; ++op) {
    const bool alloc = live.empty() || rng() % 3 != 0;
    if (alloc) {
      const uint64_t bytes = (1 + rng() % 6) * chunk_;
      auto m = arena->Allocate(bytes);
      if (!m.ok()) {
        ASSERT_TRUE(absl::IsResourceExhausted(m.status())) << m.status();
        continue;
      }
      live[*m] = Live{bytes, next};
      Put(*m, bytes, next);
      next = static_cast<uint8_t>(next % 250 + 1);
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_EQ(Wrong(it->first, it->second.bytes, it->second.value), 0u) << "op " << op;
      arena->Free(it->first);
      live.erase(it);
    }
  }
  uint64_t used = 0;
  for (const auto& [p, l] : live) {
    EXPECT_EQ(Wrong(p, l.bytes, l.value), 0u);
    used += l.bytes / chunk_;
  }
  EXPECT_EQ(arena->free_chunks(), 32 - used);
  if (live.size() > 1) arena->Free(live.begin()->first);  // the rest go with the arena
}

INSTANTIATE_TEST_SUITE_P(Devices, Arena, ::testing::Values("emulated", "cuda"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// TIERMEM_HBM_LAYOUT through the C API: `slab` unless set; `mapped` takes the budget in whole
// chunks and refuses a budget below one, naming the setting.
TEST(HbmLayout, ChosenByTheSettingWithItsLimits) {
  testing::TempDir dir;
  auto create = [&](uint64_t hbm, std::optional<std::string> setting, uint64_t* capacity) {
    testing::ScopedEnv env("TIERMEM_HBM_LAYOUT", setting);
    tm_config c = testing::SmallConfig(dir.path());
    c.hbm_bytes = hbm;
    tm_runtime rt{};
    if (tm_runtime_create(&c, &rt) != TM_OK) return std::string("error: ") + tm_last_error();
    char buf[32] = {};
    EXPECT_EQ(tm_runtime_config_value(rt, "TIERMEM_HBM_LAYOUT", buf, sizeof buf, nullptr), TM_OK);
    tm_stats s = TM_STATS_INIT;
    EXPECT_EQ(tm_runtime_stats(rt, &s), TM_OK);
    *capacity = s.tiers[TM_TIER_HBM].capacity;
    tm_runtime_destroy(rt);
    return std::string(buf);
  };
  uint64_t capacity = 0;
  EXPECT_EQ(create((64 << 20) + 4096, std::nullopt, &capacity), "slab");
  EXPECT_EQ(capacity, (64u << 20) + 4096);
  EXPECT_EQ(create((64 << 20) + 4096, "mapped", &capacity), "mapped");
  EXPECT_EQ(capacity, 64u << 20) << "rounded down to whole chunks";
  const std::string below = create(1 << 20, "mapped", &capacity);
  EXPECT_NE(below.find("TIERMEM_HBM_LAYOUT=mapped"), std::string::npos) << below;
  EXPECT_NE(below.find("below one chunk"), std::string::npos) << below;
  const std::string bad = create(64 << 20, "chunked", &capacity);
  EXPECT_NE(bad.find("TIERMEM_HBM_LAYOUT"), std::string::npos) << bad;
}

// The emulated device's chunks are memory mappings, and a process has only vm.max_map_count of
// them. This one's mappings are used up (a read-only region split page by page until the
// kernel refuses) while a copy is freed, so its chunks cannot move back to where they are kept.
// They must still be memory when a later copy takes them, not an inaccessible reservation.
std::string Permissions(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const auto at = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    uintptr_t begin = 0, end = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &begin, &end, perms) == 3 && begin <= at &&
        at < end) {
      return perms;
    }
  }
  return "unmapped";
}

// The process's vm.max_map_count when this test may use it up; 0, with the reason, when not.
// test_util.h's MappingsToUseUp stops at 2^20; this test goes further, up to 2^24 (the GPU
// machine gpu_check runs it on has 8250415): using up 8M mappings takes about 4M mprotect calls
// (2-4 us each on the development VM), one read of /proc/self/maps with 8M lines (about 0.8 us
// a line), the unmap (about 1.3 us a mapping) and some 1.8 GB of kernel memory for the mappings:
// 20-40 s, where a skip would leave the path untested on that machine.
uint64_t MappingsToUseUpHere(std::string* why) {
  if (kSanitized) return tiermem::testing::MappingsToUseUp(why);
  uint64_t max_maps = 0;
  std::ifstream("/proc/sys/vm/max_map_count") >> max_maps;
  if (max_maps == 0 || max_maps > (uint64_t{1} << 24)) {
    *why = "vm.max_map_count is " + std::to_string(max_maps) +
           ": too many mappings to use up here (at most 2^24)";
    return 0;
  }
  return max_maps;
}

TEST(EmulatedChunks, StayMemoryWhenTheProcessRunsOutOfMappings) {
  std::string why;
  const uint64_t max_maps = MappingsToUseUpHere(&why);
  if (max_maps == 0) GTEST_SKIP() << why;
  auto device = io::CreateEmulatedDevice({});
  auto arena = MappedArena::Create(*device, 4 * (uint64_t{2} << 20));
  ASSERT_TRUE(arena.ok()) << arena.status();
  const uint64_t chunk = (*arena)->chunk_bytes();
  auto first = (*arena)->Allocate(2 * chunk);
  ASSERT_TRUE(first.ok()) << first.status();
  std::memset(*first, 0x11, 2 * chunk);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t pages = 2 * max_maps + 16;
  char* region = static_cast<char*>(
      mmap(nullptr, pages * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  ASSERT_NE(region, MAP_FAILED);
  bool used_up = false;
  for (size_t i = 1; i < pages && !used_up; i += 2) {
    used_up = mprotect(region + i * page, page, PROT_NONE) != 0;
  }
  (*arena)->Free(*first);  // nothing allocates between the mprotects and here
  // Wherever its chunks went, the freed copy's addresses are still the mapper's: a hole there
  // could be taken by any mmap of the process, and a later copy moved in would overwrite it.
  // Both chunks' lines in one read of /proc/self/maps (which has max_maps lines now).
  std::vector<std::string> after_free(2, "unmapped");
  {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      uintptr_t begin = 0, end = 0;
      char perms[5] = {};
      if (std::sscanf(line.c_str(), "%lx-%lx %4s", &begin, &end, perms) != 3) continue;
      for (uint64_t c = 0; c < 2; ++c) {
        const auto at = reinterpret_cast<uintptr_t>(static_cast<char*>(*first) + c * chunk);
        if (begin <= at && at < end) after_free[c] = perms;
      }
    }
  }
  munmap(region, pages * page);
  for (uint64_t c = 0; c < 2; ++c) {
    EXPECT_NE(after_free[c], "unmapped") << "chunk " << c << " of the freed copy";
  }
  ASSERT_TRUE(used_up) << "the kernel took " << pages << " mappings";
  EXPECT_EQ((*arena)->free_chunks(), 4u);
  auto second = (*arena)->Allocate(4 * chunk);
  ASSERT_TRUE(second.ok()) << second.status();
  char* p = static_cast<char*>(*second);
  for (uint64_t c = 0; c < 4; ++c) {
    ASSERT_EQ(Permissions(p + c * chunk), "rw-p") << "chunk " << c << " of the second copy";
  }
  std::memset(p, 0x22, 4 * chunk);
  EXPECT_EQ(std::count(p, p + 4 * chunk, 0x22), static_cast<long>(4 * chunk));
  (*arena)->Free(p);
}

// A budget whose chunks could take more mappings than the process has left is refused at
// start-up, naming the limit, instead of failing moves (and every other mmap) later.
TEST(EmulatedChunks, RefuseABudgetBeyondTheMappingsLeft) {
  uint64_t max_maps = 0;
  std::ifstream("/proc/sys/vm/max_map_count") >> max_maps;
  // The budget is refused before anything is reserved, so any limit will do whose budget the
  // mapper's range check (2^46 bytes over the range and the park) lets through to the mappings'
  // check: up to about 20M (8250415 on the GPU machine; 65530 by default).
  const uint64_t most_chunks =
      (uint64_t{1} << 46) / (uint64_t{2} << 20) / (MappedArena::kRangeMultiple + 1);
  if (max_maps == 0 || max_maps / 3 + 1 > most_chunks) {
    GTEST_SKIP() << "vm.max_map_count is " << max_maps
                 << ": a budget beyond it is refused for its address range first";
  }
  auto device = io::CreateEmulatedDevice({});
  auto arena = MappedArena::Create(*device, (max_maps / 3 + 1) * (uint64_t{2} << 20));
  ASSERT_TRUE(absl::IsResourceExhausted(arena.status())) << arena.status();
  EXPECT_NE(arena.status().message().find("vm.max_map_count"), std::string::npos) << arena.status();
}

}  // namespace
}  // namespace tiermem
