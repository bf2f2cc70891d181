// Inclusive DRAM (TIERMEM_DRAM_INCLUSIVE, lib/runtime/write_through.cc): an offload to NVMe
// keeps a clean DRAM copy while DRAM has free room; moves up read it instead of NVMe, bit-exact;
// eviction drops clean copies before it writes a dirty one, for demands always; the switch off
// gives exclusive tiers; a process killed during write-throughs loses nothing it synced.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/runtime/runtime.h"
#include "test_runtime.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::NewTensor;
using testing::RandomBytes;
using testing::ReadAll;
using testing::TempDir;

constexpr uint64_t kMiB = 1 << 20;

std::unique_ptr<Runtime> MakeRuntime(const std::string& dir, uint64_t hbm, uint64_t dram,
                                     bool inclusive) {
  ConfigOverrides o = testing::Emulated(dir, hbm, dram, 256 * kMiB);
  o.prefetch_depth = 0;
  o.log_level = LogLevel::kError;
  auto rt = testing::MakeRuntime(o, {{"TIERMEM_DRAM_INCLUSIVE", inclusive ? "on" : "off"}});
  if (rt != nullptr) {
    EXPECT_EQ(rt->config().dram_inclusive, inclusive);
  }
  return rt;
}

uint64_t FreeBytes(Runtime& rt, tm_tier tier) {
  uint64_t free = 0;
  for (const auto& b : rt.Layout(tier)) free += b.free ? b.size : 0;
  return free;
}

// The block of `h` in the NVMe tier's layout (its offset in the one swap file), or -1.
int64_t NvmeOffset(Runtime& rt, uint64_t h) {
  for (const auto& b : rt.Layout(TM_TIER_NVME)) {
    if (!b.free && b.owner == h) return static_cast<int64_t>(b.offset);
  }
  return -1;
}

// The swap file of process `pid` under `dir`, opened here through /proc: the parent's own
// reference to its (unlinked) inode, which outlives the process.
int OpenSwapFileOf(pid_t pid, const std::string& dir) {
  for (int fd = 0; fd < 1024; ++fd) {
    const std::string link = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    char target[4096];
    const ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (std::string(target).rfind(dir + "/", 0) == 0) return open(link.c_str(), O_RDONLY);
  }
  return -1;
}

constexpr uint32_t kHbm = TM_TIER_BIT(TM_TIER_HBM), kDram = TM_TIER_BIT(TM_TIER_DRAM),
                   kNvme = TM_TIER_BIT(TM_TIER_NVME);

