// The C boundary's shared parts (see c_boundary.h), and tm_last_error.
#include "lib/api/c_boundary.h"

namespace tiermem {
namespace {

thread_local std::string t_last_error;

}  // namespace

tm_status Fail(tm_status code, absl::string_view message) {
  t_last_error.assign(message.data(), message.size());
  return code;
}

tm_status Report(const absl::Status& s) {
  if (s.ok()) return TM_OK;
  return Fail(ToTmStatus(s), s.message());
}

tm_status NullArgument(const char* function, const char* argument) {
  return Fail(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("%s: %s is NULL", function, argument));
}

const char* LastError() { return t_last_error.c_str(); }

RuntimeRegistry& Registry() {
  static RuntimeRegistry* r = new RuntimeRegistry();  // never destroyed: safe at exit
  return *r;
}

}  // namespace tiermem
