// Process-wide log lines on stderr ("tiermem: warn: ...", "tiermem[r1]: warn: ..." on a node of
// several ranks), filtered by TIERMEM_LOG_LEVEL.
#pragma once

#include <cstdarg>

namespace tiermem::io {

enum class LogSeverity { kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };

void SetLogLevel(LogSeverity level);
bool LogEnabled(LogSeverity severity);
// The local rank named in every line ("tiermem[r1]: ...") once several ranks share the node
// (local_world > 1) or the rank is known to be above 0: their lines interleave on one terminal.
void SetLogRank(int local_rank, int local_world);
void Log(LogSeverity severity, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace tiermem::io
