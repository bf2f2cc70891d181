// The HBM tier's layouts (TIERMEM_HBM_LAYOUT=slab and =mapped) as an outside client meets them,
// on the emulated device: every byte read back is checked against a model of what was written.
// Mapped places a copy on whichever 2 MiB chunks are free, wherever they lie, by moving their
// pages into the copy's own address range (runs of consecutive chunks with one mremap); these
// cases make it place copies on scattered chunks between pinned ones, on chunks another tensor
// just left, under random churn of odd sizes in a budget of a few chunks, and while the process
// has no memory mapping left to give (all through the C API). One more, through the runtime
// with copy-state checks on: a copy acquired for writing twice in one tier.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/runtime/runtime.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace {

using tiermem::testing::kSanitized;
using tiermem::testing::RandomBytes;
using tiermem::testing::ScopedEnv;
using tiermem::testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kChunk = 2 * kMiB;

class MappedClient : public ::testing::TestWithParam<const char*> {
 protected:
  bool Mapped() const { return std::string(GetParam()) == "mapped"; }
  void Start(uint64_t hbm, uint64_t dram) {
    env_.Set("TIERMEM_HBM_LAYOUT", GetParam());
    tm_config c = TM_CONFIG_INIT;
    c.device = TM_DEVICE_EMULATED;
    c.hbm_bytes = hbm;
    c.dram_bytes = dram;
    c.nvme_bytes = 256 * kMiB;
    c.nvme_paths = dir_.path().c_str();
    c.prefetch_depth = 0;
    c.log_level = TM_LOG_ERROR;
    ASSERT_EQ(tm_runtime_create(&c, &rt_), TM_OK) << tm_last_error();
  }
  void TearDown() override {
    if (rt_.bits != 0) {
      EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK) << tm_last_error();
    }
  }
  tm_tensor Make(const std::string& name, uint64_t bytes) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = bytes;
    d.home_tier = TM_TIER_HBM;
    d.name = name.c_str();
    tm_tensor t = {0};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    return t;
  }
  void ExpectBytes(tm_tensor t, const std::vector<uint8_t>& want, const std::string& what) {
    std::vector<uint8_t> got(want.size(), 0xAB);
    ASSERT_EQ(tm_tensor_read(rt_, t, 0, got.data(), got.size()), TM_OK)
        << what << ": " << tm_last_error();
    EXPECT_TRUE(got == want) << what << ": wrong bytes";
  }
  tm_stats Stats() {
    tm_stats s = TM_STATS_INIT;
    EXPECT_EQ(tm_runtime_stats(rt_, &s), TM_OK);
    return s;
  }
  // With every tensor gone, one tensor of the whole HBM budget is placed and holds its bytes:
  // no chunk (or slab range) was lost on the way.
  void ExpectWholeBudgetPlaceable() {
    const tm_stats s = Stats();
    EXPECT_EQ(s.tiers[TM_TIER_HBM].used, 0u);
    const uint64_t cap = s.tiers[TM_TIER_HBM].capacity;
    tm_tensor w = Make("whole-budget", cap);
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, w, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
        << tm_last_error();
    std::memset(p, 0x5A, cap);
    EXPECT_EQ(tm_tensor_release(rt_, w, TM_TIER_HBM), TM_OK);
    EXPECT_EQ(tm_tensor_destroy(rt_, w), TM_OK);
  }

  ScopedEnv env_;
  TempDir dir_;
  tm_runtime rt_ = {0};
};

