// The settings table: one row per TIERMEM_* variable (name, values, default, parser, docs),
// checked against docs/environment.md by a test.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "lib/config/config.h"
#include "lib/config/config_internal.h"
#include "lib/config/local_ranks.h"

namespace tiermem {
namespace {

// Builders for the rows of the settings table. Each row's parser validates and stores; its
// formatter gives back text that the parser accepts (overrides are re-validated that way).

template <typename T, size_t N>
std::string ChoiceValues(const Choice<T> (&choices)[N]) {
  std::string out;
  for (const auto& c : choices) absl::StrAppend(&out, out.empty() ? "" : ", ", "`", c.name, "`");
  return out;
}

template <typename T, size_t N>
absl::string_view ChoiceName(const Choice<T> (&choices)[N], T value) {
  for (const auto& c : choices) {
    if (c.value == value) return c.name;
  }
  return "?";
}

Setting::Default Fixed(std::string text) { return {std::move(text), "default"}; }

template <typename T, size_t N>
Setting ChoiceRow(std::string name, std::string default_text, std::string summary, T Config::*field,
                  std::optional<T> ConfigOverrides::*override_field,
                  const Choice<T> (&choices)[N]) {
  Setting s;
  s.name = name;
  s.values = ChoiceValues(choices);
  s.default_doc = absl::StrCat("`", default_text, "`");
  s.summary = std::move(summary);
  s.default_value = [default_text](const EnvLookup&) { return Fixed(default_text); };
  s.parse = [name, field, &choices](absl::string_view t, Config& c) -> absl::Status {
    auto v = ParseChoice(name, t, choices);
    if (!v.ok()) return v.status();
    c.*field = *v;
    return absl::OkStatus();
  };
  s.format = [field, &choices](const Config& c) {
    return std::string(ChoiceName(choices, c.*field));
  };
  s.override_text = [override_field,
                     &choices](const ConfigOverrides& o) -> std::optional<std::string> {
    if (!(o.*override_field).has_value()) return std::nullopt;
    return std::string(ChoiceName(choices, *(o.*override_field)));
  };
  return s;
}

// An integer in [min, max]; `values_prefix` leads the docs' values column ("device index, ").
template <typename T>
Setting RangeRow(std::string name, std::string values_prefix, uint64_t min, uint64_t max,
                 uint64_t default_value, std::string summary, T Config::*field,
                 std::optional<T> ConfigOverrides::*override_field) {
  Setting s;
  s.name = name;
  s.values = absl::StrCat(values_prefix, min, "-", max);
  s.default_doc = absl::StrCat("`", default_value, "`");
  s.summary = std::move(summary);
  s.default_value = [default_value](const EnvLookup&) {
    return Fixed(absl::StrCat(default_value));
  };
  s.parse = [name, min, max, field](absl::string_view t, Config& c) -> absl::Status {
    auto v = ParseUnsigned(name, t);
    if (!v.ok()) return v.status();
    if (*v < min || *v > max) return Bad(name, t, absl::StrCat("must be ", min, " to ", max));
    c.*field = static_cast<T>(*v);
    return absl::OkStatus();
  };
  s.format = [field](const Config& c) { return absl::StrCat(c.*field); };
  s.override_text = [override_field](const ConfigOverrides& o) -> std::optional<std::string> {
    if (!(o.*override_field).has_value()) return std::nullopt;
    return absl::StrCat(*(o.*override_field));
  };
  return s;
}

// A byte size or a percentage. `default_text` empty: unset until given (shown as `unset_as`).
Setting SizeRow(std::string name, std::string values, std::string default_text,
                std::string default_doc, std::string summary, bool allow_zero,
                SizeSetting Config::*field,
                std::optional<SizeSetting> ConfigOverrides::*override_field,
                std::string unset_as = "") {
  Setting s;
  s.name = name;
  s.values = std::move(values);
  s.default_doc = std::move(default_doc);
  s.summary = std::move(summary);
  s.default_value = [default_text](const EnvLookup&) -> std::optional<Setting::Default> {
    if (default_text.empty()) return std::nullopt;
    return Fixed(default_text);
  };
  s.parse = [name, allow_zero, field](absl::string_view t, Config& c) -> absl::Status {
    auto v = ParseSize(name, t);
    if (!v.ok()) return v.status();
    if (!allow_zero && v->percent == 0 && v->bytes == 0) {
      return Bad(name, t, "must be greater than zero");
    }
    c.*field = *v;
    return absl::OkStatus();
  };
  s.format = [field, unset_as](const Config& c) {
    const SizeSetting& v = c.*field;
    if (!unset_as.empty() && v.bytes == 0 && v.percent == 0) return unset_as;
    return v.ToString();
  };
  s.override_text = [override_field](const ConfigOverrides& o) -> std::optional<std::string> {
    if (!(o.*override_field).has_value()) return std::nullopt;
    return (o.*override_field)->ToString();
  };
  return s;
}

// A free-form text with its own check.
Setting TextRow(std::string name, std::string values, std::string default_doc, std::string summary,
                std::string Config::*field,
                std::optional<std::string> ConfigOverrides::*override_field,
                std::function<absl::Status(absl::string_view)> check) {
  Setting s;
  s.name = name;
  s.values = std::move(values);
  s.default_doc = std::move(default_doc);
  s.summary = std::move(summary);
  s.default_value = [](const EnvLookup&) -> std::optional<Setting::Default> {
    return std::nullopt;
  };
  s.parse = [field, check](absl::string_view t, Config& c) -> absl::Status {
    if (auto st = check(t); !st.ok()) return st;
    c.*field = std::string(t);
    return absl::OkStatus();
  };
  s.format = [field](const Config& c) { return c.*field; };
  if (override_field != nullptr) {
    s.override_text = [override_field](const ConfigOverrides& o) { return o.*override_field; };
  }
  return s;
}

// A trace path may hold %p (the process id), %r (the local rank) and %% (a percent sign).
absl::Status CheckTracePath(absl::string_view t) {
  if (!t.empty() && t.back() == '/') {
    return Bad("TIERMEM_TRACE", t, "names a directory: give a file path");
  }
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '%') continue;
    if (i + 1 < t.size() && (t[i + 1] == 'p' || t[i + 1] == 'r' || t[i + 1] == '%')) {
      ++i;
      continue;
    }
    return Bad("TIERMEM_TRACE", t, "only %p (process id), %r (local rank) and %% may follow a %");
  }
  return absl::OkStatus();
}

