// io/ on its own: swap files (unnamed, 0600, reserved, aligned), the striping map, and both
// engines moving bytes exactly, with odd pieces and many pieces in flight.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "io/fault_injection.h"
#include "io/io_engine.h"
#include "io/swap_file.h"
#include "lib/tiers/nvme_tier.h"
#include "test_util.h"

namespace tiermem {
namespace {

using testing::RandomBytes;
using testing::TempDir;

TEST(SwapFile, UnnamedPrivateReservedAligned) {
  TempDir dir;
  auto f = io::SwapFile::Create(dir.path(), 8 << 20);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(dir.Entries(), 0) << "a swap file must leave no name behind";
  struct stat st = {};
  ASSERT_EQ(fstat((*f)->fd(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 8 << 20);
  EXPECT_GE(static_cast<uint64_t>(st.st_blocks) * 512, 8u << 20) << "space was not reserved";
  EXPECT_TRUE((*f)->reserved());
  EXPECT_TRUE((*f)->direct()) << "ext4 under /var/tmp accepts O_DIRECT";
  EXPECT_GE((*f)->alignment(), 512u);
  EXPECT_EQ((*f)->alignment() & ((*f)->alignment() - 1), 0u);
  EXPECT_NE(fcntl((*f)->fd(), F_GETFL) & O_DIRECT, 0);
}

TEST(SwapFile, BadDirectories) {
  auto missing = io::SwapFile::Create("/nonexistent/dir", 4096);
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("/nonexistent/dir"), absl::string_view::npos);
  auto file = io::SwapFile::Create("/etc/hostname", 4096);
  EXPECT_TRUE(absl::IsFailedPrecondition(file.status())) << file.status();
}

TEST(SwapFile, AlignmentProbeAnswers) {
  TempDir dir;
  int fd = open(dir.path().c_str(), O_TMPFILE | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  std::string source;
  uint32_t a = io::ProbeDirectIoAlignment(fd, &source);
  close(fd);
  EXPECT_GE(a, 512u);
  EXPECT_LE(a, 65536u);
  EXPECT_FALSE(source.empty());
}

TEST(NvmeTier, StripesRoundRobinAtBlockGranularity) {
  TempDir a, b, c;
  auto tier = NvmeTier::Create({a.path(), b.path(), c.path()}, 3 << 20, 64 << 10);
  ASSERT_TRUE(tier.ok()) << tier.status();
  Extent e{64 << 10, 5 * (64 << 10) + 100, 0};  // starts on stripe 1
  std::vector<char> buf(e.size + 4096);
  auto reqs = (*tier)->Requests(e, 0, buf.data(), e.size, true);
  ASSERT_EQ(reqs.size(), 6u);
  const auto& files = (*tier)->files();
  for (size_t i = 0; i < reqs.size(); ++i) {
    uint64_t stripe = 1 + i;
    EXPECT_EQ(reqs[i].fd, files[stripe % 3]->fd()) << i;
    EXPECT_EQ(reqs[i].offset, (stripe / 3) * (64 << 10)) << i;
    EXPECT_EQ(reqs[i].buffer, buf.data() + i * (64 << 10)) << i;
    EXPECT_TRUE(reqs[i].write);
  }
  // The tail is rounded up to the alignment.
  EXPECT_EQ(reqs.back().length % (*tier)->alignment(), 0u);
  EXPECT_GE(reqs.back().length, 100u);
}

class Engines : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<io::IoEngine> Make(uint32_t block, uint32_t depth, uint32_t threads = 1) {
    io::IoEngineOptions o;
    o.block_size = block;
    o.queue_depth = depth;
    o.threads = threads;
    if (!GetParam()) return io::CreatePosixEngine(o);
    auto e = io::CreateUringEngine(o);
    if (!e.ok()) return nullptr;
    return std::move(*e);
  }
};

TEST_P(Engines, ManyPiecesExactBytes) {
  auto engine = Make(64 << 10, 8);
  if (engine == nullptr) GTEST_SKIP() << "io_uring is unavailable here";
  TempDir dir;
  auto f = io::SwapFile::Create(dir.path(), 16 << 20);
  ASSERT_TRUE(f.ok());
  const uint64_t n = 16 << 20;
  void* out = nullptr;
  void* in = nullptr;
  ASSERT_EQ(posix_memalign(&out, 4096, n), 0);
  ASSERT_EQ(posix_memalign(&in, 4096, n), 0);
  auto data = RandomBytes(n, 5);
  std::memcpy(out, data.data(), n);
  // Two requests, one of them in the middle of the file.
  io::IoRequest w[2] = {
      {(*f)->fd(), 0, out, n / 2, true, (*f)->alignment(), "t"},
      {(*f)->fd(), n / 2, static_cast<char*>(out) + n / 2, n / 2, true, (*f)->alignment(), "t"}};
  ASSERT_TRUE(engine->Run(w).ok());
  io::IoRequest r{(*f)->fd(), 0, in, n, false, (*f)->alignment(), "t"};
  ASSERT_TRUE(engine->Run({&r, 1}).ok());
  EXPECT_EQ(std::memcmp(in, data.data(), n), 0);
  std::free(out);
  std::free(in);
}

// A file system that refuses O_DIRECT (ramfs has no direct I/O): the swap file falls back to
// buffered I/O, says so, and unaligned buffers, offsets and lengths work through both engines.
TEST_P(Engines, BufferedWhereODirectIsRefused) {
  auto engine = Make(64 << 10, 4);
  if (engine == nullptr) GTEST_SKIP() << "io_uring is unavailable here";
  TempDir mnt;
  if (mount("tiermem-test", mnt.path().c_str(), "ramfs", 0, nullptr) != 0) {
    GTEST_SKIP() << "cannot mount a ramfs here (" << std::strerror(errno)
                 << "): needs root and mount permission";
  }
  {
    auto f = io::SwapFile::Create(mnt.path(), 4 << 20);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_FALSE((*f)->direct());
    EXPECT_EQ((*f)->alignment(), 1u);
    EXPECT_EQ((*f)->alignment_source(), "buffered");
    EXPECT_EQ(fcntl((*f)->fd(), F_GETFL) & O_DIRECT, 0);
    // ramfs has no fallocate either: the file is sized, not reserved, and says so.
    EXPECT_FALSE((*f)->reserved());
    struct stat st = {};
    ASSERT_EQ(fstat((*f)->fd(), &st), 0);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), 4u << 20);
    const uint64_t n = (1 << 20) + 7;
    auto data = RandomBytes(n, 9);
    std::vector<char> back(n + 3);
    io::IoRequest w{(*f)->fd(), 5, data.data(), n, true, (*f)->alignment(), "ramfs"};
    ASSERT_TRUE(engine->Run({&w, 1}).ok());
    io::IoRequest r{(*f)->fd(), 5, back.data() + 3, n, false, (*f)->alignment(), "ramfs"};
    ASSERT_TRUE(engine->Run({&r, 1}).ok());
    EXPECT_EQ(std::memcmp(back.data() + 3, data.data(), n), 0);
  }
  // Detached: a closed io_uring ring drops its registered files asynchronously.
  EXPECT_EQ(umount2(mnt.path().c_str(), MNT_DETACH), 0) << std::strerror(errno);
}

TEST_P(Engines, ErrorsNameTheFile) {
  auto engine = Make(1 << 20, 4);
  if (engine == nullptr) GTEST_SKIP() << "io_uring is unavailable here";
  char buf[4096];
  io::IoRequest r{-1, 0, buf, sizeof buf, false, 1, "/some/dir"};
  absl::Status s = engine->Run({&r, 1});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("/some/dir"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("EBADF") == absl::string_view::npos ? s.message().find("errno 9") : 0,
            absl::string_view::npos)
      << s;
}

TEST_P(Engines, ReadPastEndIsAnError) {
  auto engine = Make(1 << 20, 4);
  if (engine == nullptr) GTEST_SKIP() << "io_uring is unavailable here";
  TempDir dir;
  auto f = io::SwapFile::Create(dir.path(), 1 << 20);
  ASSERT_TRUE(f.ok());
  void* buf = nullptr;
  ASSERT_EQ(posix_memalign(&buf, 4096, 1 << 20), 0);
  io::IoRequest r{(*f)->fd(), 1 << 20, buf, 1 << 20, false, (*f)->alignment(), "past-end"};
  absl::Status s = engine->Run({&r, 1});
  std::free(buf);
  EXPECT_FALSE(s.ok()) << "a read that returns 0 bytes must not spin or succeed";
}

// Rewrites completions by rule: fail the nth piece, shorten every result, or make each piece's
// first completion -EAGAIN.
class Injector : public io::FaultInjector {
 public:
  std::atomic<int> fail_at{-1};  // index of the completion that fails
  std::atomic<int> fail_errno{EIO};
  std::atomic<bool> shorten{false};
  std::atomic<bool> eagain_first{false};
  std::atomic<bool> refuse_uring{false};
  std::atomic<int> seen{0};

