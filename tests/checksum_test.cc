// TIERMEM_CHECKSUM=xxh3: a byte flipped in a swap file behind tiermem's back is found on every
// read path (TM_ERR_CORRUPT naming the tensor, the file and the offset), the bad copy is never
// served, other copies stay intact, and nothing correct is ever flagged.
#include "lib/tiers/checksum.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/io_engine.h"
#include "lib/base/status.h"
#include "lib/tiers/nvme_tier.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

// Exclusive tiers (TIERMEM_DRAM_INCLUSIVE=off) for every runtime of this file: its tests reach
// NVMe itself, for which inclusive DRAM's clean copies would stand in (tests/inclusive_test.cc).
static const tiermem::testing::ScopedEnv kExclusiveTiers("TIERMEM_DRAM_INCLUSIVE", "off");

namespace tiermem {
namespace {

using testing::OffloadNow;
using testing::RandomBytes;
using testing::ScopedEnv;
using testing::SmallConfig;
using testing::TempDir;

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The swap file tiermem keeps open in `dir`: an unnamed file there, seen through /proc/self/fd.
int SwapFd(const std::string& dir) {
  int found = -1;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  while (dirent* e = readdir(d)) {
    char target[4096];
    std::string link = std::string("/proc/self/fd/") + e->d_name;
    ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    std::string t(target, static_cast<size_t>(n));
    if (t.rfind(dir + "/", 0) == 0 && t.ends_with(" (deleted)")) {
      found = std::atoi(e->d_name);
    }
  }
  closedir(d);
  return found;
}

// Offset in the swap file behind `fd` where `pattern` starts (-1 when absent). The file is
// reopened through /proc without O_DIRECT, so any length and offset may be read.
int64_t FindInSwapFile(int fd, const std::vector<uint8_t>& pattern) {
  int f = open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) return -1;
  std::vector<uint8_t> buf(4 << 20);
  int64_t at = -1;
  for (off_t off = 0; at < 0;) {
    ssize_t n = pread(f, buf.data(), buf.size(), off);
    if (n < static_cast<ssize_t>(pattern.size())) break;
    for (ssize_t i = 0; i + static_cast<ssize_t>(pattern.size()) <= n; ++i) {
      if (std::memcmp(buf.data() + i, pattern.data(), pattern.size()) == 0) {
        at = off + i;
        break;
      }
    }
    off += n - static_cast<off_t>(pattern.size());
  }
  close(f);
  return at;
}

// Flips one byte of the swap file behind tiermem's back, and makes it durable so that an
// O_DIRECT read sees it.
bool FlipByte(int fd, int64_t offset) {
  int f = open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDWR | O_CLOEXEC);
  if (f < 0) return false;
  uint8_t b = 0;
  bool ok = pread(f, &b, 1, offset) == 1;
  b ^= 0x5a;
  ok = ok && pwrite(f, &b, 1, offset) == 1 && fsync(f) == 0;
  close(f);
  return ok;
}

uint32_t Residency(tm_runtime rt, tm_tensor t) {
  uint32_t m = 0;
  EXPECT_EQ(tm_tensor_residency(rt, t, &m), TM_OK);
  return m;
}

uint64_t Used(tm_runtime rt, tm_tier tier) {
  tm_stats s = TM_STATS_INIT;
  EXPECT_EQ(tm_runtime_stats(rt, &s), TM_OK);
  return s.tiers[tier].used;
}

// ---- The sums on their own.