// The device and its memory budgets.
void DeviceRows(std::vector<Setting>& rows) {
  rows.push_back(ChoiceRow("TIERMEM_DEVICE", "auto", "Backend of the HBM tier.", &Config::device,
                           &ConfigOverrides::device, kDeviceChoices));
  {
    Setting s;
    s.name = "TIERMEM_CUDA_DEVICE";
    s.values = "`auto`, device index 0-1024";
    s.default_doc = "`auto`";
    s.summary = "Which CUDA device to use.";
    s.default_value = [](const EnvLookup&) { return Fixed("auto"); };
    s.parse = [](absl::string_view t, Config& c) -> absl::Status {
      if (absl::AsciiStrToLower(absl::StripAsciiWhitespace(t)) == "auto") {
        c.cuda_device = -1;
        return absl::OkStatus();
      }
      auto v = ParseUnsigned("TIERMEM_CUDA_DEVICE", t);
      if (!v.ok() || *v > 1024) {
        return Bad("TIERMEM_CUDA_DEVICE", t, "expected auto or a device index from 0 to 1024");
      }
      c.cuda_device = static_cast<int>(*v);
      return absl::OkStatus();
    };
    // The runtime replaces "auto" with the device it chose.
    s.format = [](const Config& c) -> std::string {
      return c.cuda_device < 0 ? "auto" : absl::StrCat(c.cuda_device);
    };
    s.override_text = [](const ConfigOverrides& o) -> std::optional<std::string> {
      if (!o.cuda_device.has_value()) return std::nullopt;
      return *o.cuda_device < 0 ? "auto" : absl::StrCat(*o.cuda_device);
    };
    rows.push_back(std::move(s));
  }
  rows.push_back(SizeRow("TIERMEM_HBM_BYTES", "size or %", "",
                         "1 GiB (emulated, at most 1/4 of RAM); CUDA: half the device, at most "
                         "what is free less a headroom",
                         "Budget of the HBM tier:", false, &Config::hbm_bytes,
                         &ConfigOverrides::hbm_bytes, "auto"));
  rows.push_back(ChoiceRow("TIERMEM_HBM_LAYOUT", "slab",
                           "How the HBM tier lays out copies when no framework allocator is given:",
                           &Config::hbm_layout, &ConfigOverrides::hbm_layout, kLayoutChoices));
  rows.push_back(SizeRow("TIERMEM_DRAM_BYTES", "size or %", "2GiB", "`2GiB`",
                         "Budget of the pinned DRAM tier:", false, &Config::dram_bytes,
                         &ConfigOverrides::dram_bytes));
}

