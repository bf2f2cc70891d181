// Chrome-trace JSON output, and the careful opening of the file it goes to.
#include "lib/trace/trace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/base/status.h"

namespace tiermem {
namespace {

const char* TrackName(int t) {
  static constexpr const char* kNames[] = {
      "",           "acquire stalls", "copy dram->hbm",     "copy hbm->dram",
      "nvme read",  "nvme write",     "nvme->hbm (staged)", "hbm->nvme (staged)",
      "evictions",  "clean drops",    "clean dram reads",   "recompute drops",
      "recomputes", "relocations",    "dropped prefetches"};
  return kNames[t];
}

std::string ErrnoText(int err) {
  char buf[128];
  return strerror_r(err, buf, sizeof buf);  // GNU: returns the message
}

// Length of the valid UTF-8 sequence at the start of `s`, or 0 when it does not start with one
// (a stray continuation byte, an overlong form, a surrogate, beyond U+10FFFF, or cut short).
size_t Utf8SequenceLength(absl::string_view s) {
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char c = b(0);
  size_t n = 0;
  uint32_t cp = 0;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (b(i) & 0x3F);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10FFFF ||
      (cp >= 0xD800 && cp <= 0xDFFF)) {
    return 0;
  }
  return n;
}

// Writes all of `text` to `fd`, continuing short writes.
bool WriteAll(int fd, absl::string_view text) {
  while (!text.empty()) {
    ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    text.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Why the entry at `path` must not be replaced by a trace: a directory, FIFO, socket or device
// (renaming over /dev/null as root would replace the device). A regular file or a symlink (the
// link itself, never its target) is replaced; nothing there is fine. Empty when replaceable.
std::string Unreplaceable(const std::string& path) {
  struct stat st = {};
  if (lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "is a directory: give a file path";
  return "is a FIFO, socket or device, not a regular file: it is never written or replaced";
}

}  // namespace

std::string JsonEscape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  while (!s.empty()) {
    const unsigned char c = static_cast<unsigned char>(s[0]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      s.remove_prefix(1);
    } else if (c < 0x20 || c == 0x7F) {
      out += absl::StrFormat("\\u%04x", c);
      s.remove_prefix(1);
    } else if (size_t n = Utf8SequenceLength(s); n > 0) {
      out.append(s.data(), n);
      s.remove_prefix(n);
    } else {
      out += "\\ufffd";  // not UTF-8: the replacement character, one per bad byte
      s.remove_prefix(1);
    }
  }
  return out;
}

absl::string_view Utf8Prefix(absl::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t cut = max;
  // Back over the continuation bytes of the character the cut falls in (at most three).
  for (int i = 0; i < 3 && cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80; ++i) {
    --cut;
  }
  if ((static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) cut = max;  // not UTF-8 anyway
  return s.substr(0, cut);
}

std::string ExpandTracePath(absl::string_view path, int64_t pid, int local_rank) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '%' && i + 1 < path.size()) {
      const char k = path[i + 1];
      if (k == 'p' || k == 'r' || k == '%') {
        if (k == 'p') absl::StrAppend(&out, pid);
        if (k == 'r') absl::StrAppend(&out, local_rank);
        if (k == '%') out += '%';
        ++i;
        continue;
      }
    }
    out += path[i];
  }
  return out;
}

Trace::Trace() : origin_(Clock::now()) {}

namespace {

// The traces open in this process, written by WriteOpenTraces at its exit when their runtimes
// were never destroyed (a Python process ending on an uncaught exception keeps the runtime alive
// through the traceback and the autograd graph). Never destroyed: safe at exit.
Mutex& OpenTracesMutex() {
  static Mutex* mu = new Mutex();
  return *mu;
}
std::vector<Trace*>& OpenTraces() {
  static auto* traces = new std::vector<Trace*>();
  return *traces;
}

}  // namespace

void WriteOpenTraces() {
  MutexLock lock(&OpenTracesMutex());
  for (Trace* t : OpenTraces()) {
    if (auto s = t->WriteAtExit(); !s.ok()) {
      std::fprintf(stderr, "tiermem: warn: at exit: %s\n", std::string(s.message()).c_str());
    }
  }
}

absl::Status Trace::WriteAtExit() {
  if (pid_ != getpid()) return absl::OkStatus();  // a fork()ed child: the parent's to write
  return Write();
}