TEST(BlockChecksums, RecordsVerifiesAndForgets) {
  BlockChecksums sums(4096);
  const auto data = RandomBytes(3 * 4096 + 100, 1);
  const char* p = reinterpret_cast<const char*>(data.data());
  ASSERT_TRUE(sums.Record(8192, 0, p, data.size()).ok());
  EXPECT_EQ(sums.BlockLength(8192, 3 * 4096), 100u);

  auto whole = sums.Verify(8192, 0, p, data.size());
  EXPECT_FALSE(whole.mismatch.has_value());
  EXPECT_FALSE(whole.unrecorded.has_value());
  EXPECT_TRUE(whole.partial.empty());

  std::vector<uint8_t> bad = data;
  bad[4096 + 7] ^= 1;
  auto check = sums.Verify(8192, 0, reinterpret_cast<const char*>(bad.data()), bad.size());
  ASSERT_TRUE(check.mismatch.has_value());
  EXPECT_EQ(check.mismatch->offset, 4096u);
  EXPECT_EQ(check.mismatch->length, 4096u);
  EXPECT_NE(check.mismatch->expected, check.mismatch->actual);

  // A range starting and ending inside blocks: those two can only be checked whole.
  auto part = sums.Verify(8192, 100, p + 100, 2 * 4096);
  EXPECT_FALSE(part.mismatch.has_value());
  EXPECT_EQ(part.partial, (std::vector<uint64_t>{0, 2 * 4096}));

  // Another extent's sums are its own; a freed extent has none.
  auto other = sums.Verify(0, 0, p, 4096);
  EXPECT_TRUE(other.unrecorded.has_value());
  EXPECT_EQ(sums.extents(), 1u);
  sums.Forget(8192);
  EXPECT_EQ(sums.extents(), 0u);
  EXPECT_TRUE(sums.Verify(8192, 0, p, data.size()).unrecorded.has_value());
}

TEST(BlockChecksums, ReadingPastWhatWasWrittenIsNotVouchedFor) {
  BlockChecksums sums(4096);
  const auto data = RandomBytes(8192, 2);
  const char* p = reinterpret_cast<const char*>(data.data());
  ASSERT_TRUE(sums.Record(0, 0, p, 4096 + 10).ok());
  EXPECT_TRUE(sums.Verify(0, 0, p, 4096 + 10).mismatch == std::nullopt);
  EXPECT_FALSE(sums.Verify(0, 0, p, 4096 + 10).unrecorded.has_value());
  auto past = sums.Verify(0, 0, p, 4096 + 20);
  ASSERT_TRUE(past.unrecorded.has_value());
  EXPECT_EQ(*past.unrecorded, 4096u);
}

TEST(BlockChecksums, AWriteOffABlockBoundaryIsRefused) {
  BlockChecksums sums(4096);
  const auto data = RandomBytes(4096, 3);
  absl::Status s = sums.Record(0, 512, reinterpret_cast<const char*>(data.data()), 4096);
  EXPECT_EQ(ToTmStatus(s), TM_ERR_INTERNAL) << s;
  EXPECT_EQ(sums.extents(), 0u);
}

// ---- The NVMe tier: whole and partial reads on both engines.

class TierTransfer : public ::testing::TestWithParam<bool> {};  // true: io_uring

