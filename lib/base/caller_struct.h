// The size check every struct a caller passes in shares (tm_config, tm_tensor_desc,
// tm_adam_config): struct_size says which version of the header the caller was built against.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tiermem {

// OK when struct_size is one this library reads: at least minimum bytes (the oldest layout it
// accepts; an older caller's struct is read as far as it reaches) and at most the known bytes
// of this library's header. Longer is a caller built against a newer header, whose added
// settings this library would ignore without a word: refused, as is shorter, with
// TM_ERR_INVALID_ARGUMENT naming `what` and the initializer to use. (The bytes past `known`
// cannot tell set from unset: a newer field's unset value need not be zero, and padding
// between fields is whatever the caller's stack held.)
// A size that is not a multiple of `align` (the struct's alignment, which every version's
// sizeof is a multiple of) ends inside a field: refused too.
absl::Status CheckCallerStruct(size_t struct_size, size_t minimum, size_t known, size_t align,
                               absl::string_view what, absl::string_view init);

}  // namespace tiermem
