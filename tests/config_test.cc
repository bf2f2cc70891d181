// Configuration: sizes, precedence (config > environment > default), and every bad value
// rejected with the variable and the value named.
#include "lib/config/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "json_check.h"
#include "lib/trace/trace.h"
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
  EXPECT_EQ(ParseSize("X", "100%")->Resolve(UINT64_MAX), UINT64_MAX);  // no float overflow
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

// A fraction is refused as one, not as a unit it does not lack ("1.5M" used to be "unknown unit").
TEST(ParseSize, SaysAFractionIsNotASize) {
  for (const char* bad : {"1.5M", "1.5GiB", "2,5G", "0.5"}) {
    auto s = ParseSize("TIERMEM_DRAM_BYTES", bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find("no decimal point"), absl::string_view::npos)
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
    const char* expected = e.name == "TIERMEM_HBM_BYTES"   ? "config"
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

// The settings table and docs/environment.md: every variable in one has a row in the other,
// with the same accepted values and default, and the docs' description starts with the table's
// summary; a default the docs show as a value is the value a default configuration has.
TEST(Settings, TableAndDocsAgree) {
  std::ifstream docs(std::string(TIERMEM_SOURCE_DIR) + "/docs/environment.md");
  ASSERT_TRUE(docs.good()) << "cannot read docs/environment.md";
  struct Row {
    std::string values, default_doc, description;
  };
  std::map<std::string, Row> documented;
  std::string line;
  while (std::getline(docs, line)) {
    if (!absl::StartsWith(line, "| `TIERMEM_")) continue;
    absl::string_view body(line);
    body.remove_prefix(2);
    ASSERT_TRUE(absl::ConsumeSuffix(&body, " |")) << line;
    std::vector<std::string> cells = absl::StrSplit(body, " | ");
    ASSERT_GE(cells.size(), 4u) << line;
    std::string name = cells[0].substr(1, cells[0].size() - 2);
    std::string description = absl::StrJoin(cells.begin() + 3, cells.end(), " | ");
    EXPECT_TRUE(documented.emplace(name, Row{cells[1], cells[2], description}).second)
        << name << " has two rows in docs/environment.md";
  }
  auto defaults = LoadConfig({}, FakeEnv({}), {});
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  std::set<std::string> in_table;
  for (const Setting& s : Settings()) {
    in_table.insert(s.name);
    auto it = documented.find(s.name);
    if (it == documented.end()) {
      ADD_FAILURE() << s.name << " is in the settings table but has no row in docs/environment.md";
      continue;
    }
    EXPECT_EQ(it->second.values, s.values) << s.name << ": values column";
    EXPECT_EQ(it->second.default_doc, s.default_doc) << s.name << ": default column";
    EXPECT_FALSE(s.summary.empty()) << s.name;
    EXPECT_TRUE(absl::StartsWith(it->second.description, s.summary))
        << s.name << ": the description should start with \"" << s.summary << "\"";
    if (absl::StartsWith(s.default_doc, "`") && !absl::StartsWith(s.default_doc, "`$")) {
      std::string shown = s.default_doc.substr(1, s.default_doc.find('`', 1) - 1);
      EXPECT_EQ(defaults->Value(s.name).value_or("?"), shown) << s.name << ": documented default";
    }
  }
  for (const auto& [name, row] : documented) {
    EXPECT_TRUE(in_table.count(name)) << name << " is documented but not in the settings table";
  }
  EXPECT_EQ(KnownVariables().size(), Settings().size());
}

// Sizes at the edge of 64 bits parse exactly or are refused by name; none wraps.
TEST(ParseSize, EdgesOf64Bits) {
  EXPECT_EQ(ParseSize("X", "18446744073709551615")->bytes, UINT64_MAX);
  EXPECT_EQ(ParseSize("X", "16777215T")->bytes, 16777215ull << 40);
  EXPECT_EQ(ParseSize("X", "17179869183G")->bytes, 17179869183ull << 30);
  for (const char* bad : {"18446744073709551616", "16777216T", "17179869184G", "17592186044416M",
                          "18014398509481984K"}) {
    auto s = ParseSize("TIERMEM_DRAM_BYTES", bad);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.status().message().find(std::string("TIERMEM_DRAM_BYTES=\"") + bad),
              std::string::npos)
        << s.status().message();
  }
}

// %r in a trace path: TIERMEM_LOCAL_RANK, else the launcher's variable, else 0.
TEST(LoadConfig, LocalRankFromTiermemThenLaunchers) {
  struct Case {
    std::map<std::string, std::string> env;
    int rank;
    std::string source;
  };
  for (const Case& k :
       {Case{{}, 0, "default"}, Case{{{"SLURM_LOCALID", "3"}}, 3, "environment SLURM_LOCALID"},
        Case{{{"SLURM_LOCALID", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}},
             2,
             "environment OMPI_COMM_WORLD_LOCAL_RANK"},
        Case{{{"SLURM_LOCALID", "3"}, {"LOCAL_RANK", "1"}}, 1, "environment LOCAL_RANK"},
        Case{{{"LOCAL_RANK", "junk"}, {"SLURM_LOCALID", "5"}}, 5, "environment SLURM_LOCALID"},
        Case{{{"LOCAL_RANK", "1"}, {"TIERMEM_LOCAL_RANK", "7"}}, 7, "environment"}}) {
    auto c = LoadConfig({}, FakeEnv(k.env), {});
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->local_rank, k.rank);
    for (const auto& e : c->entries) {
      if (e.name == "TIERMEM_LOCAL_RANK") {
        EXPECT_EQ(e.source, k.source);
        EXPECT_EQ(e.value, std::to_string(k.rank));
      }
    }
  }
}

