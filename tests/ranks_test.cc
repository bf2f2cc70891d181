// Ranks on a node: which variable gives the local rank and world size, Slurm's lists, the
// device a rank defaults to, percentage budgets split over the ranks (four processes on one
// tmpfs), and the rank in log lines.
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/log.h"
#include "lib/config/config.h"
#include "lib/config/local_ranks.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

const Config::Entry& EntryOf(const Config& c, const std::string& name) {
  for (const auto& e : c.entries) {
    if (e.name == name) return e;
  }
  static const Config::Entry none;
  ADD_FAILURE() << name << " has no entry";
  return none;
}

struct RankCase {
  std::map<std::string, std::string> env;
  int rank, world;
  std::string rank_source, world_source;
  bool warns = false;
};

// TIERMEM_* first, then torchrun/DeepSpeed, Open MPI, Slurm; the world size from the launcher
// that gave the rank; a launcher's value that does not fit is passed over with a warning.
TEST(LocalRanks, DetectionOrderAndSources) {
  const std::vector<RankCase> cases = {
      {{}, 0, 1, "default", "default"},
      {{{"TIERMEM_LOCAL_RANK", "2"},
        {"TIERMEM_LOCAL_WORLD_SIZE", "4"},
        {"LOCAL_RANK", "1"},
        {"LOCAL_WORLD_SIZE", "8"}},
       2,
       4,
       "environment",
       "environment"},
      {{{"LOCAL_RANK", "3"},
        {"LOCAL_WORLD_SIZE", "8"},
        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
       3,
       8,
       "environment LOCAL_RANK",
       "environment LOCAL_WORLD_SIZE"},
      // DeepSpeed's launcher says LOCAL_SIZE.
      {{{"LOCAL_RANK", "1"}, {"LOCAL_SIZE", "2"}},
       1,
       2,
       "environment LOCAL_RANK",
       "environment LOCAL_SIZE"},
      {{{"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
        {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
        {"SLURM_LOCALID", "5"},
        {"SLURM_NTASKS_PER_NODE", "8"}},
       1,
       2,
       "environment OMPI_COMM_WORLD_LOCAL_RANK",
       "environment OMPI_COMM_WORLD_LOCAL_SIZE"},
      {{{"SLURM_LOCALID", "5"}, {"SLURM_NTASKS_PER_NODE", "8"}},
       5,
       8,
       "environment SLURM_LOCALID",
       "environment SLURM_NTASKS_PER_NODE"},
      // The step's count wins over what was asked for per node.
      {{{"SLURM_LOCALID", "0"},
        {"SLURM_STEP_TASKS_PER_NODE", "1(x4)"},
        {"SLURM_NTASKS_PER_NODE", "4"}},
       0,
       1,
       "environment SLURM_LOCALID",
       "environment SLURM_STEP_TASKS_PER_NODE"},
      {{{"SLURM_LOCALID", "3"}, {"SLURM_TASKS_PER_NODE", "2(x3),4"}, {"SLURM_NODEID", "3"}},
       3,
       4,
       "environment SLURM_LOCALID",
       "environment SLURM_TASKS_PER_NODE"},
      // A world size from another launcher than the rank's is never taken.
      {{{"LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}},
       1,
       1,
       "environment LOCAL_RANK",
       "default",
       true},
      // A launcher rank that is not a number is passed over, its world size with it.
      {{{"LOCAL_RANK", "junk"},
        {"LOCAL_WORLD_SIZE", "8"},
        {"SLURM_LOCALID", "1"},
        {"SLURM_NTASKS_PER_NODE", "2"}},
       1,
       2,
       "environment SLURM_LOCALID",
       "environment SLURM_NTASKS_PER_NODE"},
      // Mismatches: rank not below the world, a list with different counts and no node id,
      // a world that is not a number. Rank kept, budgets not split, a warning.
      {{{"LOCAL_RANK", "5"}, {"LOCAL_WORLD_SIZE", "4"}},
       5,
       1,
       "environment LOCAL_RANK",
       "default",
       true},
      {{{"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "2,4"}},
       1,
       1,
       "environment SLURM_LOCALID",
       "default",
       true},
      {{{"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "many"}},
       1,
       1,
       "environment LOCAL_RANK",
       "default",
       true},
      // An explicit rank beyond the launcher's world: that world is passed over.
      {{{"TIERMEM_LOCAL_RANK", "6"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}},
       6,
       1,
       "environment",
       "default",
       true},
      // An explicit rank without a world: it names traces and picks a device, nothing to say.
      {{{"TIERMEM_LOCAL_RANK", "3"}}, 3, 1, "environment", "default", false},
  };
  for (const RankCase& k : cases) {
    std::string label;
    for (const auto& [n, v] : k.env) label += n + "=" + v + " ";
    SCOPED_TRACE(label);
    auto c = LoadConfig({}, FakeEnv(k.env), {});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->local_rank, k.rank);
    EXPECT_EQ(c->local_world_size, k.world);
    EXPECT_EQ(EntryOf(*c, "TIERMEM_LOCAL_RANK").source, k.rank_source);
    EXPECT_EQ(EntryOf(*c, "TIERMEM_LOCAL_WORLD_SIZE").source, k.world_source);
    EXPECT_EQ(EntryOf(*c, "TIERMEM_LOCAL_WORLD_SIZE").value, std::to_string(k.world));
    EXPECT_EQ(!c->warnings.empty(), k.warns) << (c->warnings.empty() ? "" : c->warnings[0]);
  }
}

// A world size that was given is checked against the rank: a clear error naming both.
TEST(LocalRanks, RankNotBelowAGivenWorldIsAnError) {
  for (const auto& env : std::vector<std::map<std::string, std::string>>{
           {{"TIERMEM_LOCAL_RANK", "4"}, {"TIERMEM_LOCAL_WORLD_SIZE", "4"}},
           {{"LOCAL_RANK", "5"}, {"LOCAL_WORLD_SIZE", "8"}, {"TIERMEM_LOCAL_WORLD_SIZE", "2"}}}) {
    auto c = LoadConfig({}, FakeEnv(env), {});
    ASSERT_FALSE(c.ok());
    const std::string msg(c.status().message());
    EXPECT_NE(msg.find("TIERMEM_LOCAL_RANK="), std::string::npos) << msg;
    EXPECT_NE(msg.find("TIERMEM_LOCAL_WORLD_SIZE="), std::string::npos) << msg;
  }
  for (const char* bad : {"0", "65537", "-1", "four"}) {
    auto c = LoadConfig({}, FakeEnv({{"TIERMEM_LOCAL_WORLD_SIZE", bad}}), {});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find(std::string("TIERMEM_LOCAL_WORLD_SIZE=\"") + bad),
              absl::string_view::npos)
        << c.status().message();
  }
}

// tm_config's fields (ConfigOverrides) win over the environment and are checked the same way.
TEST(LocalRanks, OverridesWin) {
  ConfigOverrides o;
  o.local_rank = 1;
  o.local_world_size = 2;
  auto c = LoadConfig(o, FakeEnv({{"LOCAL_RANK", "5"}, {"LOCAL_WORLD_SIZE", "8"}}), {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->local_rank, 1);
  EXPECT_EQ(c->local_world_size, 2);
  EXPECT_EQ(EntryOf(*c, "TIERMEM_LOCAL_RANK").source, "config");
  EXPECT_EQ(EntryOf(*c, "TIERMEM_LOCAL_WORLD_SIZE").source, "config");
  o.local_rank = 2;
  EXPECT_FALSE(LoadConfig(o, FakeEnv({}), {}).ok());
}

TEST(SlurmTasksOnNode, DocumentedForms) {
  EXPECT_EQ(*SlurmTasksOnNode("V", "4", std::nullopt), 4);
  EXPECT_EQ(*SlurmTasksOnNode("V", "4(x2)", std::nullopt), 4);
  EXPECT_EQ(*SlurmTasksOnNode("V", "4(x2),4", std::nullopt), 4);
  EXPECT_EQ(*SlurmTasksOnNode("V", "2(x3),1", 2), 2);
  EXPECT_EQ(*SlurmTasksOnNode("V", "2(x3),1", 3), 1);
  EXPECT_EQ(*SlurmTasksOnNode("V", "5,4(x3)", 0), 5);
  EXPECT_EQ(*SlurmTasksOnNode("V", "5,4(x3)", 3), 4);
  EXPECT_EQ(*SlurmTasksOnNode("V", "2,4", 1), 4);
  for (const char* bad : {"", "x", "0", "4(x0)", "4(2)", "4(x2", "-4", "4,,4", "(x2)", "4(x2)x"}) {
    auto n = SlurmTasksOnNode("SLURM_NTASKS_PER_NODE", bad, std::nullopt);
    ASSERT_FALSE(n.ok()) << bad;
    EXPECT_NE(n.status().message().find(std::string("SLURM_NTASKS_PER_NODE=\"") + bad + "\""),
              absl::string_view::npos)
        << n.status().message();
  }
  EXPECT_FALSE(SlurmTasksOnNode("V", "2,4", std::nullopt).ok());  // which node?
  EXPECT_FALSE(SlurmTasksOnNode("V", "2(x3),1", 4).ok());         // no such node
}

TEST(LocalRanks, DeviceByRank) {
  EXPECT_EQ(DefaultCudaDevice(0, 8), 0);
  EXPECT_EQ(DefaultCudaDevice(7, 8), 7);
  EXPECT_EQ(DefaultCudaDevice(9, 8), 1);
  EXPECT_EQ(DefaultCudaDevice(3, 1), 0);  // one visible device per rank (CUDA_VISIBLE_DEVICES)
  EXPECT_EQ(DefaultCudaDevice(3, 0), 0);  // none: the backend says why
  // Who shares a GPU: 16 ranks on 8 devices put two on each; 8 on 8 one; 10 on 8: 0 and 1 twice.
  EXPECT_EQ(RanksOnDevice(3, 16, 8), 2);
  EXPECT_EQ(RanksOnDevice(3, 8, 8), 1);
  EXPECT_EQ(RanksOnDevice(1, 10, 8), 2);
  EXPECT_EQ(RanksOnDevice(2, 10, 8), 1);
  EXPECT_EQ(RanksOnDevice(0, 4, 1), 4);
  EXPECT_EQ(RanksOnDevice(0, 1, 0), 1);
}

TEST(LocalRanks, PercentagesAreSplitAbsoluteSizesAreNot) {
  const SizeSetting half{0, 50}, fixed{3u << 20, 0};
  EXPECT_EQ(RankShare(half, 64u << 20, 4, 1u << 20), 8u << 20);
  EXPECT_EQ(RankShare(half, 64u << 20, 1, 1u << 20), 32u << 20);
  EXPECT_EQ(RankShare(half, 100u << 20, 3, 1u << 20), 16u << 20);  // 16.67 rounded down
  EXPECT_EQ(RankShare(fixed, 64u << 20, 4, 1u << 20), 3u << 20);
  EXPECT_EQ(RankShare(SizeSetting{0, 80}, 1000, 8, 1), 100u);
}

// A log line names the rank once several ranks share the node.
TEST(LocalRanks, LogLinesCarryTheRank) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/stderr";
  const int file = open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(file, 0);
  const int saved = dup(STDERR_FILENO);
  ASSERT_GE(saved, 0);
  ASSERT_GE(dup2(file, STDERR_FILENO), 0);
  io::SetLogRank(1, 4);
  io::Log(io::LogSeverity::kError, "first %d", 1);
  io::SetLogRank(0, 1);
  io::Log(io::LogSeverity::kError, "second");
  dup2(saved, STDERR_FILENO);
  close(saved);
  close(file);
  std::FILE* f = std::fopen(path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  EXPECT_EQ(std::string(buf, n), "tiermem[r1]: error: first 1\ntiermem: error: second\n");
}

// Four processes, local ranks 0-3 on one 64 MiB tmpfs, each with TIERMEM_NVME_BYTES=50%: each
// gets a quarter of 32 MiB whatever order they start in (a share of free space gave less to
// each later one), reports it and its rank through tm_runtime_info, and writes its own trace.
class FourRanks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      GTEST_SKIP() << "mounting a tmpfs needs root: run as root, or in a user namespace as ctest's "
                      "ranks_test_userns does: unshare --map-root-user --mount "
                      "build/tests/ranks_test --gtest_filter='FourRanks.*'";
    }
    char templ[] = "/tmp/tiermem-ranks-XXXXXX";
    ASSERT_NE(mkdtemp(templ), nullptr) << strerror(errno);
    mnt_ = templ;
    if (mount("tmpfs", mnt_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=0700") != 0) {
      const int e = errno;
      rmdir(mnt_.c_str());
      mnt_.clear();
      GTEST_SKIP() << "cannot mount a tmpfs here: " << strerror(e);
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) umount2(mnt_.c_str(), MNT_DETACH);
    if (!mnt_.empty()) rmdir(mnt_.c_str());
  }

  struct Report {
    int status = -1;
    uint64_t nvme_bytes = 0;
    int32_t rank = -1, world = -1;
  };

  // A child: waits for its turn, creates a runtime, reports, waits to be let go, destroys it.
  [[noreturn]] static void Child(int rank, const std::string& nvme, const std::string& trace,
                                 int go, int report) {
    for (const char* v :
         {"LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_LOCALID", "TIERMEM_ENV_FILE"}) {
      unsetenv(v);
    }
    // Half the ranks as torchrun names them, half as tiermem does.
    const std::string r = std::to_string(rank);
    setenv(rank % 2 == 0 ? "TIERMEM_LOCAL_RANK" : "LOCAL_RANK", r.c_str(), 1);
    setenv(rank % 2 == 0 ? "TIERMEM_LOCAL_WORLD_SIZE" : "LOCAL_WORLD_SIZE", "4", 1);
    setenv("TIERMEM_NVME_BYTES", "50%", 1);
    setenv("TIERMEM_NVME_PATHS", nvme.c_str(), 1);
    setenv("TIERMEM_TRACE", trace.c_str(), 1);
    setenv("TIERMEM_DEVICE", "emulated", 1);
    setenv("TIERMEM_HBM_BYTES", "8MiB", 1);
    setenv("TIERMEM_DRAM_BYTES", "16MiB", 1);
    char byte = 0;
    if (read(go, &byte, 1) != 1) _exit(2);
    Report out;
    tm_runtime rt{};
    tm_config cfg = TM_CONFIG_INIT;
    out.status = tm_runtime_create(&cfg, &rt);
    if (out.status != TM_OK) std::fprintf(stderr, "rank %d: %s\n", rank, tm_last_error());
    tm_info info = TM_INFO_INIT;
    if (out.status == TM_OK) out.status = tm_runtime_info(rt, &info);
    out.nvme_bytes = info.tier_bytes[TM_TIER_NVME];
    out.rank = info.local_rank;
    out.world = info.local_world_size;
    if (write(report, &out, sizeof out) != static_cast<ssize_t>(sizeof out)) _exit(3);
    if (read(go, &byte, 1) != 1) _exit(4);
    if (rt.bits != 0 && tm_runtime_destroy(rt) != TM_OK) _exit(5);
    _exit(0);
  }

  // Starts the ranks one at a time in `order`, each holding its reservation while the next
  // starts; returns the reports by rank.
  std::vector<Report> Run(const std::vector<int>& order, const std::string& trace) {
    std::vector<int> go(4), report(4);
    std::vector<pid_t> pids(4);
    for (int rank = 0; rank < 4; ++rank) {
      int g[2], r[2];
      EXPECT_EQ(pipe2(g, O_CLOEXEC), 0);
      EXPECT_EQ(pipe2(r, O_CLOEXEC), 0);
      pids[rank] = fork();
      if (pids[rank] == 0) Child(rank, mnt_, trace, g[0], r[1]);
      close(g[0]);
      close(r[1]);
      go[rank] = g[1];
      report[rank] = r[0];
    }
    std::vector<Report> out(4);
    for (int rank : order) {
      EXPECT_EQ(write(go[rank], "g", 1), 1);
      EXPECT_EQ(read(report[rank], &out[rank], sizeof(Report)),
                static_cast<ssize_t>(sizeof(Report)));
    }
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(write(go[rank], "x", 1), 1);
      int status = 0;
      EXPECT_EQ(waitpid(pids[rank], &status, 0), pids[rank]);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "rank " << rank << ": " << status;
      close(go[rank]);
      close(report[rank]);
    }
    return out;
  }

  std::string mnt_;
  bool mounted_ = false;
};

TEST_F(FourRanks, SplitHalfTheTmpfsIntoEqualQuartersInAnyOrder) {
  struct statvfs v = {};
  ASSERT_EQ(statvfs(mnt_.c_str(), &v), 0);
  const uint64_t total = static_cast<uint64_t>(v.f_blocks) * v.f_frsize;
  ASSERT_EQ(total, 64u << 20);
  // 50% of 64 MiB over 4 ranks, in whole 1 MiB stripes (TIERMEM_IO_BLOCK_SIZE's default).
  const uint64_t quarter = 8u << 20;
  for (const std::vector<int>& order :
       {std::vector<int>{0, 1, 2, 3}, std::vector<int>{3, 1, 0, 2}}) {
    SCOPED_TRACE(::testing::PrintToString(order));
    testing::TempDir traces;
    const std::vector<Report> reports = Run(order, traces.path() + "/trace-%r.json");
    for (int rank = 0; rank < 4; ++rank) {
      EXPECT_EQ(reports[rank].status, TM_OK) << "rank " << rank;
      EXPECT_EQ(reports[rank].nvme_bytes, quarter) << "rank " << rank;
      EXPECT_EQ(reports[rank].rank, rank);
      EXPECT_EQ(reports[rank].world, 4);
      const std::string trace = traces.path() + "/trace-" + std::to_string(rank) + ".json";
      struct stat st = {};
      EXPECT_EQ(stat(trace.c_str(), &st), 0) << trace;
      EXPECT_GT(st.st_size, 0) << trace;
    }
    EXPECT_EQ(traces.Entries(), 4);
    // Every reservation is given back once its process is gone: the kernel tears io_uring
    // rings (which hold the swap files) down after the process exits, so this may take a
    // moment. The next order must start on an empty file system.
    uint64_t free_bytes = 0;
    EXPECT_TRUE(testing::WaitUntil([&] {
      free_bytes =
          statvfs(mnt_.c_str(), &v) == 0 ? static_cast<uint64_t>(v.f_bfree) * v.f_frsize : 0;
      return free_bytes == total;
    }));
    ASSERT_EQ(free_bytes, total) << "swap files outlived their processes";
  }
}

// The C API: tm_config's rank fields reach tm_runtime_info, and a rank not below the world
// size given beside it fails create with TM_ERR_CONFIG naming both.
TEST(LocalRanks, ConfigFieldsThroughTheCApi) {
  testing::TempDir dir;
  testing::ScopedEnv env("TIERMEM_TRACE", std::nullopt);
  for (const char* v : {"TIERMEM_LOCAL_RANK", "TIERMEM_LOCAL_WORLD_SIZE", "LOCAL_RANK",
                        "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"}) {
    env.Set(v, std::nullopt);
  }
  tm_config cfg = testing::SmallConfig(dir.path());
  cfg.local_rank = 1;
  cfg.local_world_size = 2;
  tm_runtime rt{};
  TM_ASSERT_OK(tm_runtime_create(&cfg, &rt));
  tm_info info = TM_INFO_INIT;
  TM_ASSERT_OK(tm_runtime_info(rt, &info));
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  TM_ASSERT_OK(tm_runtime_destroy(rt));
  cfg.local_rank = 2;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_ERR_CONFIG);
  EXPECT_NE(std::string(tm_last_error()).find("tm_config.local_world_size=2 (config)"),
            std::string::npos)
      << tm_last_error();
  // Alone (nothing set): rank 0 of 1.
  tm_config alone = testing::SmallConfig(dir.path());
  TM_ASSERT_OK(tm_runtime_create(&alone, &rt));
  TM_ASSERT_OK(tm_runtime_info(rt, &info));
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_world_size, 1);
  TM_ASSERT_OK(tm_runtime_destroy(rt));
}

}  // namespace
}  // namespace tiermem
