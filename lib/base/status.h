// absl::Status inside the core, tagged with the tm_status the C boundary will report.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "tiermem/tiermem.h"

namespace tiermem {

// An error carrying `code` (never TM_OK) and a message naming what was wrong.
absl::Status Error(tm_status code, absl::string_view message);
// The tm_status of a core status: its tag, else derived from the canonical code.
tm_status ToTmStatus(const absl::Status& s);
// `s` with its message prefixed by `context` and its tag kept.
absl::Status WithContext(const absl::Status& s, absl::string_view context);
// Re-tags a status from io/ or a device as `code`, except that ResourceExhausted from file
// I/O means the disk is full (TM_ERR_NO_SPACE).
absl::Status Retag(const absl::Status& s, tm_status code);
// `s` marked as the report of failures that each left their tensor valid where it was (nothing
// lost: the caller's work stands). The mark rides in a payload, so context added on the way up
// keeps it; the C boundary turns it into TM_ERROR_NOTHING_LOST (tm_last_error_flags).
absl::Status MarkNothingLost(absl::Status s);
// The TM_ERROR_* flags a status carries (0 for OK or none).
uint32_t ErrorFlags(const absl::Status& s);
// The exception being handled (call only inside a catch block) as a status: std::bad_alloc
// and a thread the system would not start (std::system_error, EAGAIN) are
// TM_ERR_OUT_OF_MEMORY, with what limits them; anything else is TM_ERR_INTERNAL, a bug.
absl::Status CurrentExceptionStatus();

// Formats a byte count for messages: "64 MiB", "1.5 GiB", "1000 B"; a count that four
// significant digits would round is followed by its exact value: "2 MiB (2097151 B)".
std::string HumanBytes(uint64_t bytes);

}  // namespace tiermem
