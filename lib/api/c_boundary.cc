// The C boundary's shared parts (see c_boundary.h), and tm_last_error.
#include "lib/api/c_boundary.h"

#include "lib/base/last_error.h"

namespace tiermem {
tm_status Fail(tm_status code, absl::string_view message) {
  LastErrorSlot().assign(message.data(), message.size());
  LastErrorFlagsSlot() = 0;
  return code;
}

tm_status Report(const absl::Status& s) {
  if (s.ok()) return TM_OK;
  const tm_status code = Fail(ToTmStatus(s), s.message());
  LastErrorFlagsSlot() = ErrorFlags(s);
  return code;
}

tm_status NullArgument(const char* function, const char* argument) {
  return Fail(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("%s: %s is NULL", function, argument));
}

const char* LastError() { return LastErrorSlot().c_str(); }

uint32_t LastErrorFlags() { return LastErrorFlagsSlot(); }

RuntimeRegistry& Registry() {
  static RuntimeRegistry* r = new RuntimeRegistry();  // never destroyed: safe at exit
  return *r;
}

}  // namespace tiermem
