// The bit layout of the opaque 64-bit handles of the C API, shared by every kind of handle so
// that a handle of one kind can never be taken for another (a runtime for a tensor).
#pragma once

#include <cstdint>
#include <string>

namespace tiermem {

// bits 63..60: kind, 59..32: generation (never 0), 31..0: slot index. The kinds are distinct
// non-zero patterns, so neither zero nor a handle of the other kind ever matches.
enum class HandleKind : uint64_t { kRuntime = 0x5, kTensor = 0xA, kAdam = 0xC };

inline constexpr int kHandleKindShift = 60;
inline constexpr uint32_t kHandleGenerationMask = (uint32_t{1} << 28) - 1;

inline uint64_t MakeHandle(HandleKind kind, uint32_t generation, uint32_t index) {
  return static_cast<uint64_t>(kind) << kHandleKindShift |
         uint64_t{generation & kHandleGenerationMask} << 32 | index;
}
inline bool HandleIsKind(uint64_t handle, HandleKind kind) {
  return handle >> kHandleKindShift == static_cast<uint64_t>(kind);
}
inline uint32_t HandleGeneration(uint64_t handle) {
  return static_cast<uint32_t>(handle >> 32) & kHandleGenerationMask;
}
inline uint32_t HandleIndex(uint64_t handle) { return static_cast<uint32_t>(handle); }

inline const char* HandleKindName(HandleKind kind) {
  switch (kind) {
    case HandleKind::kRuntime:
      return "a runtime";
    case HandleKind::kTensor:
      return "a tensor";
    case HandleKind::kAdam:
      return "a CPU Adam";
  }
  return "an unknown";
}

// Why a handle expected to be of `kind` was not found, for its TM_ERR_INVALID_HANDLE message: a
// handle of another kind is named as such (a runtime handle passed as a tensor), else `otherwise`.
inline std::string HandleMismatch(uint64_t handle, HandleKind kind, const char* otherwise) {
  if (handle == 0 || HandleIsKind(handle, kind)) return otherwise;
  for (HandleKind k : {HandleKind::kRuntime, HandleKind::kTensor, HandleKind::kAdam}) {
    if (HandleIsKind(handle, k)) {
      return std::string(HandleKindName(k)) + " handle, passed where " + HandleKindName(kind) +
             " handle goes";
    }
  }
  return "not a handle tiermem returned";
}

// The next generation of a counter: 28 bits, skipping 0 (0 marks a free slot).
inline uint32_t NextHandleGeneration(uint32_t previous) {
  uint32_t g = (previous + 1) & kHandleGenerationMask;
  return g == 0 ? 1 : g;
}

}  // namespace tiermem