TEST_P(TierTransfer, PartialReadsCheckWholeBlocks) {
  TempDir dir;
  auto tier = NvmeTier::Create({dir.path()}, 4 << 20, 64 << 10);
  ASSERT_TRUE(tier.ok()) << tier.status();
  constexpr uint64_t kBlock = 16 << 10;
  (*tier)->EnableChecksums(kBlock);
  io::IoEngineOptions opts;
  opts.block_size = 64 << 10;
  std::unique_ptr<io::IoEngine> engine;
  if (GetParam()) {
    auto uring = io::CreateUringEngine(opts);
    if (!uring.ok()) GTEST_SKIP() << "io_uring unavailable: " << uring.status();
    engine = std::move(*uring);
  } else {
    engine = io::CreatePosixEngine(opts);
  }
  const uint64_t bytes = 5 * kBlock + 300;
  auto e = (*tier)->space().Allocate(bytes, "t");
  ASSERT_TRUE(e.ok());
  const uint32_t align = (*tier)->alignment();
  const uint64_t room = (bytes + align - 1) / align * align;
  auto aligned = [&] {
    return std::unique_ptr<char, decltype(&std::free)>(
        static_cast<char*>(std::aligned_alloc(align, room)), &std::free);
  };
  auto src = aligned(), dst = aligned();
  const auto data = RandomBytes(bytes, 4);
  std::memcpy(src.get(), data.data(), bytes);
  ASSERT_TRUE((*tier)->Transfer(*engine, *e, 0, src.get(), bytes, true).ok());

  // From an aligned offset inside block 1 to inside block 3: blocks 1 and 3 are read whole.
  const uint64_t off = kBlock + align, n = 2 * kBlock;
  absl::Status s = (*tier)->Transfer(*engine, *e, off, dst.get(), n, false);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::memcmp(dst.get(), data.data() + off, n), 0);

  // A byte flipped in block 3: found by a read that covers block 3 only in part.
  const int fd = (*tier)->files()[0]->fd();
  ASSERT_TRUE(FlipByte(fd, static_cast<int64_t>(e->offset + 3 * kBlock + kBlock - 5)));
  s = (*tier)->Transfer(*engine, *e, off, dst.get(), n, false);
  EXPECT_EQ(ToTmStatus(s), TM_ERR_CORRUPT) << s;
  EXPECT_TRUE(Contains(std::string(s.message()), dir.path())) << s;
  EXPECT_TRUE(Contains(std::string(s.message()), "fd " + std::to_string(fd))) << s;
  EXPECT_TRUE(
      Contains(std::string(s.message()), "offset " + std::to_string(e->offset + 3 * kBlock)))
      << s;
  // Blocks 0-2 are untouched and still read.
  s = (*tier)->Transfer(*engine, *e, 0, dst.get(), 3 * kBlock, false);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(std::memcmp(dst.get(), data.data(), 3 * kBlock), 0);

  // Freeing the extent drops its sums: the space holds new bytes without a false alarm.
  (*tier)->space().Free(*e);
  EXPECT_EQ((*tier)->checksums()->extents(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Engines, TierTransfer, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "uring" : "posix"; });

// ---- Through the C API, on both engines.

class Corruption : public ::testing::TestWithParam<tm_io_engine> {
 protected:
  void SetUp() override {
    tm_config cfg = SmallConfig(dir_.path(), GetParam());  // staging chunks of 2 MiB
    cfg.checksum = TM_CHECKSUM_XXH3;
    TM_ASSERT_OK(tm_runtime_create(&cfg, &rt_));
  }
  void TearDown() override { EXPECT_EQ(tm_runtime_destroy(rt_), TM_OK) << tm_last_error(); }

  tm_tensor Make(const char* name, const std::vector<uint8_t>& data) {
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = data.size();
    d.home_tier = TM_TIER_HBM;
    d.name = name;
    tm_tensor t{};
    EXPECT_EQ(tm_tensor_create(rt_, &d, &t), TM_OK) << tm_last_error();
    EXPECT_EQ(tm_tensor_write(rt_, t, 0, data.data(), data.size()), TM_OK) << tm_last_error();
    return t;
  }
  // Flips the byte at `at` of a tensor whose bytes `data` are on NVMe.
  void Corrupt(const std::vector<uint8_t>& data, uint64_t at) {
    const int fd = SwapFd(dir_.path());
    ASSERT_GE(fd, 0) << "no unnamed swap file under " << dir_.path() << " in /proc/self/fd";
    const int64_t start = FindInSwapFile(fd, std::vector<uint8_t>(data.begin(), data.begin() + 64));
    ASSERT_GE(start, 0) << "the tensor's bytes are not in the swap file";
    ASSERT_TRUE(FlipByte(fd, start + static_cast<int64_t>(at)));
  }
  // The last failure was TM_ERR_CORRUPT naming the tensor, the swap file's directory and an
  // offset.
  void ExpectCorrupt(tm_status s, const char* name) {
    EXPECT_EQ(s, TM_ERR_CORRUPT) << tm_status_string(s) << ": " << tm_last_error();
    const std::string msg = tm_last_error();
    EXPECT_TRUE(Contains(msg, std::string("\"") + name + "\"")) << msg;
    EXPECT_TRUE(Contains(msg, dir_.path())) << msg;
    EXPECT_TRUE(Contains(msg, "at offset")) << msg;
  }

  TempDir dir_;
  tm_runtime rt_{};
};