// From HBM: the offload writes NVMe and keeps a DRAM copy; the move back up reads DRAM, not
// NVMe, and serves the very bytes written. Off: exclusive tiers, the bytes come from NVMe.
TEST(InclusiveTest, MoveUpReadsTheCleanCopyBitExact) {
  for (bool inclusive : {true, false}) {
    SCOPED_TRACE(inclusive ? "inclusive" : "exclusive");
    TempDir dir;
    auto rt = MakeRuntime(dir.path(), 32 * kMiB, 32 * kMiB, inclusive);
    ASSERT_NE(rt, nullptr);
    const uint64_t n = 3 * kMiB + 4321;  // not a multiple of any granule
    const std::vector<uint8_t> bytes = RandomBytes(n, 7);
    const uint64_t h = NewTensor(*rt, "act", n, TM_TIER_HBM);
    ASSERT_TRUE(rt->Write(h, 0, bytes.data(), n).ok());
    ASSERT_EQ(*rt->Residency(h), kHbm);
    ASSERT_TRUE(rt->Offload(h, TM_TIER_NVME).ok());
    ASSERT_TRUE(rt->Sync(h).ok());
    const tm_stats before = rt->Stats();
    EXPECT_EQ(*rt->Residency(h), inclusive ? kDram | kNvme : kNvme);
    EXPECT_EQ(before.write_throughs, inclusive ? 1u : 0u);
    EXPECT_EQ(before.write_through_bytes, inclusive ? n : 0u);
    // Whatever kept a DRAM copy, NVMe got every byte: the offload's meaning is unchanged.
    EXPECT_EQ(before.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME] +
                  before.bytes_moved[TM_TIER_HBM][TM_TIER_NVME],
              n);

    auto p = rt->Acquire(h, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(std::memcmp(*p, bytes.data(), n), 0) << "the bytes moved up differ";
    ASSERT_TRUE(rt->Release(h, TM_TIER_HBM).ok());
    const tm_stats after = rt->Stats();
    const uint64_t nvme_read = after.bytes_moved[TM_TIER_NVME][TM_TIER_HBM] +
                               after.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM] -
                               before.bytes_moved[TM_TIER_NVME][TM_TIER_HBM] -
                               before.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM];
    EXPECT_EQ(nvme_read, inclusive ? 0u : n);
    EXPECT_EQ(after.clean_reads, inclusive ? 1u : 0u);
    EXPECT_EQ(after.clean_read_bytes, inclusive ? n : 0u);

    // Changed in HBM and offloaded again: the DRAM copy kept the first time is stale now, and
    // the second move up must serve the new bytes, from a fresh clean copy.
    std::vector<uint8_t> changed = bytes;
    for (uint64_t i = 0; i < n; i += 4099) changed[i] ^= 0x5a;
    changed[n - 1] ^= 0xa5;
    auto w = rt->Acquire(h, TM_TIER_HBM, TM_ACCESS_READ_WRITE, nullptr);
    ASSERT_TRUE(w.ok()) << w.status();
    std::memcpy(*w, changed.data(), n);
    ASSERT_TRUE(rt->Release(h, TM_TIER_HBM).ok());
    ASSERT_TRUE(rt->Offload(h, TM_TIER_NVME).ok());
    ASSERT_TRUE(rt->Sync(h).ok());
    EXPECT_EQ(*rt->Residency(h), inclusive ? kDram | kNvme : kNvme);
    auto q = rt->Acquire(h, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
    ASSERT_TRUE(q.ok()) << q.status();
    EXPECT_EQ(std::memcmp(*q, changed.data(), n), 0) << "a stale copy was served";
    ASSERT_TRUE(rt->Release(h, TM_TIER_HBM).ok());
    EXPECT_EQ(rt->Stats().clean_reads, inclusive ? 2u : 0u);
    // And NVMe holds the new bytes too (read from the swap file itself): dropping the DRAM copy
    // loses nothing.
    const int swap = OpenSwapFileOf(getpid(), dir.path());
    ASSERT_GE(swap, 0);
    std::vector<uint8_t> on_nvme(n);
    EXPECT_EQ(pread(swap, on_nvme.data(), n, NvmeOffset(*rt, h)), static_cast<ssize_t>(n));
    close(swap);
    EXPECT_EQ(on_nvme, changed) << "NVMe holds stale bytes";
  }
}

// An acquire in DRAM (the CPU optimizer's way to its state) of a copy a write-through kept reads
// no NVMe, and counts as a clean read once: the acquires after it hit the copy exclusive tiers
// would have read in too.
TEST(InclusiveTest, DramAcquireOfTheCleanCopyCountsOnce) {
  for (bool inclusive : {true, false}) {
    SCOPED_TRACE(inclusive ? "inclusive" : "exclusive");
    TempDir dir;
    auto rt = MakeRuntime(dir.path(), 32 * kMiB, 32 * kMiB, inclusive);
    ASSERT_NE(rt, nullptr);
    const uint64_t n = kMiB + 17;
    const std::vector<uint8_t> bytes = RandomBytes(n, 3);
    const uint64_t h = NewTensor(*rt, "exp_avg", n, TM_TIER_DRAM);
    ASSERT_TRUE(rt->Write(h, 0, bytes.data(), n).ok());
    ASSERT_TRUE(rt->Offload(h, TM_TIER_NVME).ok());
    ASSERT_TRUE(rt->Sync(h).ok());
    for (int i = 0; i < 3; ++i) {
      auto p = rt->Acquire(h, TM_TIER_DRAM, TM_ACCESS_READ, nullptr);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(std::memcmp(*p, bytes.data(), n), 0);
      ASSERT_TRUE(rt->Release(h, TM_TIER_DRAM).ok());
    }
    const tm_stats st = rt->Stats();
    EXPECT_EQ(st.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM], inclusive ? 0u : n);
    EXPECT_EQ(st.clean_reads, inclusive ? 1u : 0u);
    EXPECT_EQ(st.clean_read_bytes, inclusive ? n : 0u);
  }
}