// The NVMe tier and the I/O engine.
void NvmeRows(std::vector<Setting>& rows) {
  {
    Setting s;
    s.name = "TIERMEM_NVME_PATHS";
    s.values = "absolute directories separated by `:`";
    s.default_doc = "`$TMPDIR`, else `/var/tmp`";
    s.summary = "Where swap files go:";
    s.default_value = [](const EnvLookup& env) -> std::optional<Setting::Default> {
      auto tmp = env("TMPDIR");
      return Fixed(tmp.has_value() && !tmp->empty() ? *tmp : "/var/tmp");
    };
    s.parse = [](absl::string_view t, Config& c) -> absl::Status {
      if (t.empty()) return Bad("TIERMEM_NVME_PATHS", t, "no directory given");
      for (absl::string_view p : absl::StrSplit(t, ':')) {
        if (p.empty()) return Bad("TIERMEM_NVME_PATHS", t, "empty directory in the list");
        if (p[0] != '/') {
          return Bad("TIERMEM_NVME_PATHS", t, absl::StrCat("\"", p, "\" is not absolute"));
        }
      }
      c.nvme_paths = absl::StrSplit(t, ':');
      return absl::OkStatus();
    };
    s.format = [](const Config& c) { return absl::StrJoin(c.nvme_paths, ":"); };
    s.override_text = [](const ConfigOverrides& o) { return o.nvme_paths; };
    rows.push_back(std::move(s));
  }
  rows.push_back(SizeRow("TIERMEM_NVME_BYTES", "size or %", "4GiB", "`4GiB`",
                         "Budget of the NVMe tier over all paths, split evenly.", false,
                         &Config::nvme_bytes, &ConfigOverrides::nvme_bytes));
  rows.push_back(ChoiceRow("TIERMEM_IO_ENGINE", "auto", "Engine for DRAM <-> NVMe.",
                           &Config::io_engine, &ConfigOverrides::io_engine, kEngineChoices));
}

// I/O shape and NUMA placement.
void IoRows(std::vector<Setting>& rows) {
  {
    Setting s;
    s.name = "TIERMEM_IO_BLOCK_SIZE";
    s.values = "power of two, 4KiB-64MiB";
    s.default_doc = "`1MiB`";
    s.summary = "Size of each I/O request, and the stripe unit over NVMe paths.";
    s.default_value = [](const EnvLookup&) { return Fixed("1MiB"); };
    s.parse = [](absl::string_view t, Config& c) -> absl::Status {
      auto v = ParseSize("TIERMEM_IO_BLOCK_SIZE", t);
      if (!v.ok()) return v.status();
      const uint64_t b = v->bytes;
      if (v->percent > 0 || b < 4 * kKiB || b > (64u << 20) || (b & (b - 1)) != 0) {
        return Bad("TIERMEM_IO_BLOCK_SIZE", t, "must be a power of two from 4KiB to 64MiB");
      }
      c.io_block_size = static_cast<uint32_t>(b);
      return absl::OkStatus();
    };
    s.format = [](const Config& c) { return SizeSetting{c.io_block_size, 0}.ToString(); };
    s.override_text = [](const ConfigOverrides& o) -> std::optional<std::string> {
      if (!o.io_block_size.has_value()) return std::nullopt;
      return SizeSetting{*o.io_block_size, 0}.ToString();
    };
    rows.push_back(std::move(s));
  }
  rows.push_back(RangeRow<uint32_t>("TIERMEM_IO_QUEUE_DEPTH", "", 1, 4096, 32,
                                    "I/O requests in flight per I/O thread",
                                    &Config::io_queue_depth, &ConfigOverrides::io_queue_depth));
  rows.push_back(RangeRow<uint32_t>("TIERMEM_IO_THREADS", "", 1, 64, 1,
                                    "I/O threads, each with its own io_uring ring",
                                    &Config::io_threads, &ConfigOverrides::io_threads));
  {
    Setting s;
    s.name = "TIERMEM_NUMA";
    s.values = "`auto`, `off`, node number";
    s.default_doc = "`auto`";
    s.summary = "NUMA node of the DRAM tier.";
    s.default_value = [](const EnvLookup&) { return Fixed("auto"); };
    s.parse = [](absl::string_view t, Config& c) -> absl::Status {
      std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t));
      uint64_t node = 0;
      if (lower == "auto") {
        c.numa = NumaMode::kAuto;
        c.numa_node = -1;
      } else if (lower == "off") {
        c.numa = NumaMode::kOff;
        c.numa_node = -1;
      } else if (absl::SimpleAtoi(lower, &node) && lower[0] != '-' && lower[0] != '+' &&
                 node <= 4096) {
        c.numa = NumaMode::kNode;
        c.numa_node = static_cast<int>(node);
      } else {
        return Bad("TIERMEM_NUMA", t, "expected auto, off or a NUMA node number");
      }
      return absl::OkStatus();
    };
    auto text = [](NumaMode mode, int node) -> std::string {
      if (mode == NumaMode::kAuto) return "auto";
      if (mode == NumaMode::kOff) return "off";
      return absl::StrCat(node);
    };
    s.format = [text](const Config& c) { return text(c.numa, c.numa_node); };
    s.override_text = [text](const ConfigOverrides& o) -> std::optional<std::string> {
      if (!o.numa.has_value()) return std::nullopt;
      return text(o.numa->first, o.numa->second);
    };
    rows.push_back(std::move(s));
  }
}

