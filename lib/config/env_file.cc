// TIERMEM_ENV_FILE: reading a file of settings (regular files only; /dev/null is empty).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "lib/config/config.h"
#include "lib/config/config_internal.h"

namespace tiermem {

namespace {

// The file's text: a regular file of at most 1 MiB; the null device reads as empty.
absl::StatusOr<std::string> ReadEnvFileText(const std::string& path) {
  constexpr uint64_t kMaxBytes = 1u << 20;
  auto bad = [&](absl::string_view why) { return Bad("TIERMEM_ENV_FILE", path, why); };
  if (path.empty()) return bad("no file given");
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever. Only a
  // regular file is read; a FIFO, device or directory is refused before any read.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    char msg[128];
    return bad(absl::StrCat("cannot open it: ", strerror_r(errno, msg, sizeof msg)));
  }
  struct stat st = {};
  if (fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3)) {
    // The null device (/dev/null, or a link to it) means "no file", as GIT_CONFIG=/dev/null
    // does: read as empty.
    close(fd);
    return std::string();
  }
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return bad("not a regular file (a FIFO, device or directory is never read)");
  }
  std::FILE* f = fdopen(fd, "r");
  if (f == nullptr) {
    close(fd);
    return bad("cannot read it");
  }
  std::string text;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() <= kMaxBytes) {
    text.append(buf, n);
  }
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return bad("cannot read it");
  if (text.size() > kMaxBytes) return bad("larger than 1 MiB: not an env file");
  return text;
}

// The value without a trailing comment: as in shell, a `#` after whitespace starts one, but not
// inside quotes (a quoted value's comment may follow its closing quote) and not within a word
// (`A=1#2` is "1#2").
absl::string_view WithoutComment(absl::string_view value) {
  size_t from = 0;
  if (!value.empty() && (value.front() == '"' || value.front() == '\'')) {
    from = value.find(value.front(), 1);
    if (from == absl::string_view::npos) return value;  // unbalanced: refused by the caller
  }
  for (size_t i = from + 1; i < value.size(); ++i) {
    if (value[i] == '#' && absl::ascii_isspace(static_cast<unsigned char>(value[i - 1]))) {
      return absl::StripTrailingAsciiWhitespace(value.substr(0, i));
    }
  }
  return value;
}

}  // namespace

absl::StatusOr<EnvFile> ParseEnvFile(const std::string& path) {
  auto read = ReadEnvFileText(path);
  if (!read.ok()) return read.status();
  const std::string& text = *read;
  EnvFile out;
  out.path = path;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto line_error = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrFormat("TIERMEM_ENV_FILE: %s:%d: %s", path, line_no, why));
    };
    if (absl::ConsumePrefix(&line, "export")) {
      if (line.empty() || !absl::ascii_isspace(static_cast<unsigned char>(line[0]))) {
        return line_error("expected [export ]TIERMEM_NAME=VALUE");
      }
      line = absl::StripLeadingAsciiWhitespace(line);
    }
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) return line_error("expected [export ]TIERMEM_NAME=VALUE");
    absl::string_view name = line.substr(0, eq);
    absl::string_view value = WithoutComment(line.substr(eq + 1));
    bool name_ok = absl::StartsWith(name, "TIERMEM_") && name.size() > 8;
    for (char ch : name)
      name_ok = name_ok && (absl::ascii_isupper(ch) || absl::ascii_isdigit(ch) || ch == '_');
    if (!name_ok) {
      return line_error(absl::StrCat("\"", name, "\" is not a TIERMEM_ variable name"));
    }
    if (name == "TIERMEM_ENV_FILE") return line_error("an env file cannot name another one");
    if (name == "TIERMEM_LIBRARY") {
      return line_error(
          "TIERMEM_LIBRARY is read from the environment only (the Python package loads the "
          "library before any env file is read): export it instead");
    }
    if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    if (value.find_first_of("$`") != absl::string_view::npos) {
      return line_error("shell expansion ($, `) is not supported in values: write the value");
    }
    if (value.find('\\') != absl::string_view::npos) {
      return line_error("escapes (\\) are not supported in values");
    }
    if (value.find_first_of("\"'") != absl::string_view::npos) {
      return line_error(
          "an unmatched quote, or a quote inside the value: quote the whole value, or none of it");
    }
    auto [it, inserted] =
        out.values.try_emplace(std::string(name), EnvFile::Value{std::string(value), line_no});
    if (!inserted) {
      return line_error(
          absl::StrFormat("%s is set twice (first on line %d)", name, it->second.line));
    }
  }
  return out;
}

}  // namespace tiermem
