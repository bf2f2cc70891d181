#include "lib/last_error.h"

namespace tiermem {

std::string& LastErrorSlot() {
  thread_local std::string message;
  return message;
}

}  // namespace tiermem
