// An absl::Status from an errno: the canonical code of the errno, our message, its text and number.
#pragma once

#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace tiermem::io {

inline absl::Status ErrnoStatus(int err, absl::string_view what) {
  return absl::Status(absl::ErrnoToStatus(err, "").code(),
                      absl::StrFormat("%s: %s (errno %d)", what, std::strerror(err), err));
}

}  // namespace tiermem::io