// Read-through: a prefetch of an NVMe tensor to HBM goes through DRAM and keeps that copy, so
// that the tensor's next move up reads DRAM, bit-exact; exclusive tiers read NVMe again.
TEST(InclusiveTest, PrefetchFromNvmeReadsThroughDram) {
  for (bool inclusive : {true, false}) {
    SCOPED_TRACE(inclusive ? "inclusive" : "exclusive");
    TempDir dir;
    auto rt = MakeRuntime(dir.path(), 32 * kMiB, 32 * kMiB, inclusive);
    ASSERT_NE(rt, nullptr);
    const uint64_t n = 2 * kMiB + 99;
    const std::vector<uint8_t> bytes = RandomBytes(n, 21);
    const uint64_t h = NewTensor(*rt, "param", n, TM_TIER_NVME);
    ASSERT_TRUE(rt->Write(h, 0, bytes.data(), n).ok());
    ASSERT_EQ(*rt->Residency(h), kNvme);
    const tm_stats start = rt->Stats();
    ASSERT_TRUE(rt->Prefetch(h, TM_TIER_HBM).ok());
    ASSERT_TRUE(rt->Sync(h).ok());
    EXPECT_EQ(*rt->Residency(h), inclusive ? kHbm | kDram | kNvme : kHbm | kNvme);
    const tm_stats first = rt->Stats();
    EXPECT_EQ(first.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM] +
                  first.bytes_moved[TM_TIER_NVME][TM_TIER_HBM],
              n);
    EXPECT_EQ(first.clean_reads, 0u) << "the move that made the copy read NVMe: nothing saved";
    // HBM's copy dropped (NVMe holds the bytes), then wanted again.
    ASSERT_TRUE(rt->Offload(h, TM_TIER_NVME).ok());
    ASSERT_TRUE(rt->Sync(h).ok());
    ASSERT_EQ(*rt->Residency(h), inclusive ? kDram | kNvme : kNvme);
    auto p = rt->Acquire(h, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(std::memcmp(*p, bytes.data(), n), 0) << "the bytes moved up differ";
    ASSERT_TRUE(rt->Release(h, TM_TIER_HBM).ok());
    const tm_stats after = rt->Stats();
    EXPECT_EQ(after.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM] +
                  after.bytes_moved[TM_TIER_NVME][TM_TIER_HBM],
              inclusive ? n : 2 * n);
    EXPECT_EQ(after.clean_read_bytes, inclusive ? n : 0u);
    EXPECT_EQ(after.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME],
              start.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME])
        << "a clean copy was written";
  }
}

