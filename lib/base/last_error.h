// The calling thread's last error message, shared by every file of the C boundary.
#pragma once

#include <string>

namespace tiermem {

std::string& LastErrorSlot();

}  // namespace tiermem