TEST(LoadConfig, TracePathPercentSequences) {
  auto c = LoadConfig({}, FakeEnv({{"TIERMEM_TRACE", "/tmp/t-%p-%r-%%.json"}}), {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->trace, "/tmp/t-%p-%r-%%.json");  // expanded when the runtime opens it
}

TEST(TraceText, PathExpansion) {
  EXPECT_EQ(ExpandTracePath("/t/%p-%r.json", 1234, 7), "/t/1234-7.json");
  EXPECT_EQ(ExpandTracePath("/t/100%%-%r%r", 1, 0), "/t/100%-00");
  EXPECT_EQ(ExpandTracePath("/t/plain", 1, 2), "/t/plain");
}

TEST(TraceText, Utf8PrefixNeverCutsACharacter) {
  const std::string euro = "\xe2\x82\xac";  // 3 bytes
  const std::string s = "ab" + euro + "cd";
  EXPECT_EQ(Utf8Prefix(s, 10), s);
  EXPECT_EQ(Utf8Prefix(s, 5), "ab" + euro);
  EXPECT_EQ(Utf8Prefix(s, 4), "ab");
  EXPECT_EQ(Utf8Prefix(s, 3), "ab");
  EXPECT_EQ(Utf8Prefix(s, 2), "ab");
  // Bytes that are not UTF-8 at all are cut where asked (the escaper replaces them).
  const std::string junk(8, '\x80');
  EXPECT_EQ(Utf8Prefix(junk, 5).size(), 5u);
}

TEST(TraceText, JsonEscapeGivesValidJsonForAnyBytes) {
  EXPECT_EQ(JsonEscape("a\"b\\c"), "a\\\"b\\\\c");
  EXPECT_EQ(JsonEscape(std::string("\x00\x1f\x7f", 3)), "\\u0000\\u001f\\u007f");
  EXPECT_EQ(JsonEscape("\xff\xc3"), "\\ufffd\\ufffd");
  EXPECT_EQ(JsonEscape("\xe0\x80\x80"), "\\ufffd\\ufffd\\ufffd");  // overlong
  EXPECT_EQ(JsonEscape("\xed\xa0\x80"), "\\ufffd\\ufffd\\ufffd");  // a surrogate
  EXPECT_EQ(JsonEscape("\xc3\xa9\xf0\x9f\x98\x80"), "\xc3\xa9\xf0\x9f\x98\x80");
  // Every single byte and every pair of bytes: a valid JSON string each time.
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; b += (a < 0x80 ? 255 : 1)) {
      std::string raw{static_cast<char>(a), static_cast<char>(b)};
      std::string json = "\"" + JsonEscape(raw) + "\"";
      ASSERT_TRUE(testing::Json(json).Valid()) << a << " " << b;
    }
  }
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
    ::testing::Values(
        BadValue{"TIERMEM_DEVICE", "gpu"}, BadValue{"TIERMEM_DEVICE", ""},
        BadValue{"TIERMEM_CUDA_DEVICE", "-1"}, BadValue{"TIERMEM_CUDA_DEVICE", "x"},
        BadValue{"TIERMEM_CUDA_DEVICE", "5000"}, BadValue{"TIERMEM_HBM_BYTES", "lots"},
        BadValue{"TIERMEM_HBM_BYTES", "0"}, BadValue{"TIERMEM_DRAM_BYTES", "12QiB"},
        BadValue{"TIERMEM_DRAM_BYTES", "150%"}, BadValue{"TIERMEM_NVME_BYTES", "-1GiB"},
        BadValue{"TIERMEM_NVME_PATHS", ""}, BadValue{"TIERMEM_NVME_PATHS", "relative/dir"},
        BadValue{"TIERMEM_NVME_PATHS", "/a::/b"}, BadValue{"TIERMEM_IO_ENGINE", "aio"},
        BadValue{"TIERMEM_IO_BLOCK_SIZE", "1000"}, BadValue{"TIERMEM_IO_BLOCK_SIZE", "1KiB"},
        BadValue{"TIERMEM_IO_BLOCK_SIZE", "128MiB"}, BadValue{"TIERMEM_IO_BLOCK_SIZE", "10%"},
        BadValue{"TIERMEM_IO_QUEUE_DEPTH", "0"}, BadValue{"TIERMEM_IO_QUEUE_DEPTH", "9999"},
        BadValue{"TIERMEM_IO_QUEUE_DEPTH", "deep"}, BadValue{"TIERMEM_NUMA", "near"},
        BadValue{"TIERMEM_NUMA", "-2"}, BadValue{"TIERMEM_LOG_LEVEL", "verbose"},
        BadValue{"TIERMEM_EMU_LINK_GBPS", "fast"}, BadValue{"TIERMEM_EMU_LINK_GBPS", "-3"},
        BadValue{"TIERMEM_EMU_LINK_GBPS", "nan"}, BadValue{"TIERMEM_EMU_LINK_GBPS", "0x10"},
        BadValue{"TIERMEM_LINK_GBPS", "0x10"}, BadValue{"TIERMEM_NVME_GBPS", "inf"},
        BadValue{"TIERMEM_IO_THREADS", "0"}, BadValue{"TIERMEM_IO_THREADS", "65"},
        BadValue{"TIERMEM_PREFETCH_DEPTH", "-1"}, BadValue{"TIERMEM_PREFETCH_DEPTH", "2000"},
        BadValue{"TIERMEM_PREFETCH_BYTES", "some"}, BadValue{"TIERMEM_PLACEMENT", "zero3"},
        BadValue{"TIERMEM_TRACE", "/tmp/dir/"}, BadValue{"TIERMEM_CHECKSUM", "crc32"},
        BadValue{"TIERMEM_TRACE", "/tmp/t-%d.json"}, BadValue{"TIERMEM_TRACE", "/tmp/t-%"},
        BadValue{"TIERMEM_LOCAL_RANK", "-1"}, BadValue{"TIERMEM_LOCAL_RANK", "65536"},
        BadValue{"TIERMEM_LOCAL_RANK", "first"}));

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
  auto c =
      LoadConfig({}, FakeEnv({{"TIERMEM_ENV_FILE", path}, {"TIERMEM_IO_QUEUE_DEPTH", "8"}}), {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->io_block_size, 4u << 20);  // from the file
  EXPECT_EQ(c->io_queue_depth, 8u);       // the environment wins over the file
  EXPECT_EQ(c->prefetch_depth, 2u);       // quoted value
  EXPECT_EQ(c->io_threads, 1u);           // default
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

TEST_F(EnvFileTest, DevNullIsAnEmptyFile) {
  // As GIT_CONFIG=/dev/null: the way users say "no file", read as empty; any other device is
  // still refused.
  auto c = LoadConfig(
      {}, FakeEnv({{"TIERMEM_ENV_FILE", "/dev/null"}, {"TIERMEM_IO_QUEUE_DEPTH", "8"}}), {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->io_queue_depth, 8u);
  EXPECT_EQ(c->Value("TIERMEM_ENV_FILE"), "/dev/null");
  auto zero = LoadConfig({}, FakeEnv({{"TIERMEM_ENV_FILE", "/dev/zero"}}), {});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("not a regular file"), absl::string_view::npos)
      << zero.status();
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
  for (const Case& k :
       {Case{"TIERMEM_IO_THREADS 2\n", ":1: expected"},
        Case{"# ok\nIO_THREADS=2\n", ":2: \"IO_THREADS\" is not a TIERMEM_"},
        Case{"exportTIERMEM_IO_THREADS=2\n", ":1: expected"},
        Case{"TIERMEM_IO_THREADS=$N\n", ":1: shell expansion ($, `) is not supported"},
        Case{"TIERMEM_IO_THREADS=\"3\n", ":1: an unmatched quote"},
        Case{"TIERMEM_IO_THREADS=3\\4\n", ":1: escapes"},
        Case{"TIERMEM_LIBRARY=/x.so\n", ":1: TIERMEM_LIBRARY is read from the environment only"},
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

// A FIFO once blocked runtime creation forever (waiting for a writer); a device was read as a
// file. Both are refused at once, naming the file.
TEST_F(EnvFileTest, FifosAndDevicesAreRefusedWithoutWaiting) {
  const std::string fifo = dir_.path() + "/fifo.env";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  for (const std::string& path : {fifo, std::string("/dev/zero"), dir_.path()}) {
    auto c = LoadConfig({}, FakeEnv({{"TIERMEM_ENV_FILE", path}}), {});
    ASSERT_FALSE(c.ok()) << path;
    std::string msg(c.status().message());
    EXPECT_NE(msg.find("TIERMEM_ENV_FILE=\"" + path + "\""), std::string::npos) << msg;
    EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
  }
}

// The runtime reads the file named in the process environment.
TEST_F(EnvFileTest, RuntimeLoadsIt) {
  std::string path = Write("export TIERMEM_IO_QUEUE_DEPTH=7\n");
  tiermem::testing::ScopedEnv env("TIERMEM_ENV_FILE", path.c_str());
  tm_config cfg = tiermem::testing::SmallConfig(dir_.path());
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();
  char value[64];
  ASSERT_EQ(tm_runtime_config_value(rt, "TIERMEM_IO_QUEUE_DEPTH", value, sizeof value, nullptr),
            TM_OK);
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