// Eight one-chunk tensors fill the budget; every other one is pinned. A three-chunk tensor then
// needs three of the four unpinned ones evicted: mapped places it on chunks 0, 2, 4 (three runs
// of one), with no hole to look for; the slab has no 6 MiB window between the pins and refuses
// cleanly. Either way the pinned copies' bytes do not move under their pointers.
TEST_P(MappedClient, PlacesACopyBetweenPinnedChunks) {
  Start(8 * kChunk, 128 * kMiB);
  std::vector<tm_tensor> t;
  std::vector<std::vector<uint8_t>> bytes;
  for (int i = 0; i < 8; ++i) {
    t.push_back(Make("c" + std::to_string(i), kChunk));
    bytes.push_back(RandomBytes(kChunk, 10 + i));
    ASSERT_EQ(tm_tensor_write(rt_, t[i], 0, bytes[i].data(), kChunk), TM_OK) << tm_last_error();
  }
  std::vector<void*> pinned(8, nullptr);
  for (int i = 1; i < 8; i += 2) {
    ASSERT_EQ(tm_tensor_acquire(rt_, t[i], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &pinned[i]), TM_OK)
        << tm_last_error();
  }
  tm_tensor x = Make("x", 3 * kChunk - 1);
  std::vector<uint8_t> xb = RandomBytes(3 * kChunk - 1, 99);
  const tm_status st = tm_tensor_write(rt_, x, 0, xb.data(), xb.size());
  if (Mapped()) {
    ASSERT_EQ(st, TM_OK) << tm_last_error();
    void* px = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, x, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &px), TM_OK)
        << tm_last_error();
    EXPECT_EQ(std::memcmp(px, xb.data(), xb.size()), 0) << "x in HBM";
    EXPECT_EQ(tm_tensor_release(rt_, x, TM_TIER_HBM), TM_OK);
    const tm_stats s = Stats();
    EXPECT_EQ(s.fragmentation_evictions, 0u);
    EXPECT_EQ(s.relocations, 0u);
  } else {
    ASSERT_EQ(st, TM_ERR_OUT_OF_MEMORY);
    const std::string msg = tm_last_error();
    EXPECT_NE(msg.find("\"x\""), std::string::npos) << msg;
    // 8 MiB would be free with c0, c2, c4 and c6 evicted, 6 MiB more than enough: what keeps
    // x out is that the pinned copies split them (it said "cannot fit even with every unpinned
    // copy evicted", as though the bytes were short).
    EXPECT_NE(msg.find("would free 8 MiB of 16 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("pinned) copies split them"), std::string::npos) << msg;
    EXPECT_NE(msg.find("largest hole between pinned copies would be 2 MiB"), std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("cannot fit even"), std::string::npos) << msg;
    xb.assign(xb.size(), 0);  // never written
  }
  for (int i = 1; i < 8; i += 2) {
    EXPECT_EQ(std::memcmp(pinned[i], bytes[i].data(), kChunk), 0) << "pinned c" << i;
    EXPECT_EQ(tm_tensor_release(rt_, t[i], TM_TIER_HBM), TM_OK);
  }
  for (int i = 0; i < 8; ++i) ExpectBytes(t[i], bytes[i], "c" + std::to_string(i));
  ExpectBytes(x, xb, "x");
  for (int i = 0; i < 8; ++i) EXPECT_EQ(tm_tensor_destroy(rt_, t[i]), TM_OK);
  EXPECT_EQ(tm_tensor_destroy(rt_, x), TM_OK);
  ExpectWholeBudgetPlaceable();
}

// Mapped gives every copy whole chunks: a 3 MiB tensor takes 4 MiB, so two of them do not fit
// an 8 MiB budget beside a pinned 1 MiB one, though 7 MiB would. The out-of-memory message says
// so (it said only what was pinned, and the sizes did not add up); the slab says nothing of
// chunks. A tensor over the whole budget says it too.
TEST_P(MappedClient, OutOfMemorySaysCopiesTakeWholeChunks) {
  Start(4 * kChunk, 64 * kMiB);
  tm_tensor a = Make("a", kMiB), b = Make("b", 3 * kMiB), c = Make("c", 3 * kMiB);
  void* p[3] = {};
  ASSERT_EQ(tm_tensor_acquire(rt_, a, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p[0]), TM_OK)
      << tm_last_error();
  ASSERT_EQ(tm_tensor_acquire(rt_, b, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p[1]), TM_OK)
      << tm_last_error();
  const tm_status st = tm_tensor_acquire(rt_, c, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p[2]);
  if (Mapped()) {
    ASSERT_EQ(st, TM_ERR_OUT_OF_MEMORY);
    const std::string msg = tm_last_error();
    EXPECT_NE(msg.find("whole chunks of 2 MiB: its 3 MiB take 4 MiB"), std::string::npos) << msg;
  } else {
    ASSERT_EQ(st, TM_OK) << tm_last_error();
    EXPECT_EQ(tm_tensor_release(rt_, c, TM_TIER_HBM), TM_OK);
  }
  EXPECT_EQ(tm_tensor_release(rt_, a, TM_TIER_HBM), TM_OK);
  EXPECT_EQ(tm_tensor_release(rt_, b, TM_TIER_HBM), TM_OK);
  tm_tensor huge = Make("huge", 4 * kChunk + 1);
  void* q = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt_, huge, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &q),
            TM_ERR_OUT_OF_MEMORY);
  const std::string msg = tm_last_error();
  EXPECT_NE(msg.find("more than the whole hbm tier (8 MiB)"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("whole chunks") != std::string::npos, Mapped()) << msg;
  for (tm_tensor t : {a, b, c, huge}) EXPECT_EQ(tm_tensor_destroy(rt_, t), TM_OK);
  ExpectWholeBudgetPlaceable();
}

