// Configuration: sizes, precedence (config > environment > default), and every bad value
// rejected with the variable and the value named.
#include "lib/config.h"

#include <gtest/gtest.h>

#include <map>

#include "test_util.h"

namespace tiermem {
namespace {

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ParseSize, AcceptsUnitsAndPercent) {
  EXPECT_EQ(ParseSize("X", "4096")->bytes, 4096u);
  EXPECT_EQ(ParseSize("X", "512KiB")->bytes, 512u << 10);
  EXPECT_EQ(ParseSize("X", "64MiB")->bytes, 64u << 20);
  EXPECT_EQ(ParseSize("X", "2GiB")->bytes, 2ull << 30);
  EXPECT_EQ(ParseSize("X", "3g")->bytes, 3ull << 30);
  EXPECT_EQ(ParseSize("X", "1TiB")->bytes, 1ull << 40);
  EXPECT_EQ(ParseSize("X", " 7 B ")->bytes, 7u);
  EXPECT_DOUBLE_EQ(ParseSize("X", "50%")->percent, 50.0);
  EXPECT_EQ(ParseSize("X", "50%")->Resolve(1000), 500u);
}

TEST(ParseSize, RejectsGarbageNamingIt) {
  for (const char* bad : {"", "abc", "12XB", "-5", "0%", "101%", "99999999999999999999",
                          "20000000TiB", "1.5GiB", "%"}) {
    auto s = ParseSize("TIERMEM_DRAM_BYTES", bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("TIERMEM_DRAM_BYTES"), absl::string_view::npos);
    EXPECT_NE(s.status().message().find(std::string("\"") + bad + "\""), absl::string_view::npos)
        << s.status().message();
  }
}

TEST(LoadConfig, DefaultsWhenNothingIsSet) {
  auto c = LoadConfig({}, FakeEnv({}), {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, DeviceKind::kAuto);
  EXPECT_EQ(c->io_engine, IoEngineKind::kAuto);
  EXPECT_EQ(c->io_block_size, 1u << 20);
  EXPECT_EQ(c->io_queue_depth, 32u);
  EXPECT_EQ(c->dram_bytes.bytes, 2ull << 30);
  EXPECT_EQ(c->numa, NumaMode::kAuto);
  EXPECT_EQ(c->log_level, LogLevel::kWarn);
  for (const auto& e : c->entries) EXPECT_EQ(e.source, "default") << e.name;
  EXPECT_EQ(c->entries.size(), KnownVariables().size());
}

TEST(LoadConfig, EnvironmentThenOverride) {
  auto env = FakeEnv({{"TIERMEM_DEVICE", "emulated"},
                      {"TIERMEM_HBM_BYTES", "512MiB"},
                      {"TIERMEM_NVME_PATHS", "/a:/b"},
                      {"TIERMEM_IO_ENGINE", "POSIX"},
                      {"TIERMEM_IO_QUEUE_DEPTH", "64"},
                      {"TIERMEM_NUMA", "off"},
                      {"TIERMEM_EMU_LINK_GBPS", "12.5"}});
  ConfigOverrides o;
  o.hbm_bytes = SizeSetting{1ull << 30, 0};
  auto c = LoadConfig(o, env, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, DeviceKind::kEmulated);
  EXPECT_EQ(c->hbm_bytes.bytes, 1ull << 30);  // the override wins
  EXPECT_EQ(*c->Value("TIERMEM_HBM_BYTES"), "1GiB");
  EXPECT_EQ(c->nvme_paths, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(c->io_engine, IoEngineKind::kPosix);
  EXPECT_EQ(c->io_queue_depth, 64u);
  EXPECT_EQ(c->numa, NumaMode::kOff);
  EXPECT_DOUBLE_EQ(c->emu_link_gbps, 12.5);
  for (const auto& e : c->entries) {
    const char* expected = e.name == "TIERMEM_HBM_BYTES" ? "config"
                           : e.name == "TIERMEM_LOG_LEVEL" ? "default"
                           : e.name == "TIERMEM_DEVICE"    ? "environment"
                                                           : nullptr;
    if (expected != nullptr) {
      EXPECT_EQ(e.source, expected) << e.name;
    }
  }
}

TEST(LoadConfig, NumaNodeNumber) {
  auto c = LoadConfig({}, FakeEnv({{"TIERMEM_NUMA", "3"}}), {});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->numa, NumaMode::kNode);
  EXPECT_EQ(c->numa_node, 3);
}

TEST(LoadConfig, UnknownVariablesAreReported) {
  auto c = LoadConfig({}, FakeEnv({}), {"TIERMEM_PREFETCH_DEPHT", "TIERMEM_DEVICE"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->unknown_variables, std::vector<std::string>{"TIERMEM_PREFETCH_DEPHT"});
}

struct BadValue {
  const char* name;
  const char* value;
};

class BadEnvironment : public ::testing::TestWithParam<BadValue> {};

TEST_P(BadEnvironment, IsRejectedByName) {
  const BadValue& b = GetParam();
  auto c = LoadConfig({}, FakeEnv({{b.name, b.value}}), {});
  ASSERT_FALSE(c.ok()) << b.name << "=" << b.value << " was accepted";
  std::string msg(c.status().message());
  EXPECT_NE(msg.find(b.name), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::string("\"") + b.value + "\""), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(
    AllVariables, BadEnvironment,
    ::testing::Values(BadValue{"TIERMEM_DEVICE", "gpu"}, BadValue{"TIERMEM_DEVICE", ""},
                      BadValue{"TIERMEM_CUDA_DEVICE", "-1"}, BadValue{"TIERMEM_CUDA_DEVICE", "x"},
                      BadValue{"TIERMEM_CUDA_DEVICE", "5000"},
                      BadValue{"TIERMEM_HBM_BYTES", "lots"}, BadValue{"TIERMEM_HBM_BYTES", "0"},
                      BadValue{"TIERMEM_DRAM_BYTES", "12QiB"}, BadValue{"TIERMEM_DRAM_BYTES", "150%"},
                      BadValue{"TIERMEM_NVME_BYTES", "-1GiB"},
                      BadValue{"TIERMEM_NVME_PATHS", ""}, BadValue{"TIERMEM_NVME_PATHS", "relative/dir"},
                      BadValue{"TIERMEM_NVME_PATHS", "/a::/b"},
                      BadValue{"TIERMEM_IO_ENGINE", "aio"},
                      BadValue{"TIERMEM_IO_BLOCK_SIZE", "1000"}, BadValue{"TIERMEM_IO_BLOCK_SIZE", "1KiB"},
                      BadValue{"TIERMEM_IO_BLOCK_SIZE", "128MiB"}, BadValue{"TIERMEM_IO_BLOCK_SIZE", "10%"},
                      BadValue{"TIERMEM_IO_QUEUE_DEPTH", "0"}, BadValue{"TIERMEM_IO_QUEUE_DEPTH", "9999"},
                      BadValue{"TIERMEM_IO_QUEUE_DEPTH", "deep"},
                      BadValue{"TIERMEM_NUMA", "near"}, BadValue{"TIERMEM_NUMA", "-2"},
                      BadValue{"TIERMEM_LOG_LEVEL", "verbose"},
                      BadValue{"TIERMEM_EMU_LINK_GBPS", "fast"}, BadValue{"TIERMEM_EMU_LINK_GBPS", "-3"},
                      BadValue{"TIERMEM_EMU_LINK_GBPS", "nan"},
                      BadValue{"TIERMEM_IO_THREADS", "0"}, BadValue{"TIERMEM_IO_THREADS", "65"},
                      BadValue{"TIERMEM_PREFETCH_DEPTH", "-1"},
                      BadValue{"TIERMEM_PREFETCH_DEPTH", "2000"},
                      BadValue{"TIERMEM_PREFETCH_BYTES", "some"},
                      BadValue{"TIERMEM_PLACEMENT", "zero3"},
                      BadValue{"TIERMEM_TRACE", "/tmp/dir/"}));

// Through the C API: the status is TM_ERR_CONFIG and tm_last_error names the variable.
TEST(LoadConfig, CApiReportsConfigError) {
  tiermem::testing::ScopedEnv env("TIERMEM_IO_QUEUE_DEPTH", "zero");
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(nullptr, &rt), TM_ERR_CONFIG);
  EXPECT_NE(std::string(tm_last_error()).find("TIERMEM_IO_QUEUE_DEPTH=\"zero\""), std::string::npos)
      << tm_last_error();
  EXPECT_EQ(rt.bits, 0u);
}

}  // namespace
}  // namespace tiermem
