// An absl::Status from an errno: the canonical code of the errno, our message, its text and number.
#pragma once

#include <cstring>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace tiermem::io {

// (absl::ErrnoToStatus is avoided: it formats its own message through a lazily built strerror
// cache, which TSan cannot see synchronized in Debian's uninstrumented Abseil.)
inline absl::Status ErrnoStatus(int err, absl::string_view what) {
  char buf[128];
  const char* text = strerror_r(err, buf, sizeof buf);  // GNU: returns the message
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrFormat("%s: %s (errno %d)", what, text, err));
}

}  // namespace tiermem::io