// Mapped counts the budget in whole chunks: 5 MiB gives a tier of 4 MiB. It did so without a
// word; one warning at create now says so, naming the budget as the caller set it. The slab
// keeps every byte and says nothing.
TEST_P(MappedClient, BudgetRoundedDownToChunksIsLoggedOnce) {
  TempDir logs;
  const std::string path = logs.path() + "/stderr";
  const int file = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  const int saved = dup(STDERR_FILENO);
  ASSERT_GE(saved, 0);
  ASSERT_GE(dup2(file, STDERR_FILENO), 0);
  env_.Set("TIERMEM_HBM_LAYOUT", GetParam());
  tm_config c = TM_CONFIG_INIT;
  c.device = TM_DEVICE_EMULATED;
  c.hbm_bytes = 5 * kMiB;
  c.dram_bytes = 64 * kMiB;
  c.nvme_bytes = 256 * kMiB;
  c.nvme_paths = dir_.path().c_str();
  c.log_level = TM_LOG_WARN;
  const tm_status st = tm_runtime_create(&c, &rt_);
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(file);
  ASSERT_EQ(st, TM_OK) << tm_last_error();
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string line =
      "warn: TIERMEM_HBM_LAYOUT=mapped: tm_config.hbm_bytes=5 MiB is not a whole number of 2 MiB "
      "chunks; the HBM tier holds 4 MiB (rounded down)";
  size_t count = 0;
  for (size_t at = text.find(line); at != std::string::npos; at = text.find(line, at + 1)) ++count;
  EXPECT_EQ(count, Mapped() ? 1u : 0u) << text;
  EXPECT_EQ(Stats().tiers[TM_TIER_HBM].capacity, Mapped() ? 4 * kMiB : 5 * kMiB);
}

