// The runtime as the tests of its C++ API make it (lib/runtime/runtime.h): on the emulated
// device, with a test's budgets and settings, and tensors made and read back in one call.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "lib/config/config.h"
#include "lib/runtime/runtime.h"

namespace tiermem::testing {

// Overrides for a runtime on the emulated device with these budgets and its swap files in
// `dir`; what a test leaves alone is the library's default.
inline ConfigOverrides Emulated(const std::string& dir, uint64_t hbm, uint64_t dram,
                                uint64_t nvme) {
  ConfigOverrides o;
  o.device = DeviceKind::kEmulated;
  o.hbm_bytes = SizeSetting{hbm, 0};
  o.dram_bytes = SizeSetting{dram, 0};
  o.nvme_bytes = SizeSetting{nvme, 0};
  o.nvme_paths = dir;
  return o;
}

// The runtime of `o`, whose configuration sees `env` as its whole environment (the machine's
// TIERMEM_* variables do not reach a test's runtime). nullptr, with a test failure, when the
// configuration or the runtime is refused.
inline std::unique_ptr<Runtime> MakeRuntime(const ConfigOverrides& o,
                                            const std::map<std::string, std::string>& env = {}) {
  auto lookup = [&env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  auto config = LoadConfig(o, lookup, {});
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  auto rt = Runtime::Create(*config);
  EXPECT_TRUE(rt.ok()) << rt.status();
  return rt.ok() ? std::move(*rt) : nullptr;
}

// A tensor of `bytes` homed in `home` (a tm_tier, or TM_TIER_BY_PLACEMENT); 0, with a test
// failure, when it is refused.
inline uint64_t NewTensor(Runtime& rt, const std::string& name, uint64_t bytes, int home) {
  TensorDesc d;
  d.bytes = bytes;
  d.home_tier = home;
  d.name = name;
  auto h = rt.CreateTensor(d);
  EXPECT_TRUE(h.ok()) << h.status();
  return h.ok() ? *h : 0;
}

// The tensor's first `bytes` bytes.
inline std::vector<uint8_t> ReadAll(Runtime& rt, uint64_t h, uint64_t bytes) {
  std::vector<uint8_t> out(bytes);
  auto s = rt.Read(h, 0, out.data(), bytes);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

}  // namespace tiermem::testing
