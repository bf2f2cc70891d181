// Configuration: sizes, precedence (config > environment > default), and every bad value
// rejected with the variable and the value named.
#include "lib/config.h"

#include <gtest/gtest.h>

#include <cstdio>
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
  EXPECT_EQ(c->checksum, ChecksumKind::kOff);
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
                      BadValue{"TIERMEM_TRACE", "/tmp/dir/"},
                      BadValue{"TIERMEM_CHECKSUM", "crc32"}));

// A TIERMEM_ENV_FILE, as tiermem-probe --tune writes it.
class EnvFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    std::string path = dir_.path() + "/tiermem.env";
    std::FILE* f = std::fopen(path.c_str(), "w");
    EXPECT_NE(f, nullptr);
    std::fputs(text.c_str(), f);
    std::fclose(f);
    return path;
  }
  tiermem::testing::TempDir dir_;
};

TEST_F(EnvFileTest, ValuesSitBetweenEnvironmentAndDefaults) {
  std::string path = Write(
      "# tuned\n\nexport TIERMEM_IO_BLOCK_SIZE=4MiB\nTIERMEM_IO_QUEUE_DEPTH=\"64\"\n"
      "  export   TIERMEM_PREFETCH_DEPTH='2'  \n");
  auto c = LoadConfig({}, FakeEnv({{"TIERMEM_ENV_FILE", path}, {"TIERMEM_IO_QUEUE_DEPTH", "8"}}),
                      {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->io_block_size, 4u << 20);    // from the file
  EXPECT_EQ(c->io_queue_depth, 8u);         // the environment wins over the file
  EXPECT_EQ(c->prefetch_depth, 2u);         // quoted value
  EXPECT_EQ(c->io_threads, 1u);             // default
  std::map<std::string, std::string> source;
  for (const auto& e : c->entries) source[e.name] = e.source;
  EXPECT_EQ(source["TIERMEM_IO_BLOCK_SIZE"], "file " + path);
  EXPECT_EQ(source["TIERMEM_IO_QUEUE_DEPTH"], "environment");
  EXPECT_EQ(source["TIERMEM_IO_THREADS"], "default");
  EXPECT_EQ(source["TIERMEM_ENV_FILE"], "environment");
  EXPECT_EQ(c->Value("TIERMEM_ENV_FILE"), path);
  // An override from code wins over both.
  ConfigOverrides o;
  o.io_block_size = 65536;
  c = LoadConfig(o, FakeEnv({{"TIERMEM_ENV_FILE", path}}), {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->io_block_size, 65536u);
  EXPECT_EQ(c->io_queue_depth, 64u);
}

TEST_F(EnvFileTest, BadValueNamesFileLineAndVariable) {
  std::string path = Write("export TIERMEM_IO_THREADS=2\nexport TIERMEM_IO_BLOCK_SIZE=1000\n");
  auto c = LoadConfig({}, FakeEnv({{"TIERMEM_ENV_FILE", path}}), {});
  ASSERT_FALSE(c.ok());
  std::string msg(c.status().message());
  EXPECT_NE(msg.find(path + ":2:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("TIERMEM_IO_BLOCK_SIZE=\"1000\""), std::string::npos) << msg;
}

TEST_F(EnvFileTest, MalformedFilesAreRejectedByLine) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& k : {Case{"TIERMEM_IO_THREADS 2\n", ":1: expected"},
                        Case{"# ok\nIO_THREADS=2\n", ":2: \"IO_THREADS\" is not a TIERMEM_"},
                        Case{"exportTIERMEM_IO_THREADS=2\n", ":1: expected"},
                        Case{"TIERMEM_IO_THREADS=$N\n", ":1: quotes, escapes and shell"},
                        Case{"TIERMEM_IO_THREADS=1\nTIERMEM_IO_THREADS=2\n", ":2: TIERMEM_IO_THREADS is set twice"},
                        Case{"TIERMEM_ENV_FILE=/x\n", ":1: an env file cannot name another"}}) {
    std::string path = Write(k.text);
    auto c = LoadConfig({}, FakeEnv({{"TIERMEM_ENV_FILE", path}}), {});
    ASSERT_FALSE(c.ok()) << k.text;
    std::string msg(c.status().message());
    EXPECT_NE(msg.find("TIERMEM_ENV_FILE"), std::string::npos) << msg;
    EXPECT_NE(msg.find(k.says), std::string::npos) << k.text << " -> " << msg;
  }
}

TEST_F(EnvFileTest, MissingFileAndUnknownNames) {
  auto c = LoadConfig({}, FakeEnv({{"TIERMEM_ENV_FILE", dir_.path() + "/absent.env"}}), {});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("absent.env\" is invalid: cannot open it: No such file"),
            absl::string_view::npos)
      << c.status().message();
  std::string path = Write("TIERMEM_IO_DEPHT=4\n");
  c = LoadConfig({}, FakeEnv({{"TIERMEM_ENV_FILE", path}}), {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->unknown_variables, std::vector<std::string>{"TIERMEM_IO_DEPHT (" + path + ":1)"});
}

// The runtime reads the file named in the process environment.
TEST_F(EnvFileTest, RuntimeLoadsIt) {
  std::string path = Write("export TIERMEM_IO_QUEUE_DEPTH=7\n");
  tiermem::testing::ScopedEnv env("TIERMEM_ENV_FILE", path.c_str());
  tm_config cfg = tiermem::testing::SmallConfig(dir_.path());
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();
  char value[64];
  ASSERT_EQ(tm_runtime_config_value(rt, "TIERMEM_IO_QUEUE_DEPTH", value, sizeof value, nullptr), TM_OK);
  EXPECT_STREQ(value, "7");
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

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