  int OnCompletion(const io::IoRequest& r, uint64_t off, uint64_t, int result) override {
    int n = seen++;
    if (n == fail_at.load()) return -fail_errno.load();
    if (eagain_first.load()) {
      std::lock_guard<std::mutex> lock(mu_);
      if (again_.insert({r.fd, off, r.write}).second) return -EAGAIN;
    }
    if (shorten.load() && result > static_cast<int>(r.alignment)) {
      return result / 2 / static_cast<int>(r.alignment) * static_cast<int>(r.alignment);
    }
    return result;
  }
  bool FailUringSetup() override { return refuse_uring.load(); }

 private:
  std::mutex mu_;
  std::set<std::tuple<int, uint64_t, bool>> again_;
};

class EngineFaults : public Engines {
 protected:
  void SetUp() override { io::SetFaultInjector(&injector_); }
  void TearDown() override { io::SetFaultInjector(nullptr); }

  // Writes 8 MiB of random bytes in 64 KiB pieces, reads them back; true when exact.
  absl::Status RoundTrip(io::IoEngine& e, bool* exact) {
    auto f = io::SwapFile::Create(dir_.path(), 8 << 20);
    if (!f.ok()) return f.status();
    file_ = std::move(*f);
    const uint64_t n = 8 << 20;
    auto data = RandomBytes(n, 11);
    std::vector<char> out(n + 4096), in(n + 4096);
    char* o = out.data() + (4096 - reinterpret_cast<uintptr_t>(out.data()) % 4096);
    char* i = in.data() + (4096 - reinterpret_cast<uintptr_t>(in.data()) % 4096);
    std::memcpy(o, data.data(), n);
    io::IoRequest w{file_->fd(), 0, o, n, true, file_->alignment(), "faulty"};
    if (auto s = e.Run({&w, 1}); !s.ok()) return s;
    io::IoRequest r{file_->fd(), 0, i, n, false, file_->alignment(), "faulty"};
    if (auto s = e.Run({&r, 1}); !s.ok()) return s;
    *exact = std::memcmp(i, data.data(), n) == 0;
    return absl::OkStatus();
  }

