// Process-wide log lines on stderr ("tiermem: warn: ..."), filtered by TIERMEM_LOG_LEVEL.
#pragma once

#include <cstdarg>

namespace tiermem::io {

enum class LogSeverity { kError = 1, kWarn = 2, kInfo = 3, kDebug = 4 };

void SetLogLevel(LogSeverity level);
bool LogEnabled(LogSeverity severity);
void Log(LogSeverity severity, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace tiermem::io
