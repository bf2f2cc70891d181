// tiermem-probe --json: valid JSON that carries every field docs/probe.md's schema requires.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "json_check.h"
#include "test_util.h"

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

TEST(Probe, JsonFollowsTheSchema) {
  testing::TempDir dir;
  const std::string cmd = "TIERMEM_DEVICE=emulated TIERMEM_HBM_BYTES=64MiB TIERMEM_DRAM_BYTES=96MiB "
                          "TIERMEM_NVME_BYTES=128MiB TIERMEM_NVME_PATHS=" + dir.path() + " " +
                          TIERMEM_PROBE + std::string(" --json --no-demo --bench-bytes 16MiB 2>/dev/null");
  const std::string out = Capture(cmd);
  ASSERT_FALSE(out.empty()) << cmd;
  EXPECT_TRUE(testing::Json(out).Valid()) << out;
  // Every key the schema marks required, with the type it gives.
  for (const char* key : {"\"schema\": \"tiermem-probe/1\"", "\"tiermem_version\": \"",
                          "\"device\": {\"kind\": \"emulated\"", "\"tiers\": {\"hbm_bytes\": 67108864",
                          "\"numa\": {\"node\": ", "\"io\": {\"engine\": \"",
                          "\"buffers_registered\": ", "\"staging\": {\"slot_bytes\": ",
                          "\"nvme_paths\": [", "\"alignment_source\": \"", "\"bandwidth\": [",
                          "{\"from\": \"dram\", \"to\": \"nvme\"", "{\"from\": \"nvme\", \"to\": \"dram\"",
                          "{\"from\": \"dram\", \"to\": \"hbm\"", "{\"from\": \"hbm\", \"to\": \"dram\"",
                          "\"gbps\": "}) {
    EXPECT_NE(out.find(key), std::string::npos) << "missing " << key << " in\n" << out;
  }
  EXPECT_EQ(out.find("\"demo\""), std::string::npos) << "--no-demo";
}

TEST(Probe, BadSettingExitsNonZeroNamingIt) {
  const std::string out =
      Capture(std::string("TIERMEM_IO_ENGINE=aio ") + TIERMEM_PROBE + " --json 2>&1; echo \"exit=$?\"");
  EXPECT_NE(out.find("TIERMEM_IO_ENGINE"), std::string::npos) << out;
  EXPECT_NE(out.find("exit=1"), std::string::npos) << out;
}

}  // namespace
}  // namespace tiermem
