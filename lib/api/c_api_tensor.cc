// The extern "C" boundary, tensors: create, destroy, copies in and out, acquire and release,
// moves and residency.
#include <cstddef>
#include <cstring>
#include <string>

#include "lib/api/c_boundary.h"
#include "lib/base/caller_struct.h"

using namespace tiermem;  // NOLINT: the C entry points below implement the tm_* ABI

namespace {

// TM_OK when desc's struct_size is one this library reads.
tm_status CheckDesc(const tm_tensor_desc* desc) {
  const absl::Status s = CheckCallerStruct(
      desc->struct_size, offsetof(tm_tensor_desc, name) + sizeof(desc->name),
      sizeof(tm_tensor_desc), alignof(tm_tensor_desc), "tm_tensor_desc", "TM_TENSOR_DESC_INIT");
  return Report(s);
}

TensorDesc ToTensorDesc(const tm_tensor_desc& desc) {
  TensorDesc d;
  d.bytes = desc.bytes;
  d.cls = desc.cls;
  d.home_tier = desc.home_tier;
  // At most 256 bytes are kept, cut before a UTF-8 character rather than inside one (one
  // byte more is read to see whether the cut falls inside a character).
  if (desc.name != nullptr) {
    const absl::string_view given(desc.name, strnlen(desc.name, 257));
    d.name = std::string(Utf8Prefix(given, 256));
  }
  return d;
}

}  // namespace

extern "C" {

TM_API tm_status tm_tensor_create(tm_runtime runtime, const tm_tensor_desc* desc, tm_tensor* out) {
  if (out != nullptr) out->bits = 0;  // zero on any failure, whichever argument is wrong
  if (desc == nullptr) return NullArgument("tm_tensor_create", "desc");
  if (out == nullptr) return NullArgument("tm_tensor_create", "out");
  if (tm_status s = CheckDesc(desc); s != TM_OK) return s;
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto h = rt.CreateTensor(ToTensorDesc(*desc));
    if (!h.ok()) return h.status();
    out->bits = *h;
    return absl::OkStatus();
  });
}

TM_API tm_status tm_tensor_create_copy_in_async(tm_runtime runtime, const tm_tensor_desc* desc,
                                                const void* src, void* stream, tm_tensor* out,
                                                int32_t* done) {
  constexpr const char* kFn = "tm_tensor_create_copy_in_async";
  // On any failure *out is zero and *done 0, whichever argument is wrong.
  if (out != nullptr) out->bits = 0;
  if (done != nullptr) *done = 0;
  if (desc == nullptr) return NullArgument(kFn, "desc");
  if (out == nullptr) return NullArgument(kFn, "out");
  if (done == nullptr) return NullArgument(kFn, "done");
  if (tm_status s = CheckDesc(desc); s != TM_OK) return s;
  if (src == nullptr && desc->bytes > 0) return NullArgument(kFn, "src");
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto h = rt.CreateTensor(ToTensorDesc(*desc));
    if (!h.ok()) return h.status();
    absl::Status copied = rt.CopyIn(*h, 0, src, desc->bytes, stream, /*stream_waits=*/false);
    absl::StatusOr<bool> landed = copied.ok() ? rt.CopyDone(*h) : absl::StatusOr<bool>(copied);
    if (!landed.ok()) {
      // No tensor is left behind: a copy that started is not waited for, its memory is freed
      // once it has landed (as tm_tensor_destroy does).
      (void)rt.DestroyTensor(*h);
      return landed.status();
    }
    out->bits = *h;
    *done = *landed ? 1 : 0;
    return absl::OkStatus();
  });
}

TM_API tm_status tm_tensor_destroy(tm_runtime runtime, tm_tensor tensor) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.DestroyTensor(tensor.bits); });
}

TM_API tm_status tm_tensor_bytes(tm_runtime runtime, tm_tensor tensor, uint64_t* bytes) {
  if (bytes == nullptr) return NullArgument("tm_tensor_bytes", "bytes");
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto b = rt.TensorBytes(tensor.bits);
    if (!b.ok()) return b.status();
    *bytes = *b;
    return absl::OkStatus();
  });
}

TM_API tm_status tm_tensor_write(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                 const void* src, uint64_t bytes) {
  if (src == nullptr && bytes > 0) return NullArgument("tm_tensor_write", "src");
  return WithRuntime(runtime,
                     [&](Runtime& rt) { return rt.Write(tensor.bits, offset, src, bytes); });
}