// Chunks another tensor just left hold its bytes; a new tensor placed on them reads as zeros
// (acquired for reading before any write), and a one-byte write leaves the rest zeros.
TEST_P(MappedClient, ChunksATensorLeftReadAsZerosInTheNext) {
  Start(2 * kChunk, 64 * kMiB);
  const std::vector<uint8_t> full(2 * kChunk, 0xAA);
  tm_tensor a = Make("a", 2 * kChunk);
  ASSERT_EQ(tm_tensor_write(rt_, a, 0, full.data(), full.size()), TM_OK) << tm_last_error();
  ASSERT_EQ(tm_tensor_destroy(rt_, a), TM_OK);
  tm_tensor n = Make("n", 2 * kChunk - 3);
  void* p = nullptr;
  ASSERT_EQ(tm_tensor_acquire(rt_, n, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
      << tm_last_error();
  const auto* b = static_cast<const uint8_t*>(p);
  EXPECT_EQ(std::count(b, b + 2 * kChunk - 3, 0), static_cast<long>(2 * kChunk - 3));
  ASSERT_EQ(tm_tensor_release(rt_, n, TM_TIER_HBM), TM_OK);
  ASSERT_EQ(tm_tensor_destroy(rt_, n), TM_OK);

  tm_tensor a2 = Make("a2", 2 * kChunk);
  ASSERT_EQ(tm_tensor_write(rt_, a2, 0, full.data(), full.size()), TM_OK) << tm_last_error();
  ASSERT_EQ(tm_tensor_destroy(rt_, a2), TM_OK);
  tm_tensor m = Make("m", 2 * kChunk);
  const uint8_t one = 7;
  ASSERT_EQ(tm_tensor_write(rt_, m, kChunk + 5, &one, 1), TM_OK) << tm_last_error();
  std::vector<uint8_t> want(2 * kChunk, 0);
  want[kChunk + 5] = 7;
  ExpectBytes(m, want, "m after a one-byte write");
}

// A client's random sequence over odd sizes (1 B, a chunk and a byte either side of it, several
// chunks and a few bytes) in a budget of three chunks and five bytes: creates, partial writes,
// reads, acquires (some held across later calls), offloads to DRAM and NVMe, prefetches and
// destroys. Every read and every acquired pointer is checked against the model; a refusal must
// be one a client can act on (out of memory, busy) with a message, and leave the bytes as they
// were.
struct ModelTensor {
  tm_tensor handle = {0};
  std::vector<uint8_t> bytes;
  int held = -1;  // the tier of a held acquire, -1 for none
  void* ptr = nullptr;
};

TEST_P(MappedClient, RandomChurnOfOddSizesKeepsEveryByte) {
  Start(3 * kChunk + 5, 24 * kMiB);
  const uint64_t sizes[] = {1, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + 2, 4097, 5 * kMiB + 3};
  std::mt19937_64 rng(20261202);
  std::vector<ModelTensor> ts(8);
  std::vector<uint8_t> scratch;
  auto refusal_ok = [](tm_status s) {
    return (s == TM_ERR_OUT_OF_MEMORY || s == TM_ERR_BUSY) && tm_last_error()[0] != '\0';
  };
  // Under a sanitizer, a third of the operations: 1000 took 51-55 s a layout under TSan, the
  // longest tests of that run after Pressure.NoDemand*.
  const int ops = kSanitized ? 300 : 1000;
  for (int op = 0; op < ops; ++op) {
    ModelTensor& m = ts[rng() % ts.size()];
    const std::string at = "op " + std::to_string(op);
    if (m.handle.bits == 0) {
      m.bytes.assign(sizes[rng() % std::size(sizes)], 0);
      m.handle = Make("t" + std::to_string(op), m.bytes.size());
      continue;
    }
    const uint64_t n = m.bytes.size();
    const uint64_t off = rng() % n;
    const uint64_t len = 1 + rng() % (n - off);
    switch (rng() % 8) {
      case 0: {  // partial write
        scratch = RandomBytes(len, op);
        const tm_status s = tm_tensor_write(rt_, m.handle, off, scratch.data(), len);
        if (s == TM_OK) {
          std::memcpy(m.bytes.data() + off, scratch.data(), len);
        } else {
          ASSERT_TRUE(refusal_ok(s)) << at << ": " << tm_status_string(s) << tm_last_error();
        }
        break;
      }
      case 1: {  // partial read
        scratch.assign(len, 0xCD);
        ASSERT_EQ(tm_tensor_read(rt_, m.handle, off, scratch.data(), len), TM_OK)
            << at << ": " << tm_last_error();
        ASSERT_EQ(std::memcmp(scratch.data(), m.bytes.data() + off, len), 0) << at << ": read";
        break;
      }
      case 2:
      case 3: {  // acquire, check, modify through the pointer, maybe hold
        if (m.held >= 0) {
          ASSERT_EQ(std::memcmp(m.ptr, m.bytes.data(), n), 0) << at << ": held copy changed";
          ASSERT_EQ(tm_tensor_release(rt_, m.handle, static_cast<tm_tier>(m.held)), TM_OK);
          m.held = -1;
          break;
        }
        const auto tier = static_cast<tm_tier>(rng() % 2);
        void* p = nullptr;
        const tm_status s =
            tm_tensor_acquire(rt_, m.handle, tier, TM_ACCESS_READ_WRITE, nullptr, &p);
        if (s != TM_OK) {
          ASSERT_TRUE(refusal_ok(s)) << at << ": " << tm_status_string(s) << tm_last_error();
          break;
        }
        ASSERT_EQ(std::memcmp(p, m.bytes.data(), n), 0) << at << ": acquired in " << tier;
        scratch = RandomBytes(len, op);
        std::memcpy(static_cast<uint8_t*>(p) + off, scratch.data(), len);
        std::memcpy(m.bytes.data() + off, scratch.data(), len);
        if (rng() % 3 == 0) {
          m.held = tier;
          m.ptr = p;
        } else {
          ASSERT_EQ(tm_tensor_release(rt_, m.handle, tier), TM_OK);
        }
        break;
      }
      case 4: {  // offload, sometimes waited for
        const tm_status s =
            tm_tensor_offload(rt_, m.handle, rng() % 2 ? TM_TIER_DRAM : TM_TIER_NVME);
        ASSERT_TRUE(s == TM_OK || (m.held >= 0 && s == TM_ERR_BUSY))
            << at << ": " << tm_status_string(s) << tm_last_error();
        if (rng() % 2) tm_tensor_sync(rt_, m.handle);  // a refused move leaves the bytes
        break;
      }
      case 5: {  // prefetch
        const tm_status s =
            tm_tensor_prefetch(rt_, m.handle, rng() % 2 ? TM_TIER_DRAM : TM_TIER_HBM);
        ASSERT_TRUE(s == TM_OK || refusal_ok(s)) << at << ": " << tm_last_error();
        break;
      }
      case 6: {  // destroy
        if (m.held >= 0) {
          ASSERT_EQ(tm_tensor_destroy(rt_, m.handle), TM_ERR_BUSY) << at;
          break;
        }
        ASSERT_EQ(tm_tensor_destroy(rt_, m.handle), TM_OK) << at << ": " << tm_last_error();
        m = ModelTensor();
        break;
      }
      default: {  // whole read
        ExpectBytes(m.handle, m.bytes, at);
        break;
      }
    }
  }
  tm_runtime_sync(rt_);
  for (ModelTensor& m : ts) {
    if (m.handle.bits == 0) continue;
    if (m.held >= 0) {
      EXPECT_EQ(std::memcmp(m.ptr, m.bytes.data(), m.bytes.size()), 0) << "held copy at the end";
      EXPECT_EQ(tm_tensor_release(rt_, m.handle, static_cast<tm_tier>(m.held)), TM_OK);
    }
    ExpectBytes(m.handle, m.bytes, "at the end");
    EXPECT_EQ(tm_tensor_destroy(rt_, m.handle), TM_OK);
  }
  ExpectWholeBudgetPlaceable();
}

// The process runs out of memory mappings (a read-only region split page by page until the
// kernel refuses) while copies come and go: each call then either succeeds with the right bytes
// or is refused with a message, and once the mappings are back every byte and every chunk is.
TEST_P(MappedClient, OutOfMappingsRefusesCleanlyAndLosesNothing) {
  std::string why;
  const uint64_t max_maps = tiermem::testing::MappingsToUseUp(&why);
  if (max_maps == 0) GTEST_SKIP() << why;
  // Every thread allocates from the main heap, which grows by brk (one mapping, extended):
  // glibc's per-thread arenas grow by mprotect, which splits a mapping and fails once none is
  // left, so a worker's small allocation would end the process for the test's own exhaustion
  // (which layout of the copy engine's queue node came first decided it).
  mallopt(M_ARENA_MAX, 1);
  Start(4 * kChunk, 64 * kMiB);
  const uint64_t sizes[] = {2 * kChunk - 7, kChunk + 1, 1};
  std::vector<tm_tensor> t;
  std::vector<std::vector<uint8_t>> want, next, got;
  for (int i = 0; i < 3; ++i) {
    t.push_back(Make("m" + std::to_string(i), sizes[i]));
    want.push_back(RandomBytes(sizes[i], 40 + i));
    next.push_back(RandomBytes(sizes[i], 50 + i));
    got.emplace_back(sizes[i]);
    ASSERT_EQ(tm_tensor_write(rt_, t[i], 0, want[i].data(), sizes[i]), TM_OK) << tm_last_error();
  }
  // Nothing below allocates large buffers until the region is unmapped again.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t pages = 2 * max_maps + 16;
  char* region = static_cast<char*>(
      mmap(nullptr, pages * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  ASSERT_NE(region, MAP_FAILED);
  bool used_up = false;
  for (size_t i = 1; i < pages && !used_up; i += 2) {
    used_up = mprotect(region + i * page, page, PROT_NONE) != 0;
  }
  int refused = 0, wrong = 0, bad_refusals = 0, unnamed = 0;
  for (int round = 0; round < 30; ++round) {
    const int i = round % 3;
    tm_status s = TM_OK;
    switch (round % 5) {
      case 0:
        s = tm_tensor_offload(rt_, t[i], TM_TIER_DRAM);
        if (s == TM_OK) s = tm_tensor_sync(rt_, t[i]);
        break;
      case 1:
      case 3: {
        void* p = nullptr;
        s = tm_tensor_acquire(rt_, t[i], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p);
        if (s == TM_OK) {
          wrong += std::memcmp(p, want[i].data(), sizes[i]) != 0;
          tm_tensor_release(rt_, t[i], TM_TIER_HBM);
        }
        break;
      }
      case 2:
        s = tm_tensor_write(rt_, t[i], 0, next[i].data(), sizes[i]);
        if (s == TM_OK) std::swap(want[i], next[i]);
        break;
      default:
        s = tm_tensor_read(rt_, t[i], 0, got[i].data(), sizes[i]);
        if (s == TM_OK) wrong += got[i] != want[i];
        break;
    }
    if (s != TM_OK) {
      ++refused;
      bad_refusals += s != TM_ERR_OUT_OF_MEMORY || tm_last_error()[0] == '\0';
      // Named, with its value: "Cannot allocate memory" alone did not point at it.
      unnamed +=
          std::string(tm_last_error())
              .find("vm.max_map_count (" + std::to_string(max_maps) + ")") == std::string::npos;
    }
  }
  munmap(region, pages * page);
  ASSERT_TRUE(used_up) << "the kernel took " << pages << " mappings";
  EXPECT_EQ(wrong, 0) << "calls that succeeded with wrong bytes";
  EXPECT_EQ(bad_refusals, 0) << "refusals other than TM_ERR_OUT_OF_MEMORY with a message";
  EXPECT_EQ(unnamed, 0) << "refusals that do not name vm.max_map_count and its value";
  if (Mapped()) {
    EXPECT_GT(refused, 0) << "no call needed a mapping: the case tested nothing";
  }
  EXPECT_EQ(tm_runtime_sync(rt_), TM_OK) << tm_last_error();
  for (int i = 0; i < 3; ++i) {
    void* p = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, t[i], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), TM_OK)
        << tm_last_error();
    EXPECT_EQ(std::memcmp(p, want[i].data(), sizes[i]), 0) << "m" << i << " in HBM";
    EXPECT_EQ(tm_tensor_release(rt_, t[i], TM_TIER_HBM), TM_OK);
    ExpectBytes(t[i], want[i], "m" + std::to_string(i));
    EXPECT_EQ(tm_tensor_destroy(rt_, t[i]), TM_OK);
  }
  ExpectWholeBudgetPlaceable();
}

// A second acquire of a copy already held for writing in the same tier finds it in place: a hit,
// as for a held valid copy. It was counted as a miss (with its time as a stall), since only a
// kValid copy counted as in place.
TEST_P(MappedClient, NestedAcquireOfAHeldWritingCopyIsAHit) {
  Start(8 * kChunk, 64 * kMiB);
  for (tm_tier tier : {TM_TIER_HBM, TM_TIER_DRAM}) {
    tm_tensor t = Make("held", kChunk + 1);
    void* p1 = nullptr;
    void* p2 = nullptr;
    ASSERT_EQ(tm_tensor_acquire(rt_, t, tier, TM_ACCESS_WRITE, nullptr, &p1), TM_OK)
        << tm_last_error();
    const tm_stats before = Stats();
    ASSERT_EQ(tm_tensor_acquire(rt_, t, tier, TM_ACCESS_READ_WRITE, nullptr, &p2), TM_OK)
        << tm_last_error();
    EXPECT_EQ(p1, p2);
    const tm_stats after = Stats();
    EXPECT_EQ(after.acquire_misses, before.acquire_misses) << tm_tier_name(tier);
    EXPECT_EQ(after.acquire_hits, before.acquire_hits + 1) << tm_tier_name(tier);
    EXPECT_EQ(tm_tensor_release(rt_, t, tier), TM_OK);
    EXPECT_EQ(tm_tensor_release(rt_, t, tier), TM_OK);
    EXPECT_EQ(tm_tensor_destroy(rt_, t), TM_OK);
  }
}

// A write-only acquire moves nothing in, but it may find its tier full: the room it makes
// (here by writing the only copy of another tensor down a tier) is a wait of the caller's, so
// it is a miss with its time in acquire_stall_ns. It counted as a hit whatever it waited for,
// and the depth tuning that reads the stall saw none. With room free it stays a hit.
TEST_P(MappedClient, WriteAcquireThatMakesRoomIsAMiss) {
  Start(8 * kChunk, 64 * kMiB);
  tm_tensor a = Make("a", 5 * kChunk);
  tm_tensor b = Make("b", 4 * kChunk);
  const std::vector<uint8_t> bytes = RandomBytes(5 * kChunk, 7);
  void* p = nullptr;
  tm_stats before = Stats();
  ASSERT_EQ(tm_tensor_acquire(rt_, a, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
      << tm_last_error();
  tm_stats after = Stats();
  EXPECT_EQ(after.acquire_hits, before.acquire_hits + 1) << "room was free";
  EXPECT_EQ(after.acquire_misses, before.acquire_misses);
  std::memcpy(p, bytes.data(), bytes.size());
  ASSERT_EQ(tm_tensor_release(rt_, a, TM_TIER_HBM), TM_OK);

  before = Stats();
  ASSERT_EQ(tm_tensor_acquire(rt_, b, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr, &p), TM_OK)
      << tm_last_error();
  after = Stats();
  ASSERT_EQ(after.evictions, before.evictions + 1) << "a, the only copy, had to go down";
  EXPECT_EQ(after.acquire_hits, before.acquire_hits);
  EXPECT_EQ(after.acquire_misses, before.acquire_misses + 1);
  EXPECT_GT(after.acquire_stall_ns, before.acquire_stall_ns);
  ASSERT_EQ(tm_tensor_release(rt_, b, TM_TIER_HBM), TM_OK);
  ExpectBytes(a, bytes, "a, written down to make room");
  EXPECT_EQ(tm_tensor_destroy(rt_, a), TM_OK);
  EXPECT_EQ(tm_tensor_destroy(rt_, b), TM_OK);
}

// A copy acquired for writing is acquired again, for writing, in the same tier (two users of
// one tensor, each with its acquire and its release): the C API allows it (the copy stays in
// flux until its last release) and so does a release build, but the copy-state check of debug
// and sanitizer builds aborted the process on it (PinWrite of a copy already writing). Checks
// are switched on here, in a child, so that the plain build sees the abort too.
TEST_P(MappedClient, AcquiresForWritingNestInOneTier) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string layout = GetParam();
  const std::string dir = dir_.path();
  auto nest = [&]() -> int {
    tiermem::SetTransitionChecks(true);
    tiermem::ConfigOverrides o;
    o.device = tiermem::DeviceKind::kEmulated;
    o.hbm_bytes = tiermem::SizeSetting{8 * kChunk, 0};
    o.dram_bytes = tiermem::SizeSetting{64 * kMiB, 0};
    o.nvme_bytes = tiermem::SizeSetting{64 * kMiB, 0};
    o.nvme_paths = dir;
    o.log_level = tiermem::LogLevel::kError;
    auto env = [&](const char* name) -> std::optional<std::string> {
      if (std::string(name) == "TIERMEM_HBM_LAYOUT") return layout;
      return std::nullopt;
    };
    auto config = tiermem::LoadConfig(o, env, {});
    if (!config.ok()) return 2;
    auto rt = tiermem::Runtime::Create(*config);
    if (!rt.ok()) return 3;
    const tm_access writes[] = {TM_ACCESS_WRITE, TM_ACCESS_READ_WRITE};
    int wrong = 0;
    for (tm_tier tier : {TM_TIER_HBM, TM_TIER_DRAM}) {
      for (tm_access first : writes) {
        for (tm_access second : writes) {
          tiermem::TensorDesc d;
          d.bytes = kChunk + 1;
          d.home_tier = TM_TIER_HBM;
          d.name = "nested";
          auto h = (*rt)->CreateTensor(d);
          if (!h.ok()) return 4;
          std::vector<uint8_t> want = RandomBytes(kChunk + 1, 7);
          auto p1 = (*rt)->Acquire(*h, tier, first, nullptr);
          auto p2 = (*rt)->Acquire(*h, tier, second, nullptr);  // aborted here
          if (!p1.ok() || !p2.ok() || *p1 != *p2) return 5;
          std::memcpy(*p2, want.data(), want.size());
          wrong += !(*rt)->Release(*h, tier).ok();
          // Still acquired for writing once: no other copy may be made from it.
          const tm_tier other = tier == TM_TIER_HBM ? TM_TIER_DRAM : TM_TIER_HBM;
          wrong += (*rt)->Acquire(*h, other, TM_ACCESS_READ, nullptr).status().ok();
          wrong += !(*rt)->Release(*h, tier).ok();
          std::vector<uint8_t> got(want.size());
          wrong += !(*rt)->Read(*h, 0, got.data(), got.size()).ok() || got != want;
          wrong += !(*rt)->DestroyTensor(*h).ok();
        }
      }
    }
    return wrong == 0 ? 0 : 6;
  };
  // The child's fixture made a directory of its own, which exit() would leave in /var/tmp.
  EXPECT_EXIT(
      {
        const int rc = nest();
        dir_.Remove();
        std::exit(rc);
      },
      ::testing::ExitedWithCode(0), "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, MappedClient, ::testing::Values("slab", "mapped"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