// Logging, prefetching, placement, the trace and checksums.
void PolicyRows(std::vector<Setting>& rows) {
  rows.push_back(ChoiceRow("TIERMEM_LOG_LEVEL", "warn", "Lines on stderr,", &Config::log_level,
                           &ConfigOverrides::log_level, kLogChoices));
  rows.push_back(RangeRow<uint32_t>("TIERMEM_PREFETCH_DEPTH", "", 0, 1024, 4,
                                    "Scheduled acquires kept moving up ahead of the current one",
                                    &Config::prefetch_depth, &ConfigOverrides::prefetch_depth));
  rows.push_back(SizeRow("TIERMEM_PREFETCH_BYTES", "size or % of the HBM budget", "0",
                         "`0`: half the HBM budget",
                         "Bound on the bytes of scheduled prefetches in flight.", true,
                         &Config::prefetch_bytes, &ConfigOverrides::prefetch_bytes));
  rows.push_back(ChoiceRow("TIERMEM_PLACEMENT", "none",
                           "Home tier of a tensor by class, where a tensor is written first and "
                           "stays at rest:",
                           &Config::placement, &ConfigOverrides::placement, kPlacementChoices));
  rows.push_back(TextRow("TIERMEM_TRACE", "file path, `%p` and `%r` expanded", "unset",
                         "Writes a Chrome-trace JSON timeline there when the runtime is destroyed:",
                         &Config::trace, &ConfigOverrides::trace, CheckTracePath));
  rows.push_back(ChoiceRow("TIERMEM_CHECKSUM", "off", "Integrity of the NVMe tier.",
                           &Config::checksum, &ConfigOverrides::checksum, kChecksumChoices));
  // No tm_config field (environment, or ConfigOverrides in code): a switch for measuring.
  rows.push_back(
      ChoiceRow("TIERMEM_DRAM_INCLUSIVE", "on",
                "Whether an offload to NVMe keeps a clean DRAM copy while DRAM has room.",
                &Config::dram_inclusive, &ConfigOverrides::dram_inclusive, kOnOff));
  rows.push_back(
      ChoiceRow("TIERMEM_HBM_HAND_ON", "on",
                "Whether a copy down from HBM to DRAM hands its HBM memory on as it runs.",
                &Config::hbm_hand_on, &ConfigOverrides::hbm_hand_on, kOnOff));
}

