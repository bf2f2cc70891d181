// Chrome-trace JSON output.
#include "lib/trace.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_format.h"
#include "lib/status.h"

namespace tiermem {
namespace {

const char* TrackName(int t) {
  static constexpr const char* kNames[] = {
      "",           "acquire stalls", "copy dram->hbm",     "copy hbm->dram", "nvme read",
      "nvme write", "nvme->hbm (staged)", "hbm->nvme (staged)", "evictions"};
  return kNames[t];
}

}  // namespace

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out;
}

Trace::Trace(std::string path) : path_(std::move(path)), origin_(Clock::now()) {}

void Trace::Add(Track track, std::string name, Clock::time_point start, Clock::time_point end,
                uint64_t bytes) {
  if (!enabled()) return;
  MutexLock lock(&mu_);
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back({track, std::move(name),
                     std::chrono::duration_cast<std::chrono::nanoseconds>(start - origin_).count(),
                     std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count(),
                     bytes});
}

absl::Status Trace::Write() const {
  if (!enabled()) return absl::OkStatus();
  FILE* f = std::fopen(path_.c_str(), "we");
  if (f == nullptr) {
    return Error(TM_ERR_IO, absl::StrFormat("TIERMEM_TRACE=%s: cannot write: %s", path_,
                                            std::strerror(errno)));
  }
  MutexLock lock(&mu_);
  std::fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":%llu},\n\"traceEvents\":[\n",
               static_cast<unsigned long long>(dropped_));
  std::fprintf(f, "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"tiermem\"}}");
  for (int t = 1; t < kTrackCount; ++t) {
    std::fprintf(f, ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}}",
                 t, TrackName(t));
  }
  for (const Event& e : events_) {
    std::fprintf(f,
                 ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"name\":\"%s\",\"cat\":\"%s\",\"ts\":%.3f,"
                 "\"dur\":%.3f,\"args\":{\"bytes\":%llu}}",
                 static_cast<int>(e.track), JsonEscape(e.name).c_str(),
                 e.track == kAcquire ? "stall" : e.track == kEviction ? "eviction" : "transfer",
                 static_cast<double>(e.start_ns) / 1e3, static_cast<double>(e.dur_ns) / 1e3,
                 static_cast<unsigned long long>(e.bytes));
  }
  std::fprintf(f, "\n]}\n");
  if (std::fclose(f) != 0) {
    return Error(TM_ERR_IO, absl::StrFormat("TIERMEM_TRACE=%s: %s", path_, std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace tiermem