TEST_P(Corruption, EveryReadPathRefusesTheBadCopy) {
  const uint64_t bytes = (5ull << 20) + 123;  // three staging chunks, six checksum blocks
  const auto data = RandomBytes(bytes, 10);
  tm_tensor t = Make("victim", data);
  TM_ASSERT_OK(OffloadNow(rt_, t, TM_TIER_NVME));
  const uint64_t bad = (3ull << 20) + 4321;  // in checksum block 3, staging chunk 1
  Corrupt(data, bad);

  std::vector<uint8_t> back(bytes);
  ExpectCorrupt(tm_tensor_read(rt_, t, 0, back.data(), bytes), "victim");
  // A range inside the bad block's staging chunk.
  ExpectCorrupt(tm_tensor_read(rt_, t, bad - 10, back.data(), 20), "victim");
  // Ranges elsewhere hold nothing bad and are served.
  TM_ASSERT_OK(tm_tensor_read(rt_, t, 100, back.data(), 1000));
  EXPECT_EQ(std::memcmp(back.data(), data.data() + 100, 1000), 0);
  TM_ASSERT_OK(tm_tensor_read(rt_, t, (4ull << 20) + 5, back.data(), bytes - (4ull << 20) - 5));
  EXPECT_EQ(std::memcmp(back.data(), data.data() + (4ull << 20) + 5, bytes - (4ull << 20) - 5), 0);

  // Moves up fail transactionally: no copy appears, no space stays taken.
  void* p = nullptr;
  ExpectCorrupt(tm_tensor_acquire(rt_, t, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p), "victim");
  ExpectCorrupt(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p), "victim");
  ExpectCorrupt(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ_WRITE, nullptr, &p),
                "victim");
  TM_ASSERT_OK(tm_tensor_prefetch(rt_, t, TM_TIER_DRAM));
  ExpectCorrupt(tm_tensor_sync(rt_, t), "victim");
  // Its only valid copy is bad: a report of it is not one that lost nothing (an outside client
  // found it flagged TM_ERROR_NOTHING_LOST, so a caller would not resume from a checkpoint).
  EXPECT_EQ(tm_last_error_flags(), 0u) << tm_last_error();
  EXPECT_FALSE(Contains(tm_last_error(), "nothing was lost")) << tm_last_error();
  TM_ASSERT_OK(tm_tensor_prefetch(rt_, t, TM_TIER_HBM));
  ExpectCorrupt(tm_tensor_sync(rt_, t), "victim");
  EXPECT_EQ(tm_last_error_flags(), 0u) << tm_last_error();
  tm_stats st = TM_STATS_INIT;
  TM_ASSERT_OK(tm_runtime_stats(rt_, &st));
  EXPECT_EQ(st.moves_failed_lost, 2u) << "the two failed prefetches, their bytes gone";
  EXPECT_EQ(Residency(rt_, t), TM_TIER_BIT(TM_TIER_NVME));
  EXPECT_EQ(Used(rt_, TM_TIER_HBM), 0u);
  EXPECT_EQ(Used(rt_, TM_TIER_DRAM), 0u);

  // A partial write copies the rest of the tensor from the old extent, the bad chunk too: it
  // fails and changes nothing.
  const uint8_t patch[16] = {1, 2, 3};
  ExpectCorrupt(tm_tensor_write(rt_, t, 10, patch, sizeof patch), "victim");
  ExpectCorrupt(tm_tensor_read(rt_, t, 0, back.data(), bytes), "victim");
  EXPECT_EQ(Residency(rt_, t), TM_TIER_BIT(TM_TIER_NVME));

  // A write that replaces the whole bad chunk never reads it, and heals the tensor.
  TM_ASSERT_OK(tm_tensor_write(rt_, t, 2ull << 20, data.data() + (2ull << 20), 2ull << 20));
  TM_ASSERT_OK(tm_tensor_read(rt_, t, 0, back.data(), bytes));
  EXPECT_TRUE(back == data);
  TM_ASSERT_OK(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  TM_ASSERT_OK(tm_tensor_release(rt_, t, TM_TIER_HBM));
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
}

