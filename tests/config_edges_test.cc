// Settings at their edges, as an outside tester drove them: rates whose time overflows, NVMe
// budgets that round, a directory listed twice, env-file comments after a value and decimal
// percentages. Each is refused by name or read as documented (docs/environment.md).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "lib/config/config.h"
#include "test_util.h"
#include "tiermem/tiermem.h"

namespace tiermem {
namespace {

using testing::SmallConfig;
using testing::TempDir;

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string LastError() { return tm_last_error(); }

bool Says(const absl::Status& s, const std::string& what) {
  return std::string(s.message()).find(what) != std::string::npos;
}

TEST(ConfigEdges, EmuLinkRateSoSmallItsTimeOverflowsIsRefused) {
  for (const char* v : {"1e-300", "4.9e-324", "9e-7"}) {
    auto c = LoadConfig({}, FakeEnv({{"TIERMEM_EMU_LINK_GBPS", v}}), {});
    ASSERT_FALSE(c.ok()) << v << " was taken as a cap (or as none)";
    EXPECT_TRUE(Says(c.status(), "TIERMEM_EMU_LINK_GBPS")) << c.status();
    EXPECT_TRUE(Says(c.status(), "1e-6")) << "names the least rate: " << c.status();
  }
  for (const char* v : {"0", "1e-6", "25"}) {
    auto c = LoadConfig({}, FakeEnv({{"TIERMEM_EMU_LINK_GBPS", v}}), {});
    EXPECT_TRUE(c.ok()) << v << ": " << c.status();
  }
  // The tm_config field goes through the same check.
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  cfg.device = TM_DEVICE_EMULATED;
  cfg.emu_link_gbps = 1e-300;
  tm_runtime rt{0};
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_ERR_CONFIG);
  EXPECT_NE(LastError().find("tm_config.emu_link_gbps"), std::string::npos) << LastError();
}

TEST(ConfigEdges, DecimalPercentagesAreRefusedByName) {
  for (const char* v : {"50.5%", "1e1%", "0%", "101%", "0.5%"}) {
    auto c = LoadConfig({}, FakeEnv({{"TIERMEM_HBM_BYTES", v}}), {});
    ASSERT_FALSE(c.ok()) << v;
    EXPECT_TRUE(Says(c.status(), "TIERMEM_HBM_BYTES")) << c.status();
    EXPECT_TRUE(Says(c.status(), "whole number")) << c.status();
  }
  for (const char* v : {"1%", "50%", " 100 %"}) {
    auto c = LoadConfig({}, FakeEnv({{"TIERMEM_DRAM_BYTES", v}}), {});
    EXPECT_TRUE(c.ok()) << v << ": " << c.status();
  }
}

// NVMe rounds down to whole stripes like the other budgets round down to their granules.
TEST(ConfigEdges, NvmeBudgetRoundsDownAndBelowOneStripeIsRefused) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  cfg.io_block_size = 1u << 20;
  tm_runtime rt{0};
  for (uint64_t bytes : {uint64_t{1}, (uint64_t{1} << 20) - 1}) {
    cfg.nvme_bytes = bytes;
    ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_ERR_CONFIG) << bytes << " was rounded up";
    EXPECT_NE(LastError().find("tm_config.nvme_bytes="), std::string::npos) << LastError();
    EXPECT_NE(LastError().find("least budget is 1048576 bytes"), std::string::npos) << LastError();
  }
  cfg.nvme_bytes = (uint64_t{3} << 20) + 4095;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << LastError();
  tm_info info = TM_INFO_INIT;
  ASSERT_EQ(tm_runtime_info(rt, &info), TM_OK);
  EXPECT_EQ(info.tier_bytes[TM_TIER_NVME], uint64_t{3} << 20);
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

// 2^63 - 1 is within the largest file: not refused as beyond it (a file system too small for it
// says so with TM_ERR_NO_SPACE); 2^64 - 1 on one path is beyond it, and the message says by how
// much, never a share that the limit allows.
TEST(ConfigEdges, NvmeBudgetAtTheLargestFileIsNotCalledBeyondIt) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt{0};
  cfg.nvme_bytes = INT64_MAX;
  tm_status s = tm_runtime_create(&cfg, &rt);
  if (s == TM_OK) {
    EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);  // a file system that holds 8 EiB
  } else {
    EXPECT_EQ(s, TM_ERR_NO_SPACE) << LastError();
    EXPECT_EQ(LastError().find("beyond what a file system can hold"), std::string::npos)
        << LastError();
  }
  cfg.nvme_bytes = UINT64_MAX;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_ERR_CONFIG);
  EXPECT_NE(LastError().find("above the largest file"), std::string::npos) << LastError();
  EXPECT_NE(LastError().find("18446744073708503040 bytes"), std::string::npos) << LastError();
}

TEST(ConfigEdges, NvmeDirectoryListedTwiceIsRefused) {
  TempDir dir, other;
  const std::string link = dir.path() + "/again";
  ASSERT_EQ(symlink(dir.path().c_str(), link.c_str()), 0);
  for (const std::string& paths :
       {dir.path() + ":" + dir.path(), dir.path() + ":" + dir.path() + "/.",
        dir.path() + ":" + other.path() + ":" + link,
        other.path() + "/../" + other.path().substr(other.path().rfind('/') + 1) + ":" +
            other.path()}) {
    tm_config cfg = SmallConfig(dir.path());
    cfg.nvme_paths = paths.c_str();
    tm_runtime rt{0};
    ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_ERR_CONFIG) << paths;
    EXPECT_NE(LastError().find("tm_config.nvme_paths"), std::string::npos) << LastError();
    EXPECT_NE(LastError().find("given twice"), std::string::npos) << LastError();
  }
  const std::string two = dir.path() + ":" + other.path();
  tm_config cfg = SmallConfig(dir.path());
  cfg.nvme_paths = two.c_str();
  tm_runtime rt{0};
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << LastError();
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

TEST(ConfigEdges, EnvFileCommentAfterAValueIsSkippedAsInShell) {
  TempDir dir;
  const std::string path = dir.path() + "/tiermem.env";
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs(
      "export  TIERMEM_PREFETCH_DEPTH=3 # tuned\n"
      "TIERMEM_IO_QUEUE_DEPTH=\"64\"\t# quoted, then a comment\n"
      "TIERMEM_TRACE='/tmp/a # b.json'\n"
      "TIERMEM_LOG=warn#not-a-comment\n"
      "TIERMEM_IO_THREADS= # empty\n",
      f);
  std::fclose(f);
  auto file = ParseEnvFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->values["TIERMEM_PREFETCH_DEPTH"].value, "3");
  EXPECT_EQ(file->values["TIERMEM_IO_QUEUE_DEPTH"].value, "64");
  EXPECT_EQ(file->values["TIERMEM_TRACE"].value, "/tmp/a # b.json") << "inside quotes: text";
  EXPECT_EQ(file->values["TIERMEM_LOG"].value, "warn#not-a-comment") << "within a word: text";
  EXPECT_EQ(file->values["TIERMEM_IO_THREADS"].value, "");
  // And a whole config from such a line.
  f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("export TIERMEM_PREFETCH_DEPTH=3 # comment\n", f);
  std::fclose(f);
  auto c = LoadConfig({}, FakeEnv({{"TIERMEM_ENV_FILE", path}}), {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->Value("TIERMEM_PREFETCH_DEPTH"), "3");
}

}  // namespace
}  // namespace tiermem
