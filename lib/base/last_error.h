// The calling thread's last error message and flags, shared by every file of the C boundary.
#pragma once

#include <cstdint>
#include <string>

namespace tiermem {

std::string& LastErrorSlot();
// Its TM_ERROR_* flags (tm_last_error_flags).
uint32_t& LastErrorFlagsSlot();

}  // namespace tiermem
