// Parses and validates every TIERMEM_* variable in one place (see docs/environment.md).
#include "lib/config.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>

#include "absl/strings/string_view.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace tiermem {
namespace {

constexpr uint64_t kKiB = 1024;

absl::Status Bad(absl::string_view what, absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrFormat("%s=\"%s\" is invalid: %s", what, text, why));
}

template <typename T>
struct Choice {
  absl::string_view name;
  T value;
};

template <typename T, size_t N>
absl::StatusOr<T> ParseChoice(absl::string_view what, absl::string_view text,
                              const Choice<T> (&choices)[N]) {
  std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  std::string names;
  for (const auto& c : choices) {
    if (lower == c.name) return c.value;
    absl::StrAppend(&names, names.empty() ? "" : "|", c.name);
  }
  return Bad(what, text, absl::StrCat("expected one of ", names));
}

constexpr Choice<DeviceKind> kDeviceChoices[] = {
    {"auto", DeviceKind::kAuto}, {"cuda", DeviceKind::kCuda}, {"emulated", DeviceKind::kEmulated}};
constexpr Choice<IoEngineKind> kEngineChoices[] = {{"auto", IoEngineKind::kAuto},
                                                   {"uring", IoEngineKind::kUring},
                                                   {"posix", IoEngineKind::kPosix}};
constexpr Choice<Placement> kPlacementChoices[] = {{"none", Placement::kNone},
                                                   {"zero-offload", Placement::kZeroOffload},
                                                   {"zero-infinity", Placement::kZeroInfinity},
                                                   {"activations", Placement::kActivations}};
constexpr Choice<ChecksumKind> kChecksumChoices[] = {{"off", ChecksumKind::kOff},
                                                     {"xxh3", ChecksumKind::kXxh3}};
constexpr Choice<LogLevel> kLogChoices[] = {{"error", LogLevel::kError},
                                            {"warn", LogLevel::kWarn},
                                            {"info", LogLevel::kInfo},
                                            {"debug", LogLevel::kDebug}};

std::string DefaultNvmePath() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/var/tmp";
}

// Resolves one setting: override, then environment, then default; records its source.
class Resolver {
 public:
  Resolver(const EnvLookup& env, const EnvFile& file, Config& config)
      : env_(env), file_(file), config_(config) {}

  // parse(text) -> StatusOr<T>; format(T) -> string.
  template <typename T, typename Parse, typename Format>
  absl::Status Resolve(const char* name, const std::optional<T>& override_value, T& out,
                       Parse parse, Format format) {
    std::string source = "default";
    if (override_value.has_value()) {
      // Overrides are re-validated through the same parser, from their text form.
      auto parsed = parse(format(*override_value));
      if (!parsed.ok()) return parsed.status();
      out = *parsed;
      source = "config";
    } else if (auto text = env_(name); text.has_value()) {
      auto parsed = parse(*text);
      if (!parsed.ok()) return parsed.status();
      out = *parsed;
      source = "environment";
    } else if (auto it = file_.values.find(name); it != file_.values.end()) {
      auto parsed = parse(it->second.value);
      if (!parsed.ok()) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s:%d: %s", file_.path, it->second.line, parsed.status().message()));
      }
      out = *parsed;
      source = absl::StrCat("file ", file_.path);
    }
    config_.entries.push_back({name, format(out), source});
    return absl::OkStatus();
  }

 private:
  const EnvLookup& env_;
  const EnvFile& file_;
  Config& config_;
};

}  // namespace