// Fills DRAM with dirty copies (DRAM-homed tensors) and one clean copy (written through), the
// clean one used most recently so that the weighted cost alone would rather write an old dirty
// copy down. A demand for room must drop the clean copy and write nothing.
TEST(InclusiveTest, CleanCopyDroppedBeforeAnythingDirtyIsWritten) {
  TempDir dir;
  auto rt = MakeRuntime(dir.path(), 32 * kMiB, 16 * kMiB, true);
  ASSERT_NE(rt, nullptr);
  const uint64_t n = kMiB;
  const std::vector<uint8_t> clean_bytes = RandomBytes(n, 1);
  const uint64_t clean = NewTensor(*rt, "clean", n, TM_TIER_DRAM);
  ASSERT_TRUE(rt->Write(clean, 0, clean_bytes.data(), n).ok());
  ASSERT_TRUE(rt->Offload(clean, TM_TIER_NVME).ok());
  ASSERT_TRUE(rt->Sync(clean).ok());
  ASSERT_EQ(*rt->Residency(clean), kDram | kNvme);
  std::vector<uint64_t> dirty;
  while (FreeBytes(*rt, TM_TIER_DRAM) >= rt->Rounded(TM_TIER_DRAM, n)) {
    const uint64_t h = NewTensor(*rt, "dirty" + std::to_string(dirty.size()), n, TM_TIER_DRAM);
    const std::vector<uint8_t> b = RandomBytes(n, 100 + dirty.size());
    ASSERT_TRUE(rt->Write(h, 0, b.data(), n).ok());
    ASSERT_EQ(*rt->Residency(h), kDram);
    dirty.push_back(h);
  }
  ASSERT_GE(dirty.size(), 4u);
  ASSERT_EQ(rt->Stats().evictions, 0u) << "filling DRAM evicted already";
  // The clean copy used over and over, last: by the weighted cost alone (twice for a dirty copy,
  // but many times more for a copy used lately) an old dirty copy would be written down first.
  for (int round = 0; round < 32; ++round) EXPECT_EQ(ReadAll(*rt, clean, n), clean_bytes);
  const tm_stats before = rt->Stats();

  const uint64_t extra = NewTensor(*rt, "extra", n, TM_TIER_DRAM);
  const std::vector<uint8_t> extra_bytes = RandomBytes(n, 99);
  ASSERT_TRUE(rt->Write(extra, 0, extra_bytes.data(), n).ok());
  const tm_stats after = rt->Stats();
  EXPECT_EQ(after.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME],
            before.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME])
      << "a dirty copy was written down while a clean one could be dropped";
  EXPECT_EQ(after.clean_drops - before.clean_drops, 1u);
  EXPECT_EQ(after.clean_drop_bytes - before.clean_drop_bytes, n);
  EXPECT_EQ(after.evictions - before.evictions, 1u);
  EXPECT_EQ(*rt->Residency(clean), kNvme);
  for (uint64_t h : dirty) EXPECT_EQ(*rt->Residency(h), kDram);
  // The dropped copy's bytes are still the tensor's: NVMe had them.
  EXPECT_EQ(ReadAll(*rt, clean, n), clean_bytes);
}

