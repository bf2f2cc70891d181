// The extern "C" boundary, DLPack: an acquired copy handed to a framework as a DLManagedTensor
// whose deleter releases it (tm_tensor_acquire_dlpack).
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>

#include "absl/strings/str_format.h"
#include "lib/api/c_boundary.h"
#include "lib/base/caller_struct.h"

using namespace tiermem;  // NOLINT: the C entry points below implement the tm_* ABI

namespace {

// DLPack's ABI (the unversioned DLManagedTensor of dlpack.h, which consumers take from a
// "dltensor" capsule), written from its specification; only the layout matters.
struct DLDevice {
  int32_t device_type;  // kDLCPU 1, kDLCUDA 2
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};
static_assert(sizeof(DLTensor) == 48 && offsetof(DLTensor, shape) == 24, "DLPack's DLTensor");
static_assert(sizeof(DLManagedTensor) == 64 && offsetof(DLManagedTensor, deleter) == 56,
              "DLPack's DLManagedTensor");
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kMaxDims = 64;
// DLPack 1.1's last DLDataTypeCode (kDLFloat4_e2m1fn; 0 kDLInt ... 6 kDLBool, 7-17 the float8,
// float6 and float4 kinds).
constexpr unsigned kLastTypeCode = 17;

// One export: the struct the consumer holds, and what its deleter releases. It keeps the runtime
// (its memory) alive: a view kept past tm_runtime_destroy reads the bytes it was handed, not
// freed memory or a later runtime's tensor, and the runtime goes with the last such export.
struct Export {
  DLManagedTensor managed{};
  std::shared_ptr<Runtime> keep;
  uint64_t generation = 0;  // ForkGeneration() when it was made
  uint64_t tensor = 0;
  tm_tier tier = TM_TIER_HBM;
  void* stream = nullptr;
  std::unique_ptr<int64_t[]> dims;  // the shape, then the strides
};

// The deleter: the acquire released, also after tm_runtime_destroy (the runtime, out of the
// handle table, is freed with its last export, possibly here). In a fork()ed child of the process
// that made it nothing is released and the runtime never freed (its threads stayed in the
// parent: joining them would hang). It never touches the calling thread's last error: it runs
// wherever the consumer frees the tensor, between another call's failure and its report.
void DeleteExport(DLManagedTensor* managed) {
  std::unique_ptr<Export> e(static_cast<Export*>(managed->manager_ctx));
  if (e->generation != ForkGeneration()) {
    // NOLINTNEXTLINE(cppcoreguidelines-owning-memory): kept on purpose, as the registry keeps
    // a destroyed inherited runtime
    (void)new std::shared_ptr<Runtime>(std::move(e->keep));
    return;
  }
  try {
    (void)e->keep->ReleaseExport(e->tensor, e->tier, e->stream);  // a failure is logged there
  } catch (...) {  // NOLINT(bugprone-empty-catch): a deleter has no one to tell
  }
}

// The export of `layout` over a tensor of `bytes` bytes, its shape and strides copied; an error
// naming what DLPack cannot describe or what reaches past the tensor.
absl::StatusOr<std::unique_ptr<Export>> MakeExport(const tm_dlpack_layout& layout, uint64_t bytes) {
  const int32_t ndim = layout.ndim;
  if (ndim < 0 || ndim > kMaxDims) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tm_dlpack_layout.ndim %d is not 0 to %d", ndim, kMaxDims));
  }
  if (ndim > 0 && layout.shape == nullptr) {
    return Error(TM_ERR_INVALID_ARGUMENT, "tm_dlpack_layout.shape is NULL with ndim > 0");
  }
  if (layout.dtype_code > kLastTypeCode) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tm_dlpack_layout.dtype_code %u is not one of DLPack's "
                                 "DLDataTypeCode values (0 to %u)",
                                 layout.dtype_code, kLastTypeCode));
  }
  if (layout.dtype_bits == 0 || layout.dtype_bits % 8 != 0 || layout.dtype_lanes == 0) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("tm_dlpack_layout's dtype has %u bits and %u lanes: bits must be "
                                 "a multiple of 8 and lanes at least 1",
                                 layout.dtype_bits, layout.dtype_lanes));
  }
  auto e = std::make_unique<Export>();
  e->dims = std::make_unique<int64_t[]>(2 * static_cast<size_t>(ndim) + 1);
  int64_t* shape = e->dims.get();
  int64_t* strides = shape + ndim;
  // Row-major strides when none are given; the last element's offset, in elements.
  unsigned __int128 last = 0;
  bool empty = false;
  int64_t compact = 1;
  for (int32_t d = ndim - 1; d >= 0; --d) {
    const int64_t n = layout.shape[d];
    const int64_t s = layout.strides != nullptr ? layout.strides[d] : compact;
    if (n < 0 || s < 0) {
      return Error(TM_ERR_INVALID_ARGUMENT,
                   absl::StrFormat("tm_dlpack_layout dimension %d: size %lld, stride %lld (neither "
                                   "may be negative)",
                                   d, static_cast<long long>(n), static_cast<long long>(s)));
    }
    shape[d] = n;
    strides[d] = s;
    empty = empty || n == 0;
    if (n > 0) last += static_cast<unsigned __int128>(n - 1) * static_cast<uint64_t>(s);
    if (layout.strides == nullptr && n > 0) {
      compact = n > std::numeric_limits<int64_t>::max() / std::max<int64_t>(compact, 1)
                    ? std::numeric_limits<int64_t>::max()
                    : compact * n;
    }
  }
  const uint64_t element = uint64_t{layout.dtype_bits} / 8 * layout.dtype_lanes;
  const unsigned __int128 reach =
      layout.byte_offset + (empty ? 0 : (last + 1) * static_cast<unsigned __int128>(element));
  if (reach > bytes) {
    return Error(
        TM_ERR_INVALID_ARGUMENT,
        absl::StrFormat("tm_dlpack_layout reaches byte %llu of a tensor of %llu bytes",
                        static_cast<unsigned long long>(reach > std::numeric_limits<uint64_t>::max()
                                                            ? std::numeric_limits<uint64_t>::max()
                                                            : static_cast<uint64_t>(reach)),
                        static_cast<unsigned long long>(bytes)));
  }
  DLTensor& t = e->managed.dl_tensor;
  t.ndim = ndim;
  t.dtype = {layout.dtype_code, layout.dtype_bits, layout.dtype_lanes};
  t.shape = ndim > 0 ? shape : nullptr;
  t.strides = ndim > 0 ? strides : nullptr;
  t.byte_offset = 0;  // folded into data: not every consumer reads it
  return e;
}

}  // namespace