absl::StatusOr<EnvFile> ParseEnvFile(const std::string& path) {
  constexpr uint64_t kMaxBytes = 1u << 20;
  auto bad = [&](absl::string_view why) {
    return Bad("TIERMEM_ENV_FILE", path, why);
  };
  if (path.empty()) return bad("no file given");
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    char msg[128];
    return bad(absl::StrCat("cannot open it: ", strerror_r(errno, msg, sizeof msg)));
  }
  std::string text;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() <= kMaxBytes) {
    text.append(buf, n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return bad("cannot read it");
  if (text.size() > kMaxBytes) return bad("larger than 1 MiB: not an env file");
  EnvFile out;
  out.path = path;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto line_error = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrFormat("TIERMEM_ENV_FILE: %s:%d: %s", path, line_no, why));
    };
    if (absl::ConsumePrefix(&line, "export")) {
      if (line.empty() || !absl::ascii_isspace(static_cast<unsigned char>(line[0]))) {
        return line_error("expected [export ]TIERMEM_NAME=VALUE");
      }
      line = absl::StripLeadingAsciiWhitespace(line);
    }
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) return line_error("expected [export ]TIERMEM_NAME=VALUE");
    absl::string_view name = line.substr(0, eq);
    absl::string_view value = line.substr(eq + 1);
    bool name_ok = absl::StartsWith(name, "TIERMEM_") && name.size() > 8;
    for (char ch : name) name_ok = name_ok && (absl::ascii_isupper(ch) || absl::ascii_isdigit(ch) || ch == '_');
    if (!name_ok) {
      return line_error(absl::StrCat("\"", name, "\" is not a TIERMEM_ variable name"));
    }
    if (name == "TIERMEM_ENV_FILE") return line_error("an env file cannot name another one");
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    if (value.find_first_of("$`\\\"'") != absl::string_view::npos) {
      return line_error("quotes, escapes and shell expansion are not supported in values");
    }
    auto [it, inserted] = out.values.try_emplace(std::string(name), EnvFile::Value{std::string(value), line_no});
    if (!inserted) {
      return line_error(absl::StrFormat("%s is set twice (first on line %d)", name, it->second.line));
    }
  }
  return out;
}

uint64_t SizeSetting::Resolve(uint64_t physical) const {
  if (percent > 0) return static_cast<uint64_t>(static_cast<double>(physical) * percent / 100.0);
  return bytes;
}

std::string SizeSetting::ToString() const {
  if (percent > 0) return absl::StrCat(percent, "%");
  if (bytes == 0) return "0";
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  uint64_t v = bytes;
  int unit = 0;
  while (unit < 4 && v % kKiB == 0) {
    v /= kKiB;
    ++unit;
  }
  return absl::StrCat(v, unit == 0 ? "" : kUnits[unit]);
}

absl::StatusOr<uint64_t> ParseUnsigned(absl::string_view what, absl::string_view text) {
  uint64_t v = 0;
  absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t.empty() || t[0] == '-' || t[0] == '+' || !absl::SimpleAtoi(t, &v)) {
    return Bad(what, text, "expected a non-negative integer");
  }
  return v;
}

absl::StatusOr<SizeSetting> ParseSize(absl::string_view what, absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  SizeSetting s;
  if (absl::ConsumeSuffix(&t, "%")) {
    double p = 0;
    if (!absl::SimpleAtod(absl::StripAsciiWhitespace(t), &p) || !std::isfinite(p) || p <= 0 ||
        p > 100) {
      return Bad(what, text, "a percentage must be in (0, 100]");
    }
    s.percent = p;
    return s;
  }
  size_t digits = 0;
  while (digits < t.size() && absl::ascii_isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  if (digits == 0) {
    return Bad(what, text, "expected a size such as 4096, 512KiB, 64MiB, 2GiB or 50%");
  }
  uint64_t n = 0;
  if (!absl::SimpleAtoi(t.substr(0, digits), &n)) return Bad(what, text, "number too large");
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t.substr(digits)));
  int shift = -1;
  if (unit.empty() || unit == "b") shift = 0;
  if (unit == "k" || unit == "kib") shift = 10;
  if (unit == "m" || unit == "mib") shift = 20;
  if (unit == "g" || unit == "gib") shift = 30;
  if (unit == "t" || unit == "tib") shift = 40;
  if (shift < 0) {
    return Bad(what, text,
               "unknown unit (use B, KiB, MiB, GiB, TiB or K, M, G, T; all binary; or N%)");
  }
  if (shift > 0 && n > (UINT64_MAX >> shift)) return Bad(what, text, "size overflows 64 bits");
  s.bytes = n << shift;
  return s;
}

absl::string_view DeviceKindName(DeviceKind k) {
  for (const auto& c : kDeviceChoices) {
    if (c.value == k) return c.name;
  }
  return "?";
}
absl::string_view IoEngineKindName(IoEngineKind k) {
  for (const auto& c : kEngineChoices) {
    if (c.value == k) return c.name;
  }
  return "?";
}
absl::string_view PlacementName(Placement p) {
  for (const auto& c : kPlacementChoices) {
    if (c.value == p) return c.name;
  }
  return "?";
}

