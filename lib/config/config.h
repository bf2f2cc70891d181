// Every TIERMEM_* setting: parsed once, validated, with the source of each value recorded.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tiermem {

enum class DeviceKind { kAuto, kCuda, kEmulated };
enum class IoEngineKind { kAuto, kUring, kPosix };
enum class NumaMode { kAuto, kOff, kNode };
enum class LogLevel { kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };
// Tensor class -> home tier presets (TIERMEM_PLACEMENT).
enum class Placement { kNone, kZeroOffload, kZeroInfinity, kActivations };
// How the HBM tier lays out its copies when no framework allocator is given
// (TIERMEM_HBM_LAYOUT): one slab sub-allocated by offset, or chunks mapped copy by copy.
enum class HbmLayout { kSlab, kMapped };
// Integrity of the NVMe tier (TIERMEM_CHECKSUM).
enum class ChecksumKind { kOff, kXxh3 };

// A byte size given either absolutely or as a percentage of a tier's physical size.
struct SizeSetting {
  uint64_t bytes = 0;
  double percent = 0;  // > 0 when given as "N%"
  // Bytes for a tier whose physical size is `physical`.
  uint64_t Resolve(uint64_t physical) const;
  std::string ToString() const;
};

// The framework's device allocator (tm_config.device_alloc/device_free), or none.
struct DeviceAllocatorHooks {
  void* (*alloc)(void* user, size_t bytes, int32_t device, void* stream) = nullptr;
  void (*free)(void* user, void* ptr, size_t bytes, int32_t device, void* stream) = nullptr;
  void* user = nullptr;
  bool set() const { return alloc != nullptr; }
};

// Values set in code (the C config struct); each wins over the environment.
struct ConfigOverrides {
  DeviceAllocatorHooks device_allocator;
  std::optional<int> local_rank, local_world_size;
  std::optional<DeviceKind> device;
  std::optional<int> cuda_device;
  std::optional<SizeSetting> hbm_bytes, dram_bytes, nvme_bytes;
  // No tm_config field: set in code by benches and tests.
  std::optional<HbmLayout> hbm_layout;
  std::optional<bool> dram_inclusive;
  std::optional<bool> hbm_hand_on;
  std::optional<std::string> nvme_paths;
  std::optional<IoEngineKind> io_engine;
  std::optional<uint32_t> io_block_size, io_queue_depth, io_threads;
  std::optional<std::pair<NumaMode, int>> numa;
  std::optional<LogLevel> log_level;
  std::optional<double> emu_link_gbps;
  std::optional<uint32_t> prefetch_depth;
  std::optional<SizeSetting> prefetch_bytes;
  std::optional<Placement> placement;
  std::optional<std::string> trace;
  std::optional<ChecksumKind> checksum;
};

struct Config {
  DeviceKind device = DeviceKind::kAuto;
  int cuda_device =
      -1;  // -1 ("auto"): the local rank mod the devices visible (lib/config/local_ranks.h)
  SizeSetting hbm_bytes;   // zero means the backend's default
  SizeSetting dram_bytes;  // default 2 GiB
  SizeSetting nvme_bytes;  // default 4 GiB
  std::vector<std::string> nvme_paths;
  IoEngineKind io_engine = IoEngineKind::kAuto;
  uint32_t io_block_size = 1u << 20;
  uint32_t io_queue_depth = 32;
  uint32_t io_threads = 1;
  NumaMode numa = NumaMode::kAuto;
  int numa_node = -1;
  LogLevel log_level = LogLevel::kWarn;
  double emu_link_gbps = 0;
  uint32_t prefetch_depth = 4;  // scheduled uses kept moving up ahead of the current one
  SizeSetting prefetch_bytes;   // bound on prefetch bytes in flight; 0: half the HBM budget
  Placement placement = Placement::kNone;
  std::string trace;     // Chrome-trace JSON path (%p, %r expanded when the runtime opens it)
  std::string env_file;  // the TIERMEM_ENV_FILE that was read, or empty
  std::string library;   // TIERMEM_LIBRARY: for the Python package; the library only knows it
  int local_rank = 0;    // this process's rank on its node: names traces (%r), picks the device
  // Ranks on the node that share its percentage budgets; 1 when alone or unknown (then a rank
  // above 0 only names traces and picks the device).
  int local_world_size = 1;
  DeviceAllocatorHooks device_allocator;       // from tm_config only: not a setting
  ChecksumKind checksum = ChecksumKind::kOff;  // sums of what is written to NVMe, checked on read
  // An offload to NVMe keeps a clean DRAM copy while DRAM has room (TIERMEM_DRAM_INCLUSIVE).
  bool dram_inclusive = true;
  // A copy down from HBM to DRAM hands its HBM memory on piece by piece as it runs
  // (TIERMEM_HBM_HAND_ON; lib/runtime/vacate.cc).
  bool hbm_hand_on = true;
  HbmLayout hbm_layout = HbmLayout::kSlab;  // TIERMEM_HBM_LAYOUT
  // Bandwidths per direction in GB/s that price a recompute against the round trip it saves
  // (TIERMEM_LINK_GBPS, TIERMEM_NVME_GBPS; lib/config/settings_bandwidth.cc); 0: the default.
  double link_gbps = 0;
  double nvme_gbps = 0;

