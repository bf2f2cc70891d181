// config_fuzz: the size and integer parsers, the TIERMEM_ENV_FILE parser and LoadConfig over
// bytes; a crash, a sanitizer report or a broken round trip aborts.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "lib/config/config.h"

namespace {

[[noreturn]] void Finding(const std::string& what) {
  std::fprintf(stderr, "config_fuzz finding: %s\n", what.c_str());
  std::abort();
}

// The env file lives in one memfd rewritten per input: no file system traffic per run.
const std::string& EnvFilePath(absl::string_view contents) {
  static const int fd = memfd_create("config_fuzz_env", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ftruncate(fd, 0) != 0 ||
      pwrite(fd, contents.data(), contents.size(), 0) != static_cast<ssize_t>(contents.size())) {
    Finding("cannot prepare the memfd for the env file");
  }
  return path;
}

void CheckSize(absl::string_view text) {
  auto s = tiermem::ParseSize("TIERMEM_FUZZ", text);
  if (!s.ok()) {
    if (s.status().message().find("TIERMEM_FUZZ") == absl::string_view::npos) {
      Finding(absl::StrCat("ParseSize error does not name the setting: ", s.status().message()));
    }
    return;
  }
  if (s->percent > 0) {
    if (!(s->percent <= 100)) Finding(absl::StrCat("percentage above 100: ", s->percent));
    return;
  }
  // Whatever was accepted prints as a size that parses back to the same bytes.
  const std::string printed = s->ToString();
  auto again = tiermem::ParseSize("TIERMEM_FUZZ", printed);
  if (!again.ok() || again->bytes != s->bytes || again->percent != 0) {
    Finding(absl::StrCat("size \"", text, "\" = ", s->bytes, " prints as \"", printed,
                         "\", which does not parse back"));
  }
}

void CheckUnsigned(absl::string_view text) {
  auto v = tiermem::ParseUnsigned("TIERMEM_FUZZ", text);
  if (!v.ok()) return;
  auto again = tiermem::ParseUnsigned("TIERMEM_FUZZ", absl::StrCat(*v));
  if (!again.ok() || *again != *v) Finding(absl::StrCat("unsigned ", *v, " does not parse back"));
}

// LoadConfig over an environment made of "NAME=VALUE" lines; env_file set names the memfd.
void CheckLoad(absl::string_view env_lines, std::optional<std::string> env_file) {
  std::map<std::string, std::string> env;
  for (absl::string_view line : absl::StrSplit(env_lines, '\n')) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) continue;
    env[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
  }
  if (env_file.has_value()) env["TIERMEM_ENV_FILE"] = *env_file;
  std::vector<std::string> names;
  for (const auto& [name, value] : env) names.push_back(name);
  tiermem::EnvLookup lookup = [&env](const char* name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  auto config = tiermem::LoadConfig(tiermem::ConfigOverrides{}, lookup, names);
  if (!config.ok()) {
    if (config.status().message().empty()) Finding("LoadConfig failed without a message");
    return;
  }
  // Every known variable has an effective value to print.
  for (absl::string_view name : tiermem::KnownVariables()) {
    if (name == "TIERMEM_ENV_FILE") continue;
    if (!config->Value(name).has_value()) Finding(absl::StrCat(name, " has no effective value"));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0:
      CheckSize(text);
      break;
    case 1:
      CheckUnsigned(text);
      break;
    case 2: {  // the env file alone
      auto parsed = tiermem::ParseEnvFile(EnvFilePath(text));
      if (parsed.ok()) {
        for (const auto& [name, value] : parsed->values) {
          if (!absl::StartsWith(name, "TIERMEM_") || value.line < 1) {
            Finding(absl::StrCat("env file accepted ", name, " at line ", value.line));
          }
        }
      } else if (parsed.status().message().find("TIERMEM_ENV_FILE") == absl::string_view::npos) {
        Finding(absl::StrCat("env file error does not name TIERMEM_ENV_FILE: ",
                             parsed.status().message()));
      }
      break;
    }
    case 3:  // the env file through LoadConfig (every value parsed)
      CheckLoad("", EnvFilePath(text));
      break;
    case 4: {  // environment variables first, then an env file after a NUL
      const size_t nul = text.find('\0');
      if (nul == absl::string_view::npos) {
        CheckLoad(text, std::nullopt);
      } else {
        CheckLoad(text.substr(0, nul), EnvFilePath(text.substr(nul + 1)));
      }
      break;
    }
  }
  return 0;
}