absl::string_view ChecksumKindName(ChecksumKind k) {
  for (const auto& c : kChecksumChoices) {
    if (c.value == k) return c.name;
  }
  return "?";
}

absl::string_view LogLevelName(LogLevel l) {
  for (const auto& c : kLogChoices) {
    if (c.value == l) return c.name;
  }
  return "?";
}

const std::vector<absl::string_view>& KnownVariables() {
  static const std::vector<absl::string_view> kNames = {
      "TIERMEM_DEVICE",        "TIERMEM_CUDA_DEVICE",  "TIERMEM_HBM_BYTES",
      "TIERMEM_DRAM_BYTES",    "TIERMEM_NVME_PATHS",   "TIERMEM_NVME_BYTES",
      "TIERMEM_IO_ENGINE",     "TIERMEM_IO_BLOCK_SIZE", "TIERMEM_IO_QUEUE_DEPTH",
      "TIERMEM_IO_THREADS",
      "TIERMEM_NUMA",          "TIERMEM_LOG_LEVEL",    "TIERMEM_EMU_LINK_GBPS",
      "TIERMEM_PREFETCH_DEPTH", "TIERMEM_PREFETCH_BYTES", "TIERMEM_PLACEMENT",
      "TIERMEM_TRACE",         "TIERMEM_CHECKSUM",     "TIERMEM_ENV_FILE"};
  return kNames;
}

std::optional<std::string> Config::Value(absl::string_view name) const {
  for (const auto& e : entries) {
    if (e.name == name) return e.value;
  }
  return std::nullopt;
}

EnvLookup ProcessEnvironment() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::vector<std::string> ProcessTiermemVariables() {
  std::vector<std::string> names;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    absl::string_view kv(*e);
    if (!absl::StartsWith(kv, "TIERMEM_")) continue;
    names.emplace_back(kv.substr(0, kv.find('=')));
  }
  return names;
}