TEST_P(Corruption, AValidCopyAboveIsStillServed) {
  const uint64_t bytes = (3ull << 20) + 77;
  const auto data = RandomBytes(bytes, 11);
  tm_tensor t = Make("has-dram-copy", data);
  TM_ASSERT_OK(OffloadNow(rt_, t, TM_TIER_NVME));
  void* p = nullptr;
  TM_ASSERT_OK(tm_tensor_acquire(rt_, t, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p));
  TM_ASSERT_OK(tm_tensor_release(rt_, t, TM_TIER_DRAM));
  ASSERT_EQ(Residency(rt_, t), TM_TIER_BIT(TM_TIER_DRAM) | TM_TIER_BIT(TM_TIER_NVME));
  Corrupt(data, 1ull << 20);

  // Reads and moves up come from the DRAM copy; the NVMe copy is not touched.
  std::vector<uint8_t> back(bytes);
  TM_ASSERT_OK(tm_tensor_read(rt_, t, 0, back.data(), bytes));
  EXPECT_TRUE(back == data);
  TM_ASSERT_OK(tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
  TM_ASSERT_OK(tm_tensor_release(rt_, t, TM_TIER_HBM));
  std::fill(back.begin(), back.end(), 0);
  TM_ASSERT_OK(tm_tensor_read(rt_, t, 0, back.data(), bytes));
  EXPECT_TRUE(back == data);

  // Once the good copies are gone, the bad one is refused rather than served.
  TM_ASSERT_OK(OffloadNow(rt_, t, TM_TIER_NVME));
  ASSERT_EQ(Residency(rt_, t), TM_TIER_BIT(TM_TIER_NVME));
  ExpectCorrupt(tm_tensor_read(rt_, t, 0, back.data(), bytes), "has-dram-copy");
  ExpectCorrupt(tm_tensor_acquire(rt_, t, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p),
                "has-dram-copy");
  TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
}

// Moves above 64 MiB hash one segment while the next is read or written: a flip in the first
// segment (found while the second is still being read) and one in the short last segment are
// both caught.
TEST_P(Corruption, LargeMovesAreCheckedSegmentBySegment) {
  const uint64_t bytes = (72ull << 20) + 4097;
  const auto data = RandomBytes(bytes, 13);
  tm_tensor a = Make("large-a", data);
  TM_ASSERT_OK(OffloadNow(rt_, a, TM_TIER_DRAM));
  TM_ASSERT_OK(OffloadNow(rt_, a, TM_TIER_NVME));  // DRAM -> NVMe in one transfer
  Corrupt(data, (20ull << 20) + 3);
  void* p = nullptr;
  ExpectCorrupt(tm_tensor_acquire(rt_, a, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p), "large-a");
  EXPECT_EQ(Residency(rt_, a), TM_TIER_BIT(TM_TIER_NVME));
  EXPECT_EQ(Used(rt_, TM_TIER_DRAM), 0u);
  TM_ASSERT_OK(tm_tensor_destroy(rt_, a));

  const auto other = RandomBytes(bytes, 14);
  tm_tensor b = Make("large-b", other);
  TM_ASSERT_OK(OffloadNow(rt_, b, TM_TIER_DRAM));
  TM_ASSERT_OK(OffloadNow(rt_, b, TM_TIER_NVME));
  TM_ASSERT_OK(tm_tensor_acquire(rt_, b, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p));
  EXPECT_EQ(std::memcmp(p, other.data(), bytes), 0);
  TM_ASSERT_OK(tm_tensor_release(rt_, b, TM_TIER_DRAM));
  TM_ASSERT_OK(OffloadNow(rt_, b, TM_TIER_NVME));
  Corrupt(other, bytes - 2);
  ExpectCorrupt(tm_tensor_acquire(rt_, b, TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p), "large-b");
  TM_ASSERT_OK(tm_tensor_destroy(rt_, b));
}

// Tensors moving through NVMe on several threads at once keep their own sums.
TEST_P(Corruption, ConcurrentMovesNoFalseAlarms) {
  constexpr int kThreads = 4, kRounds = 8;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  std::mutex mu;
  std::string first_error;
  auto fail = [&] {
    std::lock_guard<std::mutex> lock(mu);
    if (failures++ == 0) first_error = tm_last_error();  // this thread's last failure
  };
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      const uint64_t bytes = (1ull << 20) * (i + 1) + 333 * i;
      tm_tensor_desc d = TM_TENSOR_DESC_INIT;
      d.bytes = bytes;
      d.home_tier = TM_TIER_DRAM;
      tm_tensor t{};
      if (tm_tensor_create(rt_, &d, &t) != TM_OK) return fail();
      for (int r = 0; r < kRounds; ++r) {
        const auto data = RandomBytes(bytes, 100 * i + r);
        std::vector<uint8_t> back(bytes);
        void* p = nullptr;
        bool ok = tm_tensor_write(rt_, t, 0, data.data(), bytes) == TM_OK &&
                  OffloadNow(rt_, t, TM_TIER_NVME) == TM_OK &&
                  tm_tensor_read(rt_, t, 0, back.data(), bytes) == TM_OK && back == data &&
                  tm_tensor_acquire(rt_, t, TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p) == TM_OK &&
                  tm_tensor_release(rt_, t, TM_TIER_HBM) == TM_OK;
        if (!ok) fail();
      }
      if (tm_tensor_destroy(rt_, t) != TM_OK) fail();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0) << first_error;
}

