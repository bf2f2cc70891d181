// tiermem-plan as a user runs it: the README's 7B example (and that the docs show what it
// prints), --json carrying the combinations and the priced optimizer step, and errors that name
// the flag that is missing or bad.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "tools/shared/json.h"

namespace tiermem {
namespace {

struct PlanRun {
  std::string out;  // stdout and stderr together
  int status = -1;
};

PlanRun Plan(const std::string& args) {
  PlanRun r;
  const std::string command = std::string(TIERMEM_PLAN) + " " + args + " 2>&1";
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int w = pclose(p);
  r.status = WIFEXITED(w) ? WEXITSTATUS(w) : -1;
  return r;
}

std::string ReadSource(const std::string& path) {
  std::ifstream f(std::string(TIERMEM_SOURCE_DIR) + "/" + path);
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

constexpr const char* kModel =
    "--layers 32 --hidden 4096 --heads 32 --seq 4096 --micro-batch 8 --params 7B";
constexpr const char* kMachine = "--link-gbps 25 --nvme-gbps 6 --dram-gbps 100 --tflops 400";

// The README's example: per-layer recompute with the optimizer state in DRAM, the CPU step
// priced and hidden under backward.
TEST(PlanCli, ReadmeExampleRecommendsRecomputeWithOptimizerOffload) {
  const PlanRun r = Plan(std::string(kModel) + " --hbm 80GiB " + kMachine);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("recommended: per-layer recompute + optimizer-state offload (38.33 GiB, "
                       "+1.4074 s/step"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("the CPU optimizer step (1.960 s) hides under backward"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("as cheap or cheaper, but over the budget:"), std::string::npos) << r.out;
  // The docs show what the tool prints: the README its recommendation, docs/planner.md all of it.
  const std::string readme = ReadSource("README.md"), doc = ReadSource("docs/planner.md");
  ASSERT_FALSE(readme.empty());
  ASSERT_FALSE(doc.empty());
  const std::string recommended = r.out.substr(r.out.find("recommended: "));
  EXPECT_NE(readme.find(recommended.substr(0, recommended.find("\n"))), std::string::npos)
      << "README.md does not show\n"
      << recommended;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_NE(doc.find(line), std::string::npos) << "docs/planner.md does not show: " << line;
  }
}

TEST(PlanCli, JsonCarriesCombinationsAndTheOptimizerStep) {
  const PlanRun r = Plan(std::string(kModel) + " --hbm 80GiB " + kMachine + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  auto v = ParseJson(r.out);
  ASSERT_TRUE(v.ok()) << v.status() << "\n" << r.out;
  const JsonValue* step = v->Find("optimizer_step");
  ASSERT_NE(step, nullptr) << r.out;
  EXPECT_TRUE(step->Find("priced")->boolean());
  EXPECT_EQ(step->Find("bytes_per_param")->number(), 28);
  EXPECT_NEAR(step->Find("cpu_seconds")->number(), 1.96, 1e-6);
  EXPECT_EQ(step->Find("link_bytes")->number(), 28e9);
  EXPECT_EQ(v->Find("dram_source")->string(), "--dram-gbps");
  const JsonValue* combos = v->Find("combinations");
  ASSERT_NE(combos, nullptr);
  ASSERT_EQ(combos->array().size(), 27u);
  int fitting = 0;
  for (const JsonValue& c : combos->array()) {
    fitting += c.Find("fits")->boolean() ? 1 : 0;
    EXPECT_NEAR(c.Find("added_seconds")->number(),
                c.Find("recompute_seconds")->number() +
                    c.Find("transfer_exposed_seconds")->number() +
                    c.Find("optimizer_exposed_seconds")->number(),
                1e-6);
  }
  EXPECT_GT(fitting, 1);
  EXPECT_EQ(v->Find("recommended")->string(), "per-layer recompute + optimizer-state offload");
  ASSERT_EQ(v->Find("recommended_rungs")->array().size(), 3u);
  EXPECT_EQ(v->Find("rungs")->array().size(), 7u);
  // A kernel that moves fewer bytes per parameter is priced as such.
  const PlanRun k = Plan(std::string(kModel) + " --hbm 80GiB " + kMachine +
                         " --optimizer-bytes-per-param 14 --json");
  auto kv = ParseJson(k.out);
  ASSERT_TRUE(kv.ok()) << k.out;
  EXPECT_NEAR(kv->Find("optimizer_step")->Find("cpu_seconds")->number(), 0.98, 1e-6);
}

TEST(PlanCli, ErrorsNameTheFlag) {
  struct Case {
    std::string args;
    const char* says;
  };
  const std::string model = kModel;
  for (const Case& c : {
           Case{model + " --link-gbps 25 --tflops 400", "--hbm is missing"},
           Case{model + " --hbm 80GiB --link-gbps 25", "--tflops is missing"},
           Case{model + " --hbm 80GiB --tflops 400", "--link-gbps is missing"},
           Case{"--hbm 80GiB --tflops 400 --link-gbps 25", "--layers is missing"},
           Case{model + " --hbm 0 --tflops 400 --link-gbps 25", "--hbm 0: must be positive"},
           Case{model + " --hbm lots --tflops 400 --link-gbps 25", "--hbm lots: needs a size"},
           Case{model + " --hbm 80GiB --tflops 0 --link-gbps 25",
                "--tflops 0: must be at least 1 GFLOP/s"},
           Case{model + " --hbm 80GiB --tflops 400 --link-gbps 25 --dram-gbps -3",
                "--dram-gbps -3: must be at least 1 MB/s (0.001 GB/s), or 0"},
           Case{model + " --hbm 80GiB --tflops 400 --link-gbps 25 --optimizer-bytes-per-param 0",
                "--optimizer-bytes-per-param 0: must be positive"},
           Case{model + " --hbm 80GiB --tflops 400 --link-gbps x", "--link-gbps x: not a number"},
           Case{model + " --hbm 80GiB --tflops 400 --link-gbps 25 --heads 0",
                "--heads 0: at least 1"},
           Case{model + " --hbm 80GiB --tflops 400 --link-gbps 25 --frobnicate 1",
                "unknown argument --frobnicate"},
           Case{model + " --hbm", "--hbm needs a value"},
           Case{model + " --hbm 80GiB --tflops 400 --link-gbps 1e400",
                "--link-gbps 1e400: must be finite"},
           Case{model + " --hbm 80GiB --tflops 400 --link-gbps 25 --nvme-gbps 1e-300",
                "--nvme-gbps 1e-300: must be at least 1 MB/s"},
           // Every bad value at once (an outside client fixed nine flags one run at a time).
           Case{"--layers x --hidden -1 --heads 0 --seq 2048 --micro-batch 1 --params 7B "
                "--hbm 80GiB --tflops 400 --link-gbps 25 --frobnicate",
                "--layers x: not a number; unknown argument --frobnicate"},
           Case{"--layers 32 --hidden -1 --heads 0 --seq 2048 --micro-batch 1 --params 7B "
                "--hbm 80GiB --tflops 0 --link-gbps 25",
                "--hidden -1: at least 1; --heads 0: at least 1; --tflops 0: must be at least"},
           // ... each pass hid the next: unreadable, out of range and across fields at once.
           Case{"--layers 2.5 --tp 3 --hidden 4096 --heads 32 --seq 2048 --micro-batch 1 "
                "--params 7B --hbm 80GiB --tflops 400 --link-gbps 0 --dram-gbps abc",
                "--dram-gbps abc: not a number; --link-gbps 0: must be at least 1 MB/s (0.001 "
                "GB/s); --layers 2.5: must be a whole number; heads=32 is not a multiple of "
                "tensor_parallel=3"},
       }) {
    const PlanRun r = Plan(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
  }
}

// Without a DRAM bandwidth the optimizer offload is left out, and the output says so.
TEST(PlanCli, WithoutDramTheOptimizerStepIsNotPriced) {
  const PlanRun r =
      Plan(std::string(kModel) + " --hbm 80GiB --link-gbps 25 --nvme-gbps 6 --tflops 400");
  EXPECT_NE(r.out.find("optimizer step on the CPU: not priced"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not priced: 18 combinations (no DRAM bandwidth); 14 of them would fit"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("recommended: per-layer recompute + optimizer"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace tiermem