TM_API tm_status tm_tensor_read(tm_runtime runtime, tm_tensor tensor, uint64_t offset, void* dst,
                                uint64_t bytes) {
  if (dst == nullptr && bytes > 0) return NullArgument("tm_tensor_read", "dst");
  return WithRuntime(runtime,
                     [&](Runtime& rt) { return rt.Read(tensor.bits, offset, dst, bytes); });
}

TM_API tm_status tm_tensor_set_recompute(tm_runtime runtime, tm_tensor tensor, tm_recompute_fn fn,
                                         void* user, double cost_seconds) {
  return WithRuntime(
      runtime, [&](Runtime& rt) { return rt.SetRecompute(tensor.bits, fn, user, cost_seconds); });
}

TM_API tm_status tm_tensor_acquire(tm_runtime runtime, tm_tensor tensor, tm_tier tier,
                                   tm_access access, void* stream, void** ptr) {
  if (ptr == nullptr) return NullArgument("tm_tensor_acquire", "ptr");
  *ptr = nullptr;
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto p = rt.Acquire(tensor.bits, tier, access, stream);
    if (!p.ok()) return p.status();
    *ptr = *p;
    return absl::OkStatus();
  });
}

TM_API tm_status tm_tensor_release(tm_runtime runtime, tm_tensor tensor, tm_tier tier) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.Release(tensor.bits, tier); });
}

TM_API tm_status tm_tensor_release_on_stream(tm_runtime runtime, tm_tensor tensor, tm_tier tier,
                                             void* stream) {
  return WithRuntime(runtime,
                     [&](Runtime& rt) { return rt.ReleaseOnStream(tensor.bits, tier, stream); });
}

TM_API tm_status tm_tensor_release_written(tm_runtime runtime, tm_tensor tensor, tm_tier tier,
                                           void* stream) {
  return WithRuntime(runtime,
                     [&](Runtime& rt) { return rt.ReleaseWritten(tensor.bits, tier, stream); });
}

TM_API tm_status tm_tensor_copy_in(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                   const void* src, uint64_t bytes, void* stream) {
  if (src == nullptr && bytes > 0) return NullArgument("tm_tensor_copy_in", "src");
  return WithRuntime(
      runtime, [&](Runtime& rt) { return rt.CopyIn(tensor.bits, offset, src, bytes, stream); });
}

TM_API tm_status tm_tensor_copy_in_async(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                         const void* src, uint64_t bytes, void* stream) {
  if (src == nullptr && bytes > 0) return NullArgument("tm_tensor_copy_in_async", "src");
  return WithRuntime(runtime, [&](Runtime& rt) {
    return rt.CopyIn(tensor.bits, offset, src, bytes, stream, /*stream_waits=*/false);
  });
}

TM_API tm_status tm_tensor_copy_done(tm_runtime runtime, tm_tensor tensor, int32_t* done) {
  if (done == nullptr) return NullArgument("tm_tensor_copy_done", "done");
  *done = 0;
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto d = rt.CopyDone(tensor.bits);
    if (!d.ok()) return d.status();
    *done = *d ? 1 : 0;
    return absl::OkStatus();
  });
}

TM_API tm_status tm_tensor_copy_out(tm_runtime runtime, tm_tensor tensor, uint64_t offset,
                                    void* dst, uint64_t bytes, void* stream) {
  if (dst == nullptr && bytes > 0) return NullArgument("tm_tensor_copy_out", "dst");
  return WithRuntime(
      runtime, [&](Runtime& rt) { return rt.CopyOut(tensor.bits, offset, dst, bytes, stream); });
}

TM_API tm_status tm_tensor_offload(tm_runtime runtime, tm_tensor tensor, tm_tier tier) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.Offload(tensor.bits, tier); });
}

TM_API tm_status tm_tensor_prefetch(tm_runtime runtime, tm_tensor tensor, tm_tier tier) {
  return WithRuntime(runtime, [&](Runtime& rt) { return rt.Prefetch(tensor.bits, tier); });
}

TM_API tm_status tm_tensor_residency(tm_runtime runtime, tm_tensor tensor, uint32_t* mask) {
  if (mask == nullptr) return NullArgument("tm_tensor_residency", "mask");
  return WithRuntime(runtime, [&](Runtime& rt) -> absl::Status {
    auto m = rt.Residency(tensor.bits);
    if (!m.ok()) return m.status();
    *mask = *m;
    return absl::OkStatus();
  });
}

}  // extern "C"