  Injector injector_;
  TempDir dir_;
  std::unique_ptr<io::SwapFile> file_;
};

TEST_P(EngineFaults, EioFailsTheRunAndTheEngineGoesOn) {
  auto e = Make(64 << 10, 8);
  if (e == nullptr) GTEST_SKIP() << "io_uring is unavailable here";
  injector_.fail_at = 40;
  bool exact = false;
  absl::Status s = RoundTrip(*e, &exact);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("Input/output error"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("faulty"), absl::string_view::npos) << s;
  injector_.fail_at = -1;
  ASSERT_TRUE(RoundTrip(*e, &exact).ok());
  EXPECT_TRUE(exact);
}

TEST_P(EngineFaults, EnospcIsResourceExhausted) {
  auto e = Make(64 << 10, 8);
  if (e == nullptr) GTEST_SKIP() << "io_uring is unavailable here";
  injector_.fail_at = 3;
  injector_.fail_errno = ENOSPC;
  bool exact = false;
  absl::Status s = RoundTrip(*e, &exact);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(s.message().find("No space left"), absl::string_view::npos) << s;
}

TEST_P(EngineFaults, ShortTransfersAreContinued) {
  auto e = Make(64 << 10, 8);
  if (e == nullptr) GTEST_SKIP() << "io_uring is unavailable here";
  injector_.shorten = true;
  bool exact = false;
  ASSERT_TRUE(RoundTrip(*e, &exact).ok());
  EXPECT_TRUE(exact);
  EXPECT_GT(injector_.seen.load(), 2 * 128) << "short pieces were reissued";
}

TEST_P(EngineFaults, EagainIsReissued) {
  auto e = Make(64 << 10, 8, 2);
  if (e == nullptr) GTEST_SKIP() << "io_uring is unavailable here";
  injector_.eagain_first = true;
  bool exact = false;
  ASSERT_TRUE(RoundTrip(*e, &exact).ok());
  EXPECT_TRUE(exact);
  EXPECT_EQ(injector_.seen.load(), 4 * 128) << "each piece once refused, once done";
}

TEST(EngineSetup, UringRefused) {
  Injector injector;
  injector.refuse_uring = true;
  io::SetFaultInjector(&injector);
  auto e = io::CreateUringEngine({});
  io::SetFaultInjector(nullptr);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(absl::IsUnavailable(e.status())) << e.status();
}

TEST(EngineSetup, RegistersBuffersAndFiles) {
  TempDir dir;
  auto f = io::SwapFile::Create(dir.path(), 1 << 20);
  ASSERT_TRUE(f.ok());
  std::vector<char> pool(4 << 20);
  io::IoEngineOptions o;
  o.buffers.push_back({pool.data(), pool.size()});
  o.files.push_back((*f)->fd());
  o.threads = 2;
  auto e = io::CreateUringEngine(o);
  if (!e.ok()) GTEST_SKIP() << "io_uring is unavailable here: " << e.status();
  EXPECT_TRUE((*e)->buffers_registered()) << "root is exempt from RLIMIT_MEMLOCK";
  EXPECT_TRUE((*e)->files_registered());
  // I/O through the registered buffer and file.
  char* p = pool.data() + (4096 - reinterpret_cast<uintptr_t>(pool.data()) % 4096);
  std::memset(p, 0x3c, 1 << 20);
  io::IoRequest w{(*f)->fd(), 0, p, 1 << 20, true, (*f)->alignment(), "reg"};
  ASSERT_TRUE((*e)->Run({&w, 1}).ok());
  std::memset(p, 0, 1 << 20);
  io::IoRequest r{(*f)->fd(), 0, p, 1 << 20, false, (*f)->alignment(), "reg"};
  ASSERT_TRUE((*e)->Run({&r, 1}).ok());
  EXPECT_EQ(p[12345], 0x3c);
}

INSTANTIATE_TEST_SUITE_P(Both, EngineFaults, ::testing::Values(true, false),
                         [](const auto& i) { return i.param ? "uring" : "posix"; });

INSTANTIATE_TEST_SUITE_P(Both, Engines, ::testing::Values(true, false),
                         [](const auto& i) { return i.param ? "uring" : "posix"; });

}  // namespace
}  // namespace tiermem