  // One row per setting: variable name, effective value as text, and where it came from
  // ("config", "environment" or "default").
  struct Entry {
    std::string name, value, source;
  };
  std::vector<Entry> entries;
  // TIERMEM_* variables in the environment that tiermem does not know (likely typos).
  std::vector<std::string> unknown_variables;
  // Values passed over with a fallback (a launcher's world size that does not fit its rank):
  // logged as warnings when a runtime is created.
  std::vector<std::string> warnings;

  // The effective value of `name` as text, or nullopt for an unknown name.
  std::optional<std::string> Value(absl::string_view name) const;
  // How a message names the setting `name`: "tm_config.<field>" when its value came from the
  // tm_config struct (source "config"), else the variable itself, so that a caller who never set
  // the variable is not sent looking for it.
  std::string SettingName(absl::string_view name) const;
};

// The variables of a TIERMEM_ENV_FILE: lines "[export ]TIERMEM_NAME=VALUE", '#' comments and
// blank lines; a value may be wrapped in one pair of quotes, and has no escapes or expansion.
struct EnvFile {
  struct Value {
    std::string value;
    int line = 0;
  };
  std::string path;
  absl::flat_hash_map<std::string, Value> values;
};
// InvalidArgument naming the file (and line) when it cannot be read or a line is malformed.
absl::StatusOr<EnvFile> ParseEnvFile(const std::string& path);

// Reads an environment variable; nullopt when unset. Tests substitute their own.
using EnvLookup = std::function<std::optional<std::string>(const char*)>;
EnvLookup ProcessEnvironment();
// Names of all TIERMEM_* variables set in the process environment.
std::vector<std::string> ProcessTiermemVariables();

// Builds the effective configuration: overrides, then environment, then the TIERMEM_ENV_FILE
// named in the environment, then defaults. An invalid value is an InvalidArgument error naming
// the variable and the value (and the file and line for a value from the file).
absl::StatusOr<Config> LoadConfig(const ConfigOverrides& overrides, const EnvLookup& env,
                                  const std::vector<std::string>& env_names);

// One TIERMEM_* variable: its row in the settings table, from which parsing, the
// unknown-variable warning, tm_runtime_config_value and tiermem-probe --config all derive, and
// which a test holds against docs/environment.md (one table row per variable, both ways).
struct Setting {
  std::string name;
  std::string values;       // accepted values: the "values" column of docs/environment.md
  std::string default_doc;  // the "default" column of docs/environment.md
  std::string summary;      // the first sentence of the docs' "what it does" column
  // The default as parser input and where it came from ("default", or e.g. "environment
  // LOCAL_RANK"); nullopt: the setting stays unset (its Config field keeps its initial value).
  struct Default {
    std::string text, source;
  };
  std::function<std::optional<Default>(const EnvLookup&)> default_value;
  // Validates `text` and stores it in the config; InvalidArgument naming the variable and value.
  std::function<absl::Status(absl::string_view text, Config&)> parse;
  // The effective value as text.
  std::function<std::string(const Config&)> format;
  // The tm_config field's value as parser input, or nullopt when not set there. Empty function:
  // the variable has no field.
  std::function<std::optional<std::string>(const ConfigOverrides&)> override_text;
  // Read from the environment only (never from a TIERMEM_ENV_FILE).
  bool environment_only = false;
};

// The tm_config field that sets the variable `name`: the name without TIERMEM_, in lower case
// (TIERMEM_NUMA: numa_node).
std::string ConfigField(absl::string_view name);

// Every setting, in documentation order.
const std::vector<Setting>& Settings();

// Parsers, exposed for tests. `what` names the setting in error messages.
absl::StatusOr<SizeSetting> ParseSize(absl::string_view what, absl::string_view text);
absl::StatusOr<uint64_t> ParseUnsigned(absl::string_view what, absl::string_view text);

absl::string_view DeviceKindName(DeviceKind k);
absl::string_view IoEngineKindName(IoEngineKind k);
absl::string_view LogLevelName(LogLevel l);
absl::string_view PlacementName(Placement p);
absl::string_view ChecksumKindName(ChecksumKind k);

// The names of Settings(), in documentation order.
const std::vector<absl::string_view>& KnownVariables();

}  // namespace tiermem