// Ranks on a node.
void RankRows(std::vector<Setting>& rows) {
  {
    Setting s;
    s.name = "TIERMEM_LOCAL_RANK";
    s.values = "0-65535";
    s.default_doc =
        "the launcher's `LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK` or `SLURM_LOCALID`, else `0`";
    s.summary = "This process's rank among those on its node:";
    s.default_value = [](const EnvLookup& env) -> std::optional<Setting::Default> {
      if (auto l = DetectLauncherRanks(env); l.has_value()) {
        return Setting::Default{absl::StrCat(l->rank),
                                absl::StrCat("environment ", l->rank_variable)};
      }
      return Fixed("0");
    };
    s.parse = [](absl::string_view t, Config& c) -> absl::Status {
      auto v = ParseUnsigned("TIERMEM_LOCAL_RANK", t);
      if (!v.ok()) return v.status();
      if (*v > 65535) return Bad("TIERMEM_LOCAL_RANK", t, "must be 0 to 65535");
      c.local_rank = static_cast<int>(*v);
      return absl::OkStatus();
    };
    s.format = [](const Config& c) { return absl::StrCat(c.local_rank); };
    s.override_text = [](const ConfigOverrides& o) -> std::optional<std::string> {
      if (!o.local_rank.has_value()) return std::nullopt;
      return absl::StrCat(*o.local_rank);
    };
    rows.push_back(std::move(s));
  }
  {
    Setting s;
    s.name = "TIERMEM_LOCAL_WORLD_SIZE";
    s.values = "1-65536";
    s.default_doc =
        "the launcher's (`LOCAL_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_SIZE`, Slurm's tasks per "
        "node), else `1`";
    s.summary = "Processes on this node that share its percentage budgets.";
    s.default_value = [](const EnvLookup& env) -> std::optional<Setting::Default> {
      // From the launcher that gave the rank, never from another one.
      if (auto l = DetectLauncherRanks(env); l.has_value() && l->world.has_value()) {
        return Setting::Default{absl::StrCat(*l->world),
                                absl::StrCat("environment ", l->world_variable)};
      }
      return Fixed("1");
    };
    s.parse = [](absl::string_view t, Config& c) -> absl::Status {
      auto v = ParseUnsigned("TIERMEM_LOCAL_WORLD_SIZE", t);
      if (!v.ok()) return v.status();
      if (*v < 1 || *v > 65536) return Bad("TIERMEM_LOCAL_WORLD_SIZE", t, "must be 1 to 65536");
      c.local_world_size = static_cast<int>(*v);
      return absl::OkStatus();
    };
    s.format = [](const Config& c) { return absl::StrCat(c.local_world_size); };
    s.override_text = [](const ConfigOverrides& o) -> std::optional<std::string> {
      if (!o.local_world_size.has_value()) return std::nullopt;
      return absl::StrCat(*o.local_world_size);
    };
    rows.push_back(std::move(s));
  }
}

// What only the process environment sets, and the emulated link.
void ProcessRows(std::vector<Setting>& rows) {
  {
    Setting s =
        TextRow("TIERMEM_ENV_FILE", "file path", "unset",
                "A file of settings read when a runtime is created, below the "
                "environment:",
                &Config::env_file, nullptr, [](absl::string_view) { return absl::OkStatus(); });
    s.environment_only = true;
    rows.push_back(std::move(s));
  }
  {
    // Read by the Python package, not by the library: a row so that it is documented with the
    // others and not warned about as unknown.
    Setting s =
        TextRow("TIERMEM_LIBRARY", "file path", "unset",
                "For the Python package (docs/pytorch.md): the libtiermem.so to load,",
                &Config::library, nullptr, [](absl::string_view) { return absl::OkStatus(); });
    s.environment_only = true;
    rows.push_back(std::move(s));
  }
  {
    Setting s;
    s.name = "TIERMEM_EMU_LINK_GBPS";
    s.values = "GB/s, 0 or 1e-6-1e6";
    s.default_doc = "`0` (no cap)";
    s.summary = "For the emulated device: caps each direction of the emulated link,";
    s.default_value = [](const EnvLookup&) { return Fixed("0"); };
    s.parse = [](absl::string_view t, Config& c) -> absl::Status {
      double v = 0;
      if (!ParseDecimal(t, &v) || !std::isfinite(v) || v < 0 || v > 1e6) {
        return Bad("TIERMEM_EMU_LINK_GBPS", t, "expected GB/s from 0 (no cap) to 1e6");
      }
      if (v > 0 && v < 1e-6) {  // a copy's time at such a rate overflows the clock: no cap
        return Bad("TIERMEM_EMU_LINK_GBPS", t, "below the least rate, 1e-6 GB/s; 0 is no cap");
      }
      c.emu_link_gbps = v;
      return absl::OkStatus();
    };
    s.format = [](const Config& c) { return absl::StrCat(c.emu_link_gbps); };
    s.override_text = [](const ConfigOverrides& o) -> std::optional<std::string> {
      if (!o.emu_link_gbps.has_value()) return std::nullopt;
      return absl::StrCat(*o.emu_link_gbps);
    };
    rows.push_back(std::move(s));
  }
}

std::vector<Setting> BuildSettings() {
  std::vector<Setting> rows;
  for (auto part : {DeviceRows, NvmeRows, IoRows, PolicyRows, BandwidthRows, RankRows, ProcessRows})
    part(rows);
  return rows;
}

}  // namespace

const std::vector<Setting>& Settings() {
  static const std::vector<Setting>* rows = new std::vector<Setting>(BuildSettings());
  return *rows;
}

const std::vector<absl::string_view>& KnownVariables() {
  static const std::vector<absl::string_view>* names = [] {
    auto* v = new std::vector<absl::string_view>();
    for (const Setting& s : Settings()) v->push_back(s.name);
    return v;
  }();
  return *names;
}

}  // namespace tiermem
