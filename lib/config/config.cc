// Parses and validates every TIERMEM_* variable in one place (see docs/environment.md): sizes,
// names, the process environment, and LoadConfig over the settings table (settings.cc).
#include "lib/config/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
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
#include "lib/config/config_internal.h"
#include "lib/config/local_ranks.h"

extern char** environ;

namespace tiermem {

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
    // Whole percents, as documented (no decimal point, no exponent): give a finer budget as a
    // size.
    t = absl::StripAsciiWhitespace(t);
    uint64_t p = 0;
    const bool digits = !t.empty() && std::all_of(t.begin(), t.end(), [](char ch) {
      return absl::ascii_isdigit(static_cast<unsigned char>(ch));
    });
    if (!digits || !absl::SimpleAtoi(t, &p) || p == 0 || p > 100) {
      return Bad(what, text,
                 "a percentage must be a whole number from 1 to 100 (no decimal point; give a "
                 "finer budget as a size)");
    }
    s.percent = static_cast<double>(p);
    return s;
  }
  size_t digits = 0;
  while (digits < t.size() && absl::ascii_isdigit(static_cast<unsigned char>(t[digits]))) ++digits;
  if (digits == 0) {
    return Bad(what, text, "expected a size such as 4096, 512KiB, 64MiB, 2GiB or 50%");
  }
  if (digits < t.size() && (t[digits] == '.' || t[digits] == ',')) {
    return Bad(what, text,
               "a size is a whole number of bytes or of a unit (no decimal point: 1536MiB, not "
               "1.5GiB)");
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

std::string ConfigField(absl::string_view name) {
  if (name == "TIERMEM_NUMA") return "numa_node";
  absl::ConsumePrefix(&name, "TIERMEM_");
  return absl::AsciiStrToLower(name);
}

std::string Config::SettingName(absl::string_view name) const {
  for (const auto& e : entries) {
    if (e.name == name && e.source == "config")
      return absl::StrCat("tm_config.", ConfigField(name));
  }
  return std::string(name);
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
        // A value from tm_config is named as its field: the caller may never have set the
        // variable the parser names.
        absl::string_view message = st.message();
        if (source == "config" && absl::ConsumePrefix(&message, s.name)) {
          return absl::InvalidArgumentError(
              absl::StrCat("tm_config.", ConfigField(s.name), message));
        }
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