// An HBM demand whose eviction writes a dirty HBM copy down to a DRAM full of copies: the
// write-down takes the room of a clean DRAM copy (dropped), never writes a dirty DRAM copy to
// NVMe, and the demand does not wait.
TEST(InclusiveTest, DemandNeverWaitsForAWriteACleanDropAvoids) {
  TempDir dir;
  auto rt = MakeRuntime(dir.path(), 4 * kMiB, 16 * kMiB, true);
  ASSERT_NE(rt, nullptr);
  const uint64_t n = kMiB;
  // Clean DRAM copies: written through from DRAM.
  std::vector<uint64_t> clean;
  for (int i = 0; i < 3; ++i) {
    const uint64_t h = NewTensor(*rt, "clean" + std::to_string(i), n, TM_TIER_DRAM);
    const std::vector<uint8_t> b = RandomBytes(n, 10 + i);
    ASSERT_TRUE(rt->Write(h, 0, b.data(), n).ok());
    ASSERT_TRUE(rt->Offload(h, TM_TIER_NVME).ok());
    ASSERT_TRUE(rt->Sync(h).ok());
    ASSERT_EQ(*rt->Residency(h), kDram | kNvme);
    clean.push_back(h);
  }
  // The rest of DRAM: dirty copies.
  int d = 0;
  while (FreeBytes(*rt, TM_TIER_DRAM) >= rt->Rounded(TM_TIER_DRAM, n)) {
    const uint64_t h = NewTensor(*rt, "dirty" + std::to_string(d), n, TM_TIER_DRAM);
    const std::vector<uint8_t> b = RandomBytes(n, 50 + d++);
    ASSERT_TRUE(rt->Write(h, 0, b.data(), n).ok());
  }
  // HBM full of dirty copies.
  std::vector<uint64_t> hot;
  std::vector<std::vector<uint8_t>> hot_bytes;
  while (FreeBytes(*rt, TM_TIER_HBM) >= rt->Rounded(TM_TIER_HBM, n)) {
    hot.push_back(NewTensor(*rt, "hot" + std::to_string(hot.size()), n, TM_TIER_HBM));
    hot_bytes.push_back(RandomBytes(n, 200 + hot.size()));
    ASSERT_TRUE(rt->Write(hot.back(), 0, hot_bytes.back().data(), n).ok());
  }
  ASSERT_FALSE(hot.empty());
  // The clean copies used over and over, last: by the weighted cost alone (twice for a dirty
  // copy, but many times more for a copy used lately) the old dirty copies would go first, so
  // only the clean-first rule drops a clean one.
  for (int round = 0; round < 16; ++round) {
    for (uint64_t h : clean) ReadAll(*rt, h, n);
  }
  const tm_stats before = rt->Stats();
  const uint64_t h = NewTensor(*rt, "demand", n, TM_TIER_HBM);
  auto p = rt->Acquire(h, TM_TIER_HBM, TM_ACCESS_WRITE, nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(rt->Release(h, TM_TIER_HBM).ok());
  const tm_stats after = rt->Stats();
  EXPECT_EQ(after.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME],
            before.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME])
      << "the write-down wrote a dirty DRAM copy to NVMe";
  EXPECT_EQ(after.bytes_moved[TM_TIER_HBM][TM_TIER_NVME],
            before.bytes_moved[TM_TIER_HBM][TM_TIER_NVME]);
  EXPECT_EQ(
      after.bytes_moved[TM_TIER_HBM][TM_TIER_DRAM] - before.bytes_moved[TM_TIER_HBM][TM_TIER_DRAM],
      n);
  EXPECT_EQ(after.clean_drops - before.clean_drops, 1u);
  EXPECT_EQ(after.demand_waits, before.demand_waits);
  for (size_t i = 0; i < hot.size(); ++i) EXPECT_EQ(ReadAll(*rt, hot[i], n), hot_bytes[i]);
}

// Do no harm: with DRAM full, an offload from HBM keeps no DRAM copy and evicts nothing there.
TEST(InclusiveTest, NoFreeRoomKeepsNoCopyAndEvictsNothing) {
  TempDir dir;
  auto rt = MakeRuntime(dir.path(), 16 * kMiB, 8 * kMiB, true);
  ASSERT_NE(rt, nullptr);
  const uint64_t n = kMiB;
  int d = 0;
  while (FreeBytes(*rt, TM_TIER_DRAM) >= rt->Rounded(TM_TIER_DRAM, n)) {
    const uint64_t h = NewTensor(*rt, "dram" + std::to_string(d), n, TM_TIER_DRAM);
    const std::vector<uint8_t> b = RandomBytes(n, d++);
    ASSERT_TRUE(rt->Write(h, 0, b.data(), n).ok());
  }
  const std::vector<uint8_t> bytes = RandomBytes(n, 77);
  const uint64_t h = NewTensor(*rt, "act", n, TM_TIER_HBM);
  ASSERT_TRUE(rt->Write(h, 0, bytes.data(), n).ok());
  const tm_stats before = rt->Stats();
  ASSERT_TRUE(rt->Offload(h, TM_TIER_NVME).ok());
  ASSERT_TRUE(rt->Sync(h).ok());
  const tm_stats after = rt->Stats();
  EXPECT_EQ(*rt->Residency(h), kNvme);
  EXPECT_EQ(after.evictions, before.evictions);
  EXPECT_EQ(after.write_throughs, 0u);
  // Through staging, counted as its two legs (HBM -> DRAM, DRAM -> NVMe).
  EXPECT_EQ(after.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME] -
                before.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME],
            n);
  EXPECT_EQ(ReadAll(*rt, h, n), bytes);
}

