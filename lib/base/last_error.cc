// The calling thread's last error message (tm_last_error), shared by every file of the C boundary.
#include "lib/base/last_error.h"

namespace tiermem {

std::string& LastErrorSlot() {
  thread_local std::string message;
  return message;
}

uint32_t& LastErrorFlagsSlot() {
  thread_local uint32_t flags = 0;
  return flags;
}

}  // namespace tiermem