absl::StatusOr<std::unique_ptr<Trace>> Trace::Open(const std::string& path, int local_rank,
                                                   absl::string_view setting) {
  std::unique_ptr<Trace> t(new Trace());
  if (path.empty()) return t;
  t->setting_ = std::string(setting);
  t->path_ = ExpandTracePath(path, getpid(), local_rank);
  auto bad = [&](absl::string_view why) {
    return Error(TM_ERR_CONFIG, absl::StrFormat("%s=%s: %s", t->setting_, t->path_, why));
  };
  if (auto why = Unreplaceable(t->path_); !why.empty()) return bad(why);
  struct stat st = {};
  // The new file sits beside the final one (rename does not cross file systems), is hidden,
  // and carries the pid and a counter so that processes and runtimes never share one.
  static std::atomic<uint64_t> counter{0};
  const size_t slash = t->path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : t->path_.substr(0, slash + 1);
  const std::string base = slash == std::string::npos ? t->path_ : t->path_.substr(slash + 1);
  for (int attempt = 0; attempt < 16 && t->fd_ < 0; ++attempt) {
    t->temp_path_ = absl::StrFormat(".%s.%d-%d.tmp", base, getpid(), ++counter);
    t->temp_path_ = dir + t->temp_path_;
    t->fd_ = open(t->temp_path_.c_str(),
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
    if (t->fd_ < 0 && errno != EEXIST) {
      const int err = errno;
      t->temp_path_.clear();
      return bad(absl::StrCat("cannot create a file in its directory: ", ErrnoText(err)));
    }
  }
  if (t->fd_ < 0) {
    t->temp_path_.clear();
    return bad("cannot create a file in its directory: every temporary name is taken");
  }
  // O_EXCL made it, so it is a new regular file; checked all the same, as a daemon would.
  if (fstat(t->fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return bad("the file created for it is not a regular file");
  }
  t->pid_ = getpid();
  static const bool at_exit = std::atexit(WriteOpenTraces) == 0;
  (void)at_exit;  // without it (no room for the handler) a process that exits leaves its .tmp
  MutexLock lock(&OpenTracesMutex());
  OpenTraces().push_back(t.get());
  return t;
}

Trace::~Trace() {
  if (pid_ != 0) {
    MutexLock lock(&OpenTracesMutex());
    std::erase(OpenTraces(), this);
  }
  if (fd_ >= 0) {
    close(fd_);
    unlink(temp_path_.c_str());
  }
}

void Trace::Add(Track track, std::string name, Clock::time_point start, Clock::time_point end,
                uint64_t bytes) {
  Add(track, std::move(name), start, end, bytes, std::string());
}

void Trace::Add(Track track, std::string name, Clock::time_point start, Clock::time_point end,
                uint64_t bytes, std::string reason) {
  if (!enabled()) return;
  MutexLock lock(&mu_);
  if (events_.size() >= kMaxEvents) {
    ++dropped_;
    return;
  }
  events_.push_back({track, std::move(name),
                     std::chrono::duration_cast<std::chrono::nanoseconds>(start - origin_).count(),
                     std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count(),
                     bytes, std::move(reason)});
}

absl::Status Trace::Write() {
  MutexLock write_lock(&write_mu_);
  if (!enabled()) return absl::OkStatus();
  std::string text;
  {
    MutexLock lock(&mu_);
    absl::StrAppendFormat(&text,
                          "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":%llu},\n"
                          "\"traceEvents\":[\n",
                          static_cast<unsigned long long>(dropped_));
    absl::StrAppend(&text,
                    "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{"
                    "\"name\":\"tiermem\"}}");
    for (int t = 1; t < kTrackCount; ++t) {
      absl::StrAppendFormat(&text,
                            ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\","
                            "\"args\":{\"name\":\"%s\"}}",
                            t, TrackName(t));
    }
    for (const Event& e : events_) {
      absl::StrAppendFormat(
          &text,
          ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"name\":\"%s\",\"cat\":\"%s\",\"ts\":%.3f,"
          "\"dur\":%.3f,\"args\":{\"bytes\":%llu%s}}",
          static_cast<int>(e.track), JsonEscape(e.name),
          e.track == kAcquire         ? "stall"
          : e.track == kEviction      ? "eviction"
          : e.track == kCleanDrop     ? "clean drop"
          : e.track == kCleanRead     ? "clean read"
          : e.track == kRecomputeDrop ? "recompute drop"
          : e.track == kRecompute     ? "recompute"
          : e.track == kRelocation    ? "relocation"
          : e.track == kPrefetchDrop  ? "prefetch drop"
                                      : "transfer",
          static_cast<double>(e.start_ns) / 1e3, static_cast<double>(e.dur_ns) / 1e3,
          static_cast<unsigned long long>(e.bytes),
          e.reason.empty() ? std::string()
                           : absl::StrCat(",\"reason\":\"", JsonEscape(e.reason), "\""));
    }
    absl::StrAppend(&text, "\n]}\n");
  }
  const bool written = WriteAll(fd_, text);
  const int write_err = errno;
  const bool closed = close(fd_) == 0;
  const int close_err = errno;
  fd_ = -1;
  if (!written || !closed) {
    unlink(temp_path_.c_str());
    return Error(TM_ERR_IO,
                 absl::StrFormat("%s=%s: cannot write %s: %s", setting_, path_, temp_path_,
                                 ErrnoText(written ? close_err : write_err)));
  }
  // rename replaces what is at path_ (a symlink itself, not its target) in one step; what
  // appeared there since create is checked again.
  if (auto why = Unreplaceable(path_); !why.empty()) {
    unlink(temp_path_.c_str());
    return Error(TM_ERR_IO, absl::StrFormat("%s=%s: %s", setting_, path_, why));
  }
  if (rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    unlink(temp_path_.c_str());
    return Error(TM_ERR_IO, absl::StrFormat("%s=%s: cannot rename %s into place: %s", setting_,
                                            path_, temp_path_, ErrnoText(err)));
  }
  return absl::OkStatus();
}

}  // namespace tiermem