// The counters say what was written through: offloading again a tensor that NVMe already holds
// (its clean DRAM copy kept) writes nothing, and counts nothing.
TEST(InclusiveTest, OffloadOfWhatNvmeHoldsCountsNoWriteThrough) {
  TempDir dir;
  auto rt = MakeRuntime(dir.path(), 32 * kMiB, 32 * kMiB, true);
  ASSERT_NE(rt, nullptr);
  const uint64_t n = kMiB + 3;
  const std::vector<uint8_t> bytes = RandomBytes(n, 11);
  const uint64_t h = NewTensor(*rt, "w", n, TM_TIER_HBM);
  ASSERT_TRUE(rt->Write(h, 0, bytes.data(), n).ok());
  ASSERT_TRUE(rt->Offload(h, TM_TIER_NVME).ok());
  ASSERT_TRUE(rt->Sync(h).ok());
  ASSERT_EQ(*rt->Residency(h), kDram | kNvme);
  const tm_stats once = rt->Stats();
  EXPECT_EQ(once.write_throughs, 1u);
  EXPECT_EQ(once.write_through_bytes, n);
  ASSERT_TRUE(rt->Offload(h, TM_TIER_NVME).ok());
  ASSERT_TRUE(rt->Sync(h).ok());
  const tm_stats twice = rt->Stats();
  EXPECT_EQ(twice.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME],
            once.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME]);
  EXPECT_EQ(twice.write_throughs, 1u);
  EXPECT_EQ(twice.write_through_bytes, n);
  EXPECT_EQ(*rt->Residency(h), kDram | kNvme);
  EXPECT_EQ(ReadAll(*rt, h, n), bytes);
}

// kill -9 while write-throughs are in flight: every tensor whose offload had synced is on NVMe,
// bit-exact, though its DRAM copy (and the process) is gone. A child process writes through
// tensors, reports each synced one (handle's extent) on a pipe, then keeps offloading without
// syncing until the parent, holding the swap file open through /proc, kills it.
TEST(InclusiveTest, KillDuringWriteThroughLosesNothingSynced) {
  TempDir dir;
  const uint64_t n = 2 * kMiB + 777;
  constexpr int kSynced = 6;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(fds[0]);
    auto rt = MakeRuntime(dir.path(), 64 * kMiB, 64 * kMiB, true);
    if (rt == nullptr) _exit(3);
    for (int i = 0;; ++i) {
      const uint64_t h = NewTensor(*rt, "t" + std::to_string(i), n, TM_TIER_HBM);
      const std::vector<uint8_t> b = RandomBytes(n, 1000 + i);
      if (!rt->Write(h, 0, b.data(), n).ok() || !rt->Offload(h, TM_TIER_NVME).ok()) _exit(4);
      if (i >= kSynced) continue;  // in flight when the kill comes
      if (!rt->Sync(h).ok()) _exit(5);
      // Written through: a DRAM copy kept, the bytes on NVMe.
      if (*rt->Residency(h) != (kDram | kNvme)) _exit(6);
      const int64_t off = NvmeOffset(*rt, h);
      if (off < 0 || write(fds[1], &off, sizeof off) != sizeof off) _exit(7);
    }
  }
  close(fds[1]);
  std::vector<int64_t> offsets;
  int64_t off = 0;
  while (offsets.size() < kSynced && read(fds[0], &off, sizeof off) == sizeof off) {
    offsets.push_back(off);
  }
  const int swap = offsets.size() == kSynced ? OpenSwapFileOf(child, dir.path()) : -1;
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  close(fds[0]);
  ASSERT_EQ(offsets.size(), static_cast<size_t>(kSynced))
      << "the child stopped early: exit status " << WEXITSTATUS(status);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "killed mid-run";
  ASSERT_GE(swap, 0) << "no swap file of the child under " << dir.path();
  for (int i = 0; i < kSynced; ++i) {
    std::vector<uint8_t> got(n);
    ASSERT_EQ(pread(swap, got.data(), n, offsets[i]), static_cast<ssize_t>(n));
    EXPECT_EQ(got, RandomBytes(n, 1000 + i)) << "synced tensor " << i << " is not on NVMe";
  }
  close(swap);
}

}  // namespace
}  // namespace tiermem
