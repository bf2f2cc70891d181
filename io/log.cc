// Log sink: one write per line so that lines from several threads never interleave.
#include "io/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace tiermem::io {
namespace {
std::atomic<int> g_level{static_cast<int>(LogSeverity::kWarn)};
std::atomic<int> g_rank{-1};  // -1: not named
constexpr const char* kNames[] = {"", "error", "warn", "info", "debug"};
}  // namespace

void SetLogLevel(LogSeverity level) { g_level.store(static_cast<int>(level)); }

void SetLogRank(int local_rank, int local_world) {
  g_rank.store(local_world > 1 || local_rank > 0 ? local_rank : -1);
}

bool LogEnabled(LogSeverity severity) { return static_cast<int>(severity) <= g_level.load(); }

void Log(LogSeverity severity, const char* format, ...) {
  if (!LogEnabled(severity)) return;
  char line[1024];
  const int rank = g_rank.load();
  int n = rank >= 0 ? std::snprintf(line, sizeof line, "tiermem[r%d]: %s: ", rank,
                                    kNames[static_cast<int>(severity)])
                    : std::snprintf(line, sizeof line,
                                    "tiermem: %s: ", kNames[static_cast<int>(severity)]);
  va_list args;
  va_start(args, format);
  int m = std::vsnprintf(line + n, sizeof line - static_cast<size_t>(n) - 1, format, args);
  va_end(args);
  size_t len = static_cast<size_t>(n) + (m < 0 ? 0 : static_cast<size_t>(m));
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, len);
  (void)ignored;
}

}  // namespace tiermem::io
