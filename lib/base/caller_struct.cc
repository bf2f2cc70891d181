#include "lib/base/caller_struct.h"

#include "absl/strings/str_format.h"
#include "lib/base/status.h"
#include "tiermem/tiermem.h"

namespace tiermem {

absl::Status CheckCallerStruct(size_t struct_size, size_t minimum, size_t known, size_t align,
                               absl::string_view what, absl::string_view init) {
  if (struct_size < minimum || (align > 1 && struct_size % align != 0)) {
    return Error(
        TM_ERR_INVALID_ARGUMENT,
        absl::StrFormat("%s.struct_size is %zu: fill the struct with %s", what, struct_size, init));
  }
  if (struct_size > known) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("%s.struct_size is %zu, more than the %zu bytes this library "
                                 "(tiermem %d.%d.%d) knows: the caller was built against a newer "
                                 "tiermem.h, whose fields past byte %zu this library would ignore; "
                                 "build against this library's header or link a newer library",
                                 what, struct_size, known, TM_VERSION_MAJOR, TM_VERSION_MINOR,
                                 TM_VERSION_PATCH, known));
  }
  return absl::OkStatus();
}

}  // namespace tiermem
