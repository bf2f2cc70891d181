// Parses and validates every TIERMEM_* variable in one place (see docs/environment.md).
#include "lib/config/config.h"

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
#include "lib/config/local_ranks.h"

extern char** environ;

namespace tiermem {
namespace {

constexpr uint64_t kKiB = 1024;

absl::Status Bad(absl::string_view what, absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrFormat("%s=\"%s\" is invalid: %s", what, text, why));
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

}  // namespace

absl::StatusOr<EnvFile> ParseEnvFile(const std::string& path) {
  constexpr uint64_t kMaxBytes = 1u << 20;
  auto bad = [&](absl::string_view why) { return Bad("TIERMEM_ENV_FILE", path, why); };
  if (path.empty()) return bad("no file given");
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever. Only a
  // regular file is read; a FIFO, device or directory is refused before any read.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    char msg[128];
    return bad(absl::StrCat("cannot open it: ", strerror_r(errno, msg, sizeof msg)));
  }
  struct stat st = {};
  if (fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3)) {
    // The null device (/dev/null, or a link to it) means "no file", as GIT_CONFIG=/dev/null
    // does: read as empty.
    close(fd);
    EnvFile empty;
    empty.path = path;
    return empty;
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return bad("not a regular file (a FIFO, device or directory is never read)");
  }
  std::FILE* f = fdopen(fd, "r");
  if (f == nullptr) {
    close(fd);
    return bad("cannot read it");
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
    for (char ch : name)
      name_ok = name_ok && (absl::ascii_isupper(ch) || absl::ascii_isdigit(ch) || ch == '_');
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
    auto [it, inserted] =
        out.values.try_emplace(std::string(name), EnvFile::Value{std::string(value), line_no});
    if (!inserted) {
      return line_error(
          absl::StrFormat("%s is set twice (first on line %d)", name, it->second.line));
    }
  }
  return out;
}

uint64_t SizeSetting::Resolve(uint64_t physical) const {
  if (percent > 0) {
    // percent <= 100, but a double of a size near 2^64 rounds up to 2^64, which no uint64_t holds.
    const double v = static_cast<double>(physical) * percent / 100.0;
    return v >= 18446744073709551616.0 ? UINT64_MAX : static_cast<uint64_t>(v);
  }
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

std::vector<Setting> BuildSettings() {
  std::vector<Setting> rows;
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
  rows.push_back(SizeRow("TIERMEM_DRAM_BYTES", "size or %", "2GiB", "`2GiB`",
                         "Budget of the pinned DRAM tier:", false, &Config::dram_bytes,
                         &ConfigOverrides::dram_bytes));
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
    s.values = "GB/s, 0-1e6";
    s.default_doc = "`0` (no cap)";
    s.summary = "For the emulated device: caps each direction of the emulated link,";
    s.default_value = [](const EnvLookup&) { return Fixed("0"); };
    s.parse = [](absl::string_view t, Config& c) -> absl::Status {
      double v = 0;
      if (!absl::SimpleAtod(absl::StripAsciiWhitespace(t), &v) || !std::isfinite(v) || v < 0 ||
          v > 1e6) {
        return Bad("TIERMEM_EMU_LINK_GBPS", t, "expected GB/s from 0 (no cap) to 1e6");
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

absl::StatusOr<Config> LoadConfig(const ConfigOverrides& o, const EnvLookup& env,
                                  const std::vector<std::string>& env_names) {
  Config c;
  // TIERMEM_ENV_FILE (a file of export lines, as tiermem-probe --tune writes) sits between the
  // environment and the defaults: a variable set in the environment still wins.
  EnvFile file;
  if (std::optional<std::string> path = env("TIERMEM_ENV_FILE"); path.has_value()) {
    auto parsed = ParseEnvFile(*path);
    if (!parsed.ok()) return parsed.status();
    file = std::move(*parsed);
  }
  // Each setting: the tm_config field, then the environment, then the file, then the default.
  for (const Setting& s : Settings()) {
    std::optional<std::string> text;
    std::string source;
    std::string where;  // "FILE:LINE: " before a bad value from the file
    if (auto ov = s.override_text ? s.override_text(o) : std::nullopt; ov.has_value()) {
      // Overrides are re-validated through the same parser, from their text form.
      text = std::move(ov);
      source = "config";
    } else if (auto e = env(s.name.c_str()); e.has_value()) {
      text = std::move(e);
      source = "environment";
    } else if (auto it = file.values.find(s.name); !s.environment_only && it != file.values.end()) {
      text = it->second.value;
      source = absl::StrCat("file ", file.path);
      where = absl::StrFormat("%s:%d: ", file.path, it->second.line);
    } else if (auto d = s.default_value(env); d.has_value()) {
      text = std::move(d->text);
      source = std::move(d->source);
    } else {
      source = "default";
    }
    if (text.has_value()) {
      if (auto st = s.parse(*text, c); !st.ok()) {
        if (where.empty()) return st;
        return absl::InvalidArgumentError(absl::StrCat(where, st.message()));
      }
    }
    c.entries.push_back({s.name, s.format(c), source});
  }
  // Code only (function pointers have no text form): not a setting, no row in the table.
  c.device_allocator = o.device_allocator;

  if (auto st = CheckLocalRanks(env, c); !st.ok()) return st;

  auto known = [](absl::string_view name) {
    for (const Setting& s : Settings()) {
      if (s.name == name) return true;
    }
    return false;
  };
  for (const auto& name : env_names) {
    if (!known(name)) c.unknown_variables.push_back(name);
  }
  for (const auto& [name, v] : file.values) {
    if (!known(name)) {
      c.unknown_variables.push_back(absl::StrFormat("%s (%s:%d)", name, file.path, v.line));
    }
  }
  return c;
}

}  // namespace tiermem