// Writes, rewrites and reuse of NVMe space through several tensors: every read is clean.
TEST_P(Corruption, NoFalseAlarms) {
  const uint64_t sizes[] = {1, 4095, (1ull << 20) + 7, (2ull << 20) + 4096, (6ull << 20) + 3};
  std::vector<tm_tensor> ts;
  std::vector<std::vector<uint8_t>> datas;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    datas.push_back(RandomBytes(sizes[i], 20 + i));
    ts.push_back(Make(("t" + std::to_string(i)).c_str(), datas.back()));
    TM_ASSERT_OK(OffloadNow(rt_, ts.back(), TM_TIER_NVME));
  }
  // A neighbour's partial writes on NVMe, and a tensor freed and its space reused.
  for (size_t i = 0; i < ts.size(); ++i) {
    const uint64_t off = sizes[i] / 3, n = std::max<uint64_t>(1, sizes[i] / 5);
    auto patch = RandomBytes(n, 40 + i);
    TM_ASSERT_OK(tm_tensor_write(rt_, ts[i], off, patch.data(), n));
    std::memcpy(datas[i].data() + off, patch.data(), n);
  }
  TM_ASSERT_OK(tm_tensor_destroy(rt_, ts[1]));
  datas[1] = RandomBytes(sizes[1], 50);
  ts[1] = Make("t1-again", datas[1]);
  TM_ASSERT_OK(OffloadNow(rt_, ts[1], TM_TIER_NVME));
  for (size_t i = 0; i < ts.size(); ++i) {
    std::vector<uint8_t> back(sizes[i]);
    TM_ASSERT_OK(tm_tensor_read(rt_, ts[i], 0, back.data(), sizes[i]));
    EXPECT_TRUE(back == datas[i]) << i;
    if (sizes[i] > 10) {  // a partial read through the staging slot
      TM_ASSERT_OK(tm_tensor_read(rt_, ts[i], sizes[i] - 9, back.data(), 9));
      EXPECT_EQ(std::memcmp(back.data(), datas[i].data() + sizes[i] - 9, 9), 0);
    }
    void* p = nullptr;
    TM_ASSERT_OK(tm_tensor_acquire(rt_, ts[i], TM_TIER_HBM, TM_ACCESS_READ, nullptr, &p));
    TM_ASSERT_OK(tm_tensor_release(rt_, ts[i], TM_TIER_HBM));
    TM_ASSERT_OK(OffloadNow(rt_, ts[i], TM_TIER_DRAM));
    TM_ASSERT_OK(OffloadNow(rt_, ts[i], TM_TIER_NVME));
    TM_ASSERT_OK(tm_tensor_acquire(rt_, ts[i], TM_TIER_DRAM, TM_ACCESS_READ, nullptr, &p));
    EXPECT_EQ(std::memcmp(p, datas[i].data(), sizes[i]), 0) << i;
    TM_ASSERT_OK(tm_tensor_release(rt_, ts[i], TM_TIER_DRAM));
  }
  for (tm_tensor t : ts) TM_ASSERT_OK(tm_tensor_destroy(rt_, t));
  EXPECT_EQ(Used(rt_, TM_TIER_NVME), 0u);
}