absl::StatusOr<Config> LoadConfig(const ConfigOverrides& o, const EnvLookup& env,
                                  const std::vector<std::string>& env_names) {
  Config c;
  // TIERMEM_ENV_FILE (a file of export lines, as tiermem-probe --tune writes) sits between the
  // environment and the defaults: a variable set in the environment still wins.
  EnvFile file;
  {
    std::optional<std::string> path = env("TIERMEM_ENV_FILE");
    if (path.has_value()) {
      auto parsed = ParseEnvFile(*path);
      if (!parsed.ok()) return parsed.status();
      file = std::move(*parsed);
    }
    c.entries.push_back({"TIERMEM_ENV_FILE", path.value_or(""),
                         path.has_value() ? "environment" : "default"});
  }
  Resolver r(env, file, c);
  auto ident = [](const std::string& s) { return s; };

  auto status = r.Resolve<DeviceKind>(
      "TIERMEM_DEVICE", o.device, c.device,
      [](absl::string_view t) { return ParseChoice("TIERMEM_DEVICE", t, kDeviceChoices); },
      [](DeviceKind k) { return std::string(DeviceKindName(k)); });
  if (!status.ok()) return status;

  status = r.Resolve<int>(
      "TIERMEM_CUDA_DEVICE", o.cuda_device, c.cuda_device,
      [](absl::string_view t) -> absl::StatusOr<int> {
        auto v = ParseUnsigned("TIERMEM_CUDA_DEVICE", t);
        if (!v.ok()) return v.status();
        if (*v > 1024) return Bad("TIERMEM_CUDA_DEVICE", t, "device index out of range");
        return static_cast<int>(*v);
      },
      [](int v) { return absl::StrCat(v); });
  if (!status.ok()) return status;

  auto size_parser = [](const char* name, bool allow_zero) {
    return [name, allow_zero](absl::string_view t) -> absl::StatusOr<SizeSetting> {
      auto s = ParseSize(name, t);
      if (s.ok() && !allow_zero && s->percent == 0 && s->bytes == 0) {
        return Bad(name, t, "must be greater than zero");
      }
      return s;
    };
  };
  auto size_format = [](const SizeSetting& s) { return s.ToString(); };
  c.dram_bytes.bytes = 2ull << 30;
  c.nvme_bytes.bytes = 4ull << 30;
  // hbm_bytes stays zero by default: the device backend picks (1 GiB emulated, 50% of a GPU).
  for (auto [name, ov, out] :
       {std::tuple{"TIERMEM_HBM_BYTES", &o.hbm_bytes, &c.hbm_bytes},
        std::tuple{"TIERMEM_DRAM_BYTES", &o.dram_bytes, &c.dram_bytes},
        std::tuple{"TIERMEM_NVME_BYTES", &o.nvme_bytes, &c.nvme_bytes}}) {
    status = r.Resolve<SizeSetting>(name, *ov, *out, size_parser(name, false), size_format);
    if (!status.ok()) return status;
  }
  // The HBM default is shown as "auto" until the backend resolves it.
  if (c.hbm_bytes.bytes == 0 && c.hbm_bytes.percent == 0) {
    for (auto& e : c.entries) {
      if (e.name == "TIERMEM_HBM_BYTES") e.value = "auto";
    }
  }

  std::string paths = DefaultNvmePath();
  status = r.Resolve<std::string>(
      "TIERMEM_NVME_PATHS", o.nvme_paths, paths,
      [](absl::string_view t) -> absl::StatusOr<std::string> {
        if (t.empty()) return Bad("TIERMEM_NVME_PATHS", t, "no directory given");
        for (absl::string_view p : absl::StrSplit(t, ':')) {
          if (p.empty()) return Bad("TIERMEM_NVME_PATHS", t, "empty directory in the list");
          if (p[0] != '/') {
            return Bad("TIERMEM_NVME_PATHS", t, absl::StrCat("\"", p, "\" is not absolute"));
          }
        }
        return std::string(t);
      },
      ident);
  if (!status.ok()) return status;
  c.nvme_paths = absl::StrSplit(paths, ':');

  status = r.Resolve<IoEngineKind>(
      "TIERMEM_IO_ENGINE", o.io_engine, c.io_engine,
      [](absl::string_view t) { return ParseChoice("TIERMEM_IO_ENGINE", t, kEngineChoices); },
      [](IoEngineKind k) { return std::string(IoEngineKindName(k)); });
  if (!status.ok()) return status;

  status = r.Resolve<uint32_t>(
      "TIERMEM_IO_BLOCK_SIZE", o.io_block_size, c.io_block_size,
      [](absl::string_view t) -> absl::StatusOr<uint32_t> {
        auto s = ParseSize("TIERMEM_IO_BLOCK_SIZE", t);
        if (!s.ok()) return s.status();
        uint64_t b = s->bytes;
        if (s->percent > 0 || b < 4 * kKiB || b > (64u << 20) || (b & (b - 1)) != 0) {
          return Bad("TIERMEM_IO_BLOCK_SIZE", t, "must be a power of two from 4KiB to 64MiB");
        }
        return static_cast<uint32_t>(b);
      },
      [](uint32_t v) { return SizeSetting{v, 0}.ToString(); });
  if (!status.ok()) return status;

  status = r.Resolve<uint32_t>(
      "TIERMEM_IO_QUEUE_DEPTH", o.io_queue_depth, c.io_queue_depth,
      [](absl::string_view t) -> absl::StatusOr<uint32_t> {
        auto v = ParseUnsigned("TIERMEM_IO_QUEUE_DEPTH", t);
        if (!v.ok()) return v.status();
        if (*v < 1 || *v > 4096) return Bad("TIERMEM_IO_QUEUE_DEPTH", t, "must be 1 to 4096");
        return static_cast<uint32_t>(*v);
      },
      [](uint32_t v) { return absl::StrCat(v); });
  if (!status.ok()) return status;

  status = r.Resolve<uint32_t>(
      "TIERMEM_IO_THREADS", o.io_threads, c.io_threads,
      [](absl::string_view t) -> absl::StatusOr<uint32_t> {
        auto v = ParseUnsigned("TIERMEM_IO_THREADS", t);
        if (!v.ok()) return v.status();
        if (*v < 1 || *v > 64) return Bad("TIERMEM_IO_THREADS", t, "must be 1 to 64");
        return static_cast<uint32_t>(*v);
      },
      [](uint32_t v) { return absl::StrCat(v); });
  if (!status.ok()) return status;

  std::pair<NumaMode, int> numa{NumaMode::kAuto, -1};
  status = r.Resolve<std::pair<NumaMode, int>>(
      "TIERMEM_NUMA", o.numa, numa,
      [](absl::string_view t) -> absl::StatusOr<std::pair<NumaMode, int>> {
        std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t));
        if (lower == "auto") return std::pair{NumaMode::kAuto, -1};
        if (lower == "off") return std::pair{NumaMode::kOff, -1};
        uint64_t node = 0;
        if (!absl::SimpleAtoi(lower, &node) || lower[0] == '-' || lower[0] == '+' ||
            node > 4096) {
          return Bad("TIERMEM_NUMA", t, "expected auto, off or a NUMA node number");
        }
        return std::pair{NumaMode::kNode, static_cast<int>(node)};
      },
      [](const std::pair<NumaMode, int>& v) -> std::string {
        if (v.first == NumaMode::kAuto) return "auto";
        if (v.first == NumaMode::kOff) return "off";
        return absl::StrCat(v.second);
      });
  if (!status.ok()) return status;
  c.numa = numa.first;
  c.numa_node = numa.second;

  status = r.Resolve<LogLevel>(
      "TIERMEM_LOG_LEVEL", o.log_level, c.log_level,
      [](absl::string_view t) { return ParseChoice("TIERMEM_LOG_LEVEL", t, kLogChoices); },
      [](LogLevel l) { return std::string(LogLevelName(l)); });
  if (!status.ok()) return status;

  status = r.Resolve<double>(
      "TIERMEM_EMU_LINK_GBPS", o.emu_link_gbps, c.emu_link_gbps,
      [](absl::string_view t) -> absl::StatusOr<double> {
        double v = 0;
        if (!absl::SimpleAtod(absl::StripAsciiWhitespace(t), &v) || !std::isfinite(v) || v < 0 ||
            v > 1e6) {
          return Bad("TIERMEM_EMU_LINK_GBPS", t, "expected GB/s from 0 (no cap) to 1e6");
        }
        return v;
      },
      [](double v) { return absl::StrCat(v); });
  if (!status.ok()) return status;

  status = r.Resolve<uint32_t>(
      "TIERMEM_PREFETCH_DEPTH", o.prefetch_depth, c.prefetch_depth,
      [](absl::string_view t) -> absl::StatusOr<uint32_t> {
        auto v = ParseUnsigned("TIERMEM_PREFETCH_DEPTH", t);
        if (!v.ok()) return v.status();
        if (*v > 1024) return Bad("TIERMEM_PREFETCH_DEPTH", t, "must be 0 to 1024");
        return static_cast<uint32_t>(*v);
      },
      [](uint32_t v) { return absl::StrCat(v); });
  if (!status.ok()) return status;

  status = r.Resolve<SizeSetting>("TIERMEM_PREFETCH_BYTES", o.prefetch_bytes, c.prefetch_bytes,
                                  size_parser("TIERMEM_PREFETCH_BYTES", true), size_format);
  if (!status.ok()) return status;

  status = r.Resolve<Placement>(
      "TIERMEM_PLACEMENT", o.placement, c.placement,
      [](absl::string_view t) { return ParseChoice("TIERMEM_PLACEMENT", t, kPlacementChoices); },
      [](Placement p) { return std::string(PlacementName(p)); });
  if (!status.ok()) return status;

  status = r.Resolve<std::string>(
      "TIERMEM_TRACE", o.trace, c.trace,
      [](absl::string_view t) -> absl::StatusOr<std::string> {
        if (!t.empty() && t.back() == '/') {
          return Bad("TIERMEM_TRACE", t, "names a directory: give a file path");
        }
        return std::string(t);
      },
      ident);
  if (!status.ok()) return status;

  status = r.Resolve<ChecksumKind>(
      "TIERMEM_CHECKSUM", o.checksum, c.checksum,
      [](absl::string_view t) { return ParseChoice("TIERMEM_CHECKSUM", t, kChecksumChoices); },
      [](ChecksumKind k) { return std::string(ChecksumKindName(k)); });
  if (!status.ok()) return status;

  auto known = [](absl::string_view name) {
    for (auto k : KnownVariables()) {
      if (k == name) return true;
    }
    return false;
  };
  for (const auto& name : env_names) {
    if (!known(name)) c.unknown_variables.push_back(name);
  }
  for (const auto& [name, v] : file.values) {
    if (!known(name)) c.unknown_variables.push_back(absl::StrFormat("%s (%s:%d)", name, file.path, v.line));
  }
  return c;
}

}  // namespace tiermem