extern "C" {

TM_API tm_status tm_tensor_acquire_dlpack(tm_runtime runtime, tm_tensor tensor, tm_tier tier,
                                          tm_access access, void* stream,
                                          const tm_dlpack_layout* layout, void** managed) {
  constexpr const char* kFn = "tm_tensor_acquire_dlpack";
  if (managed != nullptr) *managed = nullptr;
  if (layout == nullptr) return NullArgument(kFn, "layout");
  if (managed == nullptr) return NullArgument(kFn, "managed");
  if (tm_status s = Report(CheckCallerStruct(
          layout->struct_size, offsetof(tm_dlpack_layout, byte_offset) + sizeof(uint64_t),
          sizeof(tm_dlpack_layout), alignof(tm_dlpack_layout), "tm_dlpack_layout",
          "TM_DLPACK_LAYOUT_INIT"));
      s != TM_OK) {
    return s;
  }
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto bytes = rt.TensorBytes(tensor.bits);
    if (!bytes.ok()) return bytes.status();
    auto e = MakeExport(*layout, *bytes);
    if (!e.ok()) return e.status();
    // A host-memory export (kDLCPU: DRAM, or the emulated device's HBM) is read by consumers with
    // no stream to wait on: its copy lands before this returns (a stream-ordered acquire would
    // hand out the pointer while the copy still ran). The release stays on `stream`.
    const bool device = tier == TM_TIER_HBM && rt.info().device_kind == "cuda";
    auto p = rt.Acquire(tensor.bits, tier, access, device ? stream : nullptr, /*for_export=*/true);
    if (!p.ok()) return p.status();
    Export& x = **e;
    DLTensor& t = x.managed.dl_tensor;
    t.data = static_cast<char*>(*p) + layout->byte_offset;
    t.device = device ? DLDevice{kDLCUDA, rt.info().cuda_device} : DLDevice{kDLCPU, 0};
    bool inherited = false;
    x.keep = Registry().Get(runtime.bits, &inherited);
    if (x.keep == nullptr) {  // destroyed by another thread since this call began
      (void)rt.ReleaseExport(tensor.bits, tier, nullptr);
      return Error(TM_ERR_INVALID_HANDLE, "the runtime was destroyed during the call");
    }
    x.generation = ForkGeneration();
    x.tensor = tensor.bits;
    x.tier = tier;
    x.stream = stream;
    x.managed.manager_ctx = &x;
    x.managed.deleter = &DeleteExport;
    *managed = &e->release()->managed;
    return absl::OkStatus();
  });
}

}  // extern "C"
