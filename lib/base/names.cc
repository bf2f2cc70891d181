// Names and versions: the tm_* functions that need no runtime, used by the core too.
#include "tiermem/tiermem.h"

extern "C" {

TM_API const char* tm_status_string(tm_status status) {
  static constexpr const char* kNames[] = {"TM_OK",
                                           "TM_ERR_INVALID_ARGUMENT",
                                           "TM_ERR_INVALID_HANDLE",
                                           "TM_ERR_OUT_OF_MEMORY",
                                           "TM_ERR_NO_SPACE",
                                           "TM_ERR_IO",
                                           "TM_ERR_DEVICE",
                                           "TM_ERR_CONFIG",
                                           "TM_ERR_BUSY",
                                           "TM_ERR_UNSUPPORTED",
                                           "TM_ERR_INTERNAL",
                                           "TM_ERR_CORRUPT"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == TM_STATUS_COUNT);
  int i = static_cast<int>(status);
  return i >= 0 && i < TM_STATUS_COUNT ? kNames[i] : "TM_STATUS_UNKNOWN";
}

TM_API tm_status tm_get_version(int* major, int* minor, int* patch) {
  if (major != nullptr) *major = TM_VERSION_MAJOR;
  if (minor != nullptr) *minor = TM_VERSION_MINOR;
  if (patch != nullptr) *patch = TM_VERSION_PATCH;
  return TM_OK;
}

#define TM_STR2(x) #x
#define TM_STR(x) TM_STR2(x)
TM_API const char* tm_version_string(void) {
  return TM_STR(TM_VERSION_MAJOR) "." TM_STR(TM_VERSION_MINOR) "." TM_STR(TM_VERSION_PATCH);
}
#undef TM_STR
#undef TM_STR2

TM_API const char* tm_tier_name(tm_tier tier) {
  switch (tier) {
    case TM_TIER_HBM:
      return "hbm";
    case TM_TIER_DRAM:
      return "dram";
    case TM_TIER_NVME:
      return "nvme";
    default:
      return "unknown";
  }
}

}  // extern "C"
