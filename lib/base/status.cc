// The tm_status tag rides in a status payload so that it survives context added on the way up.
#include "lib/base/status.h"

#include <cmath>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <system_error>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace tiermem {
namespace {

constexpr absl::string_view kPayload = "tiermem.tm_status";
constexpr absl::string_view kNothingLost = "tiermem.nothing_lost";

absl::StatusCode CanonicalFor(tm_status code) {
  switch (code) {
    case TM_ERR_INVALID_ARGUMENT:
      return absl::StatusCode::kInvalidArgument;
    case TM_ERR_INVALID_HANDLE:
      return absl::StatusCode::kNotFound;
    case TM_ERR_OUT_OF_MEMORY:
    case TM_ERR_NO_SPACE:
      return absl::StatusCode::kResourceExhausted;
    case TM_ERR_IO:
    case TM_ERR_CORRUPT:
      return absl::StatusCode::kDataLoss;
    case TM_ERR_DEVICE:
      return absl::StatusCode::kUnavailable;
    case TM_ERR_CONFIG:
      return absl::StatusCode::kInvalidArgument;
    case TM_ERR_BUSY:
      return absl::StatusCode::kFailedPrecondition;
    case TM_ERR_UNSUPPORTED:
      return absl::StatusCode::kUnimplemented;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status Error(tm_status code, absl::string_view message) {
  absl::Status s(CanonicalFor(code), message);
  s.SetPayload(kPayload, absl::Cord(absl::StrCat(static_cast<int>(code))));
  return s;
}

tm_status ToTmStatus(const absl::Status& s) {
  if (s.ok()) return TM_OK;
  if (auto p = s.GetPayload(kPayload); p.has_value()) {
    int v = 0;
    if (absl::SimpleAtoi(std::string(*p), &v) && v > 0 && v < TM_STATUS_COUNT) {
      return static_cast<tm_status>(v);
    }
  }
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return TM_ERR_INVALID_ARGUMENT;
    case absl::StatusCode::kResourceExhausted:
      return TM_ERR_OUT_OF_MEMORY;
    case absl::StatusCode::kUnavailable:
      return TM_ERR_DEVICE;
    case absl::StatusCode::kUnimplemented:
      return TM_ERR_UNSUPPORTED;
    case absl::StatusCode::kFailedPrecondition:
      return TM_ERR_BUSY;
    default:
      return TM_ERR_INTERNAL;
  }
}

absl::Status WithContext(const absl::Status& s, absl::string_view context) {
  if (s.ok()) return s;
  absl::Status out(s.code(), absl::StrCat(context, ": ", s.message()));
  s.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

absl::Status MarkNothingLost(absl::Status s) {
  if (!s.ok()) s.SetPayload(kNothingLost, absl::Cord("1"));
  return s;
}

uint32_t ErrorFlags(const absl::Status& s) {
  if (s.ok()) return 0;
  return s.GetPayload(kNothingLost).has_value() ? TM_ERROR_NOTHING_LOST : 0u;
}

absl::Status Retag(const absl::Status& s, tm_status code) {
  if (s.ok()) return s;
  if (code == TM_ERR_IO && s.code() == absl::StatusCode::kResourceExhausted) code = TM_ERR_NO_SPACE;
  return Error(code, s.message());
}

absl::Status CurrentExceptionStatus() {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return Error(TM_ERR_OUT_OF_MEMORY, "host memory exhausted (std::bad_alloc)");
  } catch (const std::system_error& e) {
    if (e.code() == std::errc::resource_unavailable_try_again) {
      return Error(TM_ERR_OUT_OF_MEMORY,
                   absl::StrFormat("the system would not start a thread (%s): the process's "
                                   "threads are limited by ulimit -u (RLIMIT_NPROC), "
                                   "/proc/sys/kernel/threads-max and a cgroup's pids.max",
                                   e.what()));
    }
    return Error(TM_ERR_INTERNAL, absl::StrFormat("unexpected exception: %s", e.what()));
  } catch (const std::exception& e) {
    return Error(TM_ERR_INTERNAL, absl::StrFormat("unexpected exception: %s", e.what()));
  } catch (...) {
    return Error(TM_ERR_INTERNAL, "unexpected exception");
  }
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  const auto exact = static_cast<unsigned long long>(bytes);
  if (u == 0) return absl::StrFormat("%llu B", exact);
  std::string shown = absl::StrFormat("%.4g %s", v, kUnits[u]);
  // Four digits round: 2 MiB - 1 would show as "2 MiB", and a message that compares what a
  // request needs with what is free would then contradict itself. Unless the figure shown is
  // the count itself, the exact count follows it.
  const double back = std::strtod(shown.c_str(), nullptr) * std::ldexp(1.0, 10 * u);
  if (bytes > (uint64_t{1} << 53) || back != static_cast<double>(bytes)) {
    absl::StrAppendFormat(&shown, " (%llu B)", exact);
  }
  return shown;
}

}  // namespace tiermem
