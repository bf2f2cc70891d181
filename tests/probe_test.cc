// tiermem-probe --json: valid JSON that carries every field docs/probe.md's schema requires.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "json_check.h"
#include "lib/config/config.h"
#include "test_util.h"
#include "tiermem/tiermem.h"
#include "tools/shared/json.h"

namespace tiermem {
namespace {

std::string Capture(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::string SmallProbe(const std::string& paths, const std::string& flags) {
  return "TIERMEM_DEVICE=emulated TIERMEM_HBM_BYTES=64MiB TIERMEM_DRAM_BYTES=96MiB "
         "TIERMEM_NVME_BYTES=128MiB TIERMEM_NVME_PATHS=" +
         paths + " " + TIERMEM_PROBE + " " + flags + " 2>/dev/null";
}

TEST(Probe, JsonFollowsTheSchema) {
  testing::TempDir dir;
  const std::string cmd =
      SmallProbe(dir.path(),
                 "--json --no-demo --bench-bytes 16MiB --repeats 2 "
                 "--sweep-bytes 8MiB --sweep-blocks 64KiB,1MiB --sweep-depths 1,8");
  const std::string out = Capture(cmd);
  ASSERT_FALSE(out.empty()) << cmd;
  EXPECT_TRUE(testing::Json(out).Valid()) << out;
  // Every key the schema marks required, with the type it gives.
  for (const char* key :
       {"\"schema\": \"tiermem-probe/1\"",
        "\"tiermem_version\": \"",
        "\"seconds\": ",
        "\"device\": {\"kind\": \"emulated\"",
        "\"gpu\": {\"present\": false, \"reason\": \"TIERMEM_DEVICE=emulated\"}",
        "\"tiers\": {\"hbm_bytes\": 67108864",
        "\"numa\": {\"node\": ",
        "\"io\": {\"engine\": \"",
        "\"buffers_registered\": ",
        "\"staging\": {\"slot_bytes\": ",
        "\"nvme_paths\": [",
        "\"alignment_source\": \"",
        "\"bandwidth\": [",
        "{\"from\": \"dram\", \"to\": \"nvme\"",
        "{\"from\": \"nvme\", \"to\": \"dram\"",
        "{\"from\": \"dram\", \"to\": \"hbm\"",
        "{\"from\": \"hbm\", \"to\": \"dram\"",
        "\"gbps\": ",
        "\"copies\": [",
        "{\"from\": \"dram\", \"to\": \"hbm\", \"host_memory\": \"pinned\", \"bytes\": 16777216, "
        "\"repeats\": 2, \"timer\": \"wall-clock\"",
        "{\"from\": \"hbm\", \"to\": \"dram\", \"host_memory\": \"pinned\"",
        "{\"from\": \"dram\", \"to\": \"hbm\", \"host_memory\": \"pageable\"",
        "{\"from\": \"hbm\", \"to\": \"dram\", \"host_memory\": \"pageable\"",
        "{\"from\": \"hbm\", \"to\": \"hbm\", \"host_memory\": \"\"",
        "\"io_sweep\": [",
        "\"engine\": \"uring\", \"bytes\": 8388608",
        "{\"block_size\": 65536, \"queue_depth\": 1, \"threads\": 1, \"write_gbps\": ",
        "{\"block_size\": 1048576, \"queue_depth\": 8, \"threads\": 1, \"write_gbps\": ",
        "\"best\": {\"block_size\": ",
        "\"dram\": {\"kernel\": \"triad\", \"bytes\": 16777216, \"threads\": ",
        "\"repeats\": 2, \"triad_gbps\": "}) {
    EXPECT_NE(out.find(key), std::string::npos) << "missing " << key << " in\n" << out;
  }
  EXPECT_EQ(out.find("\"demo\""), std::string::npos) << "--no-demo";
  EXPECT_EQ(out.find("\"tune\""), std::string::npos) << "no --tune";
  // The runtime's NVMe read is the drive's, not a hit on the clean DRAM copy that inclusive DRAM
  // (on by default) keeps: that no-op once printed 148882 GB/s.
  const size_t read = out.find("{\"from\": \"nvme\", \"to\": \"dram\"");
  ASSERT_NE(read, std::string::npos);
  const size_t gbps = out.find("\"gbps\": ", read);
  ASSERT_NE(gbps, std::string::npos);
  const double nvme_read_gbps = std::strtod(out.c_str() + gbps + 8, nullptr);
  EXPECT_GT(nvme_read_gbps, 0.0);
  EXPECT_LT(nvme_read_gbps, 200.0) << "an NVMe read that moved no bytes";
}

// Two paths: a sweep of each and one striped over both.
TEST(Probe, SweepsEachPathAndStriped) {
  testing::TempDir a, b;
  const std::string out =
      Capture(SmallProbe(a.path() + ":" + b.path(),
                         "--json --no-demo --bench-bytes 8MiB --repeats 1 --sweep-bytes 4MiB "
                         "--sweep-blocks 1MiB --sweep-depths 4"));
  EXPECT_TRUE(testing::Json(out).Valid()) << out;
  for (const std::string& key :
       {"{\"target\": \"" + a.path() + "\", \"paths\": [\"" + a.path() + "\"]",
        "{\"target\": \"" + b.path() + "\", \"paths\": [\"" + b.path() + "\"]",
        "{\"target\": \"striped\", \"paths\": [\"" + a.path() + "\", \"" + b.path() + "\"]"}) {
    EXPECT_NE(out.find(key), std::string::npos) << "missing " << key << " in\n" << out;
  }
}

// Above two paths, each path alone is swept at the configured block size only, unless
// --sweep-full; the striped sweep always gets the whole grid.
TEST(Probe, ManyPathsSweepEachAloneAtTheConfiguredBlock) {
  testing::TempDir a, b, c;
  const std::string paths = a.path() + ":" + b.path() + ":" + c.path();
  const std::string flags =
      "--json --no-demo --bench-bytes 8MiB --repeats 1 --sweep-bytes 6MiB "
      "--sweep-blocks 256KiB,1MiB --sweep-depths 2";
  const std::string out = Capture(SmallProbe(paths, flags));
  ASSERT_TRUE(testing::Json(out).Valid()) << out;
  auto parsed = ParseJson(out);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const auto& targets = parsed->Find("io_sweep")->array();
  ASSERT_EQ(targets.size(), 4u);
  for (size_t i = 0; i < 3; ++i) {
    const auto& points = targets[i].Find("points")->array();
    ASSERT_EQ(points.size(), 1u) << targets[i].Find("target")->string();
    EXPECT_EQ(points[0].Find("block_size")->number(), 1 << 20);  // TIERMEM_IO_BLOCK_SIZE
  }
  EXPECT_EQ(targets[3].Find("target")->string(), "striped");
  EXPECT_EQ(targets[3].Find("points")->array().size(), 2u);
  const std::string full = Capture(SmallProbe(paths, flags + " --sweep-full"));
  parsed = ParseJson(full);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (const auto& t : parsed->Find("io_sweep")->array()) {
    EXPECT_EQ(t.Find("points")->array().size(), 2u) << t.Find("target")->string();
  }
}

// --tune writes an env file that the runtime then loads, with every value it chose.
TEST(Probe, TuneWritesAnEnvFileTheRuntimeLoads) {
  testing::TempDir dir;
  const std::string file = dir.path() + "/tuned.env";
  const std::string out = Capture(SmallProbe(
      dir.path(), "--json --tune --tune-budget 2 --tune-bytes 16MiB --tune-out " + file));
  EXPECT_TRUE(testing::Json(out).Valid()) << out;
  EXPECT_NE(out.find("\"tune\": {\"file\": \"" + file + "\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"io_tuned\": {\"block_size\": "), std::string::npos) << out;
  auto parsed = ParseEnvFile(file);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  for (const char* v : {"TIERMEM_IO_BLOCK_SIZE", "TIERMEM_IO_QUEUE_DEPTH", "TIERMEM_IO_THREADS",
                        "TIERMEM_PREFETCH_DEPTH", "TIERMEM_NVME_GBPS"}) {
    EXPECT_TRUE(parsed->values.contains(v)) << v;
  }
  // The prefetch depth in it is either measured or said to be the setting kept (a 2 s budget
  // often runs out first: the file said nothing, as if tuned).
  FILE* f = std::fopen(file.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string text(8192, '\0');
  text.resize(std::fread(text.data(), 1, text.size(), f));
  std::fclose(f);
  EXPECT_TRUE(text.find("# step workload, prefetch depth ") != std::string::npos ||
              text.find("# prefetch depth not measured") != std::string::npos)
      << text;
  // The runtime reads it: each value's source is the file, and the values match.
  testing::ScopedEnv env("TIERMEM_ENV_FILE", file.c_str());
  tm_config cfg = testing::SmallConfig(dir.path());
  tm_runtime rt;
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << tm_last_error();
  char value[64];
  ASSERT_EQ(tm_runtime_config_value(rt, "TIERMEM_IO_QUEUE_DEPTH", value, sizeof value, nullptr),
            TM_OK);
  EXPECT_EQ(std::string(value), parsed->values.at("TIERMEM_IO_QUEUE_DEPTH").value);
  ASSERT_EQ(tm_runtime_config_value(rt, "TIERMEM_PREFETCH_DEPTH", value, sizeof value, nullptr),
            TM_OK);
  EXPECT_EQ(std::string(value), parsed->values.at("TIERMEM_PREFETCH_DEPTH").value);
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
  auto c = LoadConfig({}, ProcessEnvironment(), {});
  ASSERT_TRUE(c.ok()) << c.status();
  for (const auto& e : c->entries) {
    if (parsed->values.contains(e.name)) {
      EXPECT_EQ(e.source, "file " + file) << e.name;
    }
  }
}

// tiermem-plan --probe takes its bandwidths from the probe's JSON.
TEST(Probe, PlanReadsTheProbesBandwidths) {
  testing::TempDir dir;
  const std::string file = dir.path() + "/probe.json";
  Capture(SmallProbe(dir.path(),
                     "--json --no-demo --bench-bytes 16MiB --repeats 2 --no-sweep > " + file));
  const std::string plan = std::string(TIERMEM_PLAN) +
                           " --layers 32 --hidden 4096 --heads 32 --seq 4096 --micro-batch 8"
                           " --params 7B --hbm 80GiB --tflops 400 --json --probe " +
                           file;
  const std::string out = Capture(plan + " 2>&1");
  EXPECT_NE(out.find("\"link_source\":\"probe copies dram <-> hbm, pinned"), std::string::npos)
      << out;
  EXPECT_NE(out.find("\"nvme_source\":\"probe runtime path dram <-> nvme"), std::string::npos)
      << out;
  EXPECT_NE(out.find("measured without a GPU"), std::string::npos) << out;  // the warning
  EXPECT_NE(out.find("\"dram_source\":\"probe CPU Adam step, kernel "), std::string::npos) << out;
  EXPECT_NE(out.find("\"optimizer_step\":{\"priced\":true"), std::string::npos) << out;
  // A flag given wins over the file.
  const std::string flagged = Capture(plan + " --link-gbps 25 2>/dev/null");
  EXPECT_NE(flagged.find("\"link_gbps\":25,\"link_source\":\"--link-gbps\""), std::string::npos)
      << flagged;
  EXPECT_TRUE(testing::Json(flagged).Valid()) << flagged;
  // A file that is not probe output is a usage error naming it.
  const std::string bad = Capture(std::string(TIERMEM_PLAN) +
                                  " --layers 1 --probe /nonexistent 2>&1; echo \"exit=$?\"");
  EXPECT_NE(bad.find("--probe /nonexistent: No such file"), std::string::npos) << bad;
  EXPECT_NE(bad.find("exit=2"), std::string::npos) << bad;
}

TEST(Probe, BadFlagsExitTwo) {
  for (const char* flags :
       {"--sweep-blocks 3000", "--sweep-depths 0", "--tune-budget -1", "--repeats x",
        "--tune-bytes 1KiB", "--frobnicate",
        // two runs asked for at once: refused, not one of them ignored
        "--tune --sweep-only", "--sweep-only --no-sweep", "--config --json", "--config --tune",
        "--sweep-only --no-bench",
        // a value for what the run does not do: refused, not ignored (an outside client ran a
        // whole probe, exit 0, with --tune-out and no --tune)
        "--tune-out x.env --no-bench", "--tune-budget 5", "--sweep-blocks 1MiB --no-sweep",
        "--sweep-depths 4 --no-bench", "--repeats 3 --config", "--bench-bytes 64MiB --tune",
        "--repeats 2 --sweep-only", "--sweep-full --tune", "--config --no-bench",
        "--config --sweep-only", "--tune --no-demo", "--tune --no-sweep"}) {
    const std::string out =
        Capture(std::string(TIERMEM_PROBE) + " " + flags + " 2>&1; echo \"exit=$?\"");
    EXPECT_NE(out.find("exit=2"), std::string::npos) << flags << ": " << out;
  }
  // A bad value is quoted.
  const std::string quoted =
      Capture(std::string(TIERMEM_PROBE) + " --repeats abc 2>&1; echo \"exit=$?\"");
  EXPECT_NE(quoted.find("--repeats \"abc\": needs a count"), std::string::npos) << quoted;
  // A value flag given last without its value says so (it was "unknown argument").
  const std::string out =
      Capture(std::string(TIERMEM_PROBE) + " --bench-bytes 2>&1; echo \"exit=$?\"");
  EXPECT_NE(out.find("--bench-bytes needs a value"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=2"), std::string::npos) << out;
}

TEST(Probe, TuneOutThatCannotBeWrittenFailsBeforeTheSearch) {
  const auto start = std::chrono::steady_clock::now();
  const std::string out =
      Capture(std::string("TIERMEM_DEVICE=emulated ") + TIERMEM_PROBE +
              " --tune --tune-out /nonexistent-dir/x.env 2>&1; echo \"exit=$?\"");
  EXPECT_NE(out.find("--tune-out /nonexistent-dir/x.env cannot be written"), std::string::npos)
      << out;
  EXPECT_NE(out.find("exit=1"), std::string::npos) << out;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "it tuned first";
}

TEST(Probe, DemoReadsEveryTensorBackFromNvme) {
  // Inclusive DRAM (the default) would answer the reads from clean DRAM copies: the demo runs
  // with exclusive tiers, so that "came back bit-exact" is a round trip through NVMe.
  // TIERMEM_TRACE holds the demo's moves: the probe's other runtime, destroyed last, used to
  // replace them with its own trace, empty of them.
  testing::TempDir dir;
  const std::string trace = dir.path() + "/trace.json";
  const std::string out = Capture(
      "TIERMEM_DEVICE=emulated TIERMEM_DRAM_BYTES=256MiB TIERMEM_NVME_BYTES=512MiB "
      "TIERMEM_TRACE=" +
      trace + " TIERMEM_NVME_PATHS=" + dir.path() + " " + TIERMEM_PROBE + " --no-bench 2>&1");
  EXPECT_NE(out.find("6/6 tensors came back bit-exact"), std::string::npos) << out;
  EXPECT_NE(out.find("nvme->dram 384 MiB"), std::string::npos) << out;
  std::ifstream in(trace);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* name : {"\"act-0\"", "\"act-5\""})
    EXPECT_NE(json.find(name), std::string::npos) << name << " not in " << json;
}

// --config shows what each budget resolved to, HBM, DRAM and NVMe alike, beside the percentage
// given (DRAM and NVMe used to show the percentage and HBM the bytes).
TEST(Probe, ConfigShowsResolvedBudgetsBesideWhatWasGiven) {
  testing::TempDir dir;
  const std::string out = Capture(
      "TIERMEM_DEVICE=emulated TIERMEM_HBM_BYTES=1% "
      "TIERMEM_DRAM_BYTES=1% TIERMEM_NVME_BYTES=1% TIERMEM_NVME_PATHS=" +
      dir.path() + " " + TIERMEM_PROBE + " --config 2>&1");
  for (const char* name : {"TIERMEM_HBM_BYTES", "TIERMEM_DRAM_BYTES", "TIERMEM_NVME_BYTES"}) {
    const size_t at = out.find(name);
    ASSERT_NE(at, std::string::npos) << out;
    const std::string line = out.substr(at, out.find('\n', at) - at);
    EXPECT_NE(line.find("(environment: 1%)"), std::string::npos) << line;
    EXPECT_NE(line.find("iB "), std::string::npos) << line;  // bytes, in a binary unit
  }
}

TEST(Probe, BadSettingExitsNonZeroNamingIt) {
  const std::string out = Capture(std::string("TIERMEM_IO_ENGINE=aio ") + TIERMEM_PROBE +
                                  " --json 2>&1; echo \"exit=$?\"");
  EXPECT_NE(out.find("TIERMEM_IO_ENGINE"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=1"), std::string::npos) << out;
}

}  // namespace
}  // namespace tiermem
