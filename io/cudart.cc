// Finds and loads the CUDA runtime (libcudart.so.N) at run time, and binds the functions the CUDA
// backend calls. Nothing links libcudart: without it the library still loads, and the CUDA
// backend says why it is unavailable.
#include "io/cudart.h"

#ifdef TIERMEM_HAVE_CUDA

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "io/log.h"

namespace tiermem::io {
namespace {

// The soname the headers were compiled against: its functions keep their ABI within a major
// version, and only within one.
std::string Soname() { return absl::StrCat("libcudart.so.", CUDART_VERSION / 1000); }

// The file this code was loaded from: libtiermem.so, or the program it is linked into.
std::filesystem::path ThisObject() {
  static const char anchor = 0;
  Dl_info info = {};
  if (dladdr(&anchor, &info) != 0 && info.dli_fname != nullptr && info.dli_fname[0] == '/') {
    return info.dli_fname;
  }
  // A program's own name is as it was started (maybe bare, or relative to another cwd).
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe;
}

// The folders to try, best first, with the soname appended to each. In a wheel this object is
// site-packages/tiermem/{lib,bin}/..., so ../.. is site-packages, where torch's CUDA wheels put
// the runtime (nvidia/cu13/lib from CUDA 13; nvidia/cuda_runtime/lib before).
std::vector<std::string> Candidates(const std::string& soname) {
  std::vector<std::filesystem::path> dirs;
  if (std::filesystem::path self = ThisObject(); !self.empty()) {
    const std::filesystem::path site = self.parent_path().parent_path().parent_path();
    dirs.push_back(site / "nvidia" / absl::StrCat("cu", CUDART_VERSION / 1000) / "lib");
    dirs.push_back(site / "nvidia" / "cuda_runtime" / "lib");
  }
  if (const char* home = std::getenv("CUDA_HOME"); home != nullptr && home[0] != '\0') {
    dirs.push_back(std::filesystem::path(home) / "lib64");
  }
  dirs.push_back("/usr/local/cuda/lib64");
#ifdef TIERMEM_CUDART_BUILD_DIR
  dirs.push_back(TIERMEM_CUDART_BUILD_DIR);
#endif
  std::vector<std::string> paths;
  for (const std::filesystem::path& d : dirs) {
    std::string p = (d / soname).lexically_normal().string();
    bool seen = false;
    for (const std::string& q : paths) seen = seen || q == p;
    if (!seen) paths.push_back(std::move(p));
  }
  paths.push_back(soname);  // the loader's default search path
  return paths;
}

// The first runtime that loads, or every place tried and why each failed.
absl::StatusOr<std::pair<void*, std::string>> Open() {
  const std::string soname = Soname();
  if (void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD); h != nullptr) {
    return std::make_pair(h, absl::StrCat(soname, " (already loaded in this process)"));
  }
  std::vector<std::string> tried;
  for (const std::string& path : Candidates(soname)) {
    const bool is_file = path.find('/') != std::string::npos;
    if (is_file && access(path.c_str(), F_OK) != 0) {
      tried.push_back(absl::StrCat(path, " (absent)"));
      continue;
    }
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL); h != nullptr) {
      return std::make_pair(h, path);
    }
    const char* why = dlerror();
    tried.push_back(absl::StrCat(path, " (", why != nullptr ? why : "dlopen failed", ")"));
  }
  return absl::UnavailableError(absl::StrFormat(
      "no CUDA runtime (%s) found: tried %s; install torch's CUDA wheels or the CUDA toolkit, or "
      "set CUDA_HOME",
      soname, absl::StrJoin(tried, "; ")));
}

absl::StatusOr<CudaRuntime> Load() {
  auto opened = Open();
  if (!opened.ok()) return opened.status();
  auto [handle, where] = *std::move(opened);
  CudaRuntime rt;
  rt.path = where;
  std::vector<std::string> missing;
  // The function's name as the header spells it after its macros (a _v2 or _ptsz variant).
#define TM_CUDART_STR(s) #s
#define TM_CUDART_BIND(fn)                                                     \
  rt.fn = reinterpret_cast<decltype(rt.fn)>(dlsym(handle, TM_CUDART_STR(fn))); \
  if (rt.fn == nullptr) missing.push_back(TM_CUDART_STR(fn));
  TM_CUDART_FUNCTIONS(TM_CUDART_BIND)
#undef TM_CUDART_BIND
#undef TM_CUDART_STR
  if (!missing.empty()) {
    // Kept loaded: the process may hold other references to it (torch's).
    return absl::UnavailableError(
        absl::StrFormat("the CUDA runtime %s lacks %s", where, absl::StrJoin(missing, ", ")));
  }
  Log(LogSeverity::kDebug, "CUDA runtime: %s", where.c_str());
  return rt;
}

const absl::StatusOr<CudaRuntime>& Loaded() {
  static const absl::StatusOr<CudaRuntime> loaded = Load();  // once, thread-safe
  return loaded;
}

}  // namespace

absl::StatusOr<const CudaRuntime*> LoadCudaRuntime() {
  const absl::StatusOr<CudaRuntime>& loaded = Loaded();
  if (!loaded.ok()) return loaded.status();
  return &*loaded;
}

const CudaRuntime& Cudart() {
  const absl::StatusOr<CudaRuntime>& loaded = Loaded();
  if (!loaded.ok()) {
    Log(LogSeverity::kError, "the CUDA runtime used before it loaded: %s",
        std::string(loaded.status().message()).c_str());
    std::abort();
  }
  return *loaded;
}

absl::Status NoUsableDevice(cudaError_t e) {
  if (e == cudaErrorInsufficientDriver) {
    // Loaded already (by the runtime's attempt) or loadable: a driver older than the runtime.
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver == nullptr) {
      return absl::UnavailableError(
          "no usable CUDA device: no NVIDIA driver (libcuda.so.1 is not installed, or not on the "
          "loader's path)");
    }
    dlclose(driver);
  }
  return absl::UnavailableError(absl::StrFormat("no usable CUDA device: %s (%s)",
                                                Cudart().cudaGetErrorString(e),
                                                Cudart().cudaGetErrorName(e)));
}

}  // namespace tiermem::io

#endif  // TIERMEM_HAVE_CUDA