INSTANTIATE_TEST_SUITE_P(Engines, Corruption,
                         ::testing::Values(TM_IO_ENGINE_URING, TM_IO_ENGINE_POSIX),
                         [](const auto& info) {
                           return info.param == TM_IO_ENGINE_URING ? "uring" : "posix";
                         });

// With checksums off (the default) the same flip goes unnoticed: what the disk holds is served.
// This also proves the flip above reaches what tiermem reads.
TEST(ChecksumOff, TrustsTheDisk) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt;
  TM_ASSERT_OK(tm_runtime_create(&cfg, &rt));
  char value[16];
  TM_ASSERT_OK(tm_runtime_config_value(rt, "TIERMEM_CHECKSUM", value, sizeof value, nullptr));
  EXPECT_STREQ(value, "off");
  const uint64_t bytes = 2ull << 20;
  const auto data = RandomBytes(bytes, 12);
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = bytes;
  tm_tensor t;
  TM_ASSERT_OK(tm_tensor_create(rt, &d, &t));
  TM_ASSERT_OK(tm_tensor_write(rt, t, 0, data.data(), bytes));
  TM_ASSERT_OK(OffloadNow(rt, t, TM_TIER_NVME));
  const int fd = SwapFd(dir.path());
  ASSERT_GE(fd, 0);
  const int64_t start = FindInSwapFile(fd, std::vector<uint8_t>(data.begin(), data.begin() + 64));
  ASSERT_GE(start, 0);
  ASSERT_TRUE(FlipByte(fd, start + 1000));
  std::vector<uint8_t> back(bytes);
  TM_ASSERT_OK(tm_tensor_read(rt, t, 0, back.data(), bytes));
  EXPECT_EQ(back[1000], data[1000] ^ 0x5a);
  back[1000] = data[1000];
  EXPECT_TRUE(back == data);
  TM_ASSERT_OK(tm_runtime_destroy(rt));
}

TEST(ChecksumConfig, EnvironmentFieldAndOldCallers) {
  TempDir dir;
  ScopedEnv env("TIERMEM_CHECKSUM", "XXH3");
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt;
  TM_ASSERT_OK(tm_runtime_create(&cfg, &rt));
  char value[16];
  TM_ASSERT_OK(tm_runtime_config_value(rt, "TIERMEM_CHECKSUM", value, sizeof value, nullptr));
  EXPECT_STREQ(value, "xxh3");
  TM_ASSERT_OK(tm_runtime_destroy(rt));

  cfg.checksum = TM_CHECKSUM_OFF;  // the field wins over the environment
  TM_ASSERT_OK(tm_runtime_create(&cfg, &rt));
  TM_ASSERT_OK(tm_runtime_config_value(rt, "TIERMEM_CHECKSUM", value, sizeof value, nullptr));
  EXPECT_STREQ(value, "off");
  TM_ASSERT_OK(tm_runtime_destroy(rt));

  cfg.checksum = static_cast<tm_checksum>(7);
  EXPECT_EQ(tm_runtime_create(&cfg, &rt), TM_ERR_CONFIG);
  EXPECT_TRUE(Contains(tm_last_error(), "tm_config.checksum")) << tm_last_error();
  // A caller built before the field existed: it is not read.
  cfg.struct_size = offsetof(tm_config, checksum);
  TM_ASSERT_OK(tm_runtime_create(&cfg, &rt));
  TM_ASSERT_OK(tm_runtime_destroy(rt));

  ScopedEnv bad("TIERMEM_CHECKSUM", "crc32");
  cfg.struct_size = sizeof cfg;
  cfg.checksum = TM_CHECKSUM_DEFAULT;
  EXPECT_EQ(tm_runtime_create(&cfg, &rt), TM_ERR_CONFIG);
  EXPECT_TRUE(Contains(tm_last_error(), "TIERMEM_CHECKSUM")) << tm_last_error();
  EXPECT_STREQ(tm_status_string(TM_ERR_CORRUPT), "TM_ERR_CORRUPT");
}

}  // namespace
}  // namespace tiermem
