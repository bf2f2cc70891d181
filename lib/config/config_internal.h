// What the config folder's sources share: the error of a bad value, and choice tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "lib/config/config.h"

namespace tiermem {

inline constexpr uint64_t kKiB = 1024;

// InvalidArgument: NAME="text" is invalid: why.
inline absl::Status Bad(absl::string_view what, absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrFormat("%s=\"%s\" is invalid: %s", what, text, why));
}

// A decimal number as the docs write rates ("12.5", "1e3"): absl::SimpleAtod alone would also
// take hex ("0x10"), "inf" and "nan", which no size or rate variable accepts. False otherwise.
inline bool ParseDecimal(absl::string_view text, double* out) {
  text = absl::StripAsciiWhitespace(text);
  if (text.empty()) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && c != '.' && c != 'e' && c != 'E' &&
        c != '+' && c != '-') {
      return false;
    }
  }
  return absl::SimpleAtod(text, out);
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
constexpr Choice<bool> kOnOff[] = {{"on", true}, {"off", false}};
constexpr Choice<HbmLayout> kLayoutChoices[] = {{"slab", HbmLayout::kSlab},
                                                {"mapped", HbmLayout::kMapped}};
constexpr Choice<ChecksumKind> kChecksumChoices[] = {{"off", ChecksumKind::kOff},
                                                     {"xxh3", ChecksumKind::kXxh3}};
constexpr Choice<LogLevel> kLogChoices[] = {{"error", LogLevel::kError},
                                            {"warn", LogLevel::kWarn},
                                            {"info", LogLevel::kInfo},
                                            {"debug", LogLevel::kDebug}};

// The rows of TIERMEM_LINK_GBPS and TIERMEM_NVME_GBPS (settings_bandwidth.cc).
void BandwidthRows(std::vector<Setting>& rows);

}  // namespace tiermem
