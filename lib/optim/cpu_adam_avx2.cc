// The AVX2 + FMA + F16C kernel: 8 floats a step. Only the functions marked TIERMEM_AVX2 are
// compiled for those instruction sets (a target attribute, not a file-wide flag: an inline
// function of a header compiled for AVX2 could otherwise be the copy the linker keeps for every
// caller, and the library must run on any x86-64).
#include <immintrin.h>

#include <cstdint>

#include "lib/optim/cpu_adam.h"

// Only the functions marked with this are compiled for the instruction set (GCC and clang).
#define TIERMEM_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tiermem::optim {

namespace {

template <Dtype kGrad>
TIERMEM_AVX2 inline __m256 LoadGrad8(const void* grad, size_t i) {
  if constexpr (kGrad == Dtype::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(grad) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(grad) + i));
    if constexpr (kGrad == Dtype::kF16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Round to nearest even on the low 16 bits; a NaN stays a NaN (made quiet).
TIERMEM_AVX2 inline __m128i ToBf16x8(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, nan, is_nan);
  // Values are below 2^16: the saturating pack keeps them; it packs within 128-bit lanes.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xd8);
  return _mm256_castsi256_si128(packed);
}

TIERMEM_AVX2 inline __m256 NanMax8(__m256 a, __m256 b) {
  const __m256 mx = _mm256_max_ps(a, b);
  return _mm256_blendv_ps(mx, _mm256_add_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
}

// The updated parameter's copy: none, or fp32, bf16 or fp16.
enum class Out { kNone, kF32, kBF16, kF16 };

// Each stream read is prefetched this far ahead, as in cpu_adam_avx512.cc (1 KiB of fp32; the
// distance was measured with the AVX-512 kernel, the streams are the same).
constexpr size_t kAhead = 256;

TIERMEM_AVX2 inline void Ahead(const void* stream, size_t bytes) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(stream) + bytes),
               _MM_HINT_T0);
}

// The vector loop over [begin, end) in steps of 8; returns where it stopped (the tail is the
// baseline's). As in cpu_adam_avx512.cc: types as template arguments, pointers and flags as
// locals, so that nothing of the span is read again at each step.
template <Dtype kGrad, Out kOut>
TIERMEM_AVX2 size_t Loop(const StepScalars& s, const AdamSpan& span, size_t begin, size_t end) {
  const __m256 scale = _mm256_set1_ps(s.grad_scale), b1 = _mm256_set1_ps(s.beta1),
               omb1 = _mm256_set1_ps(s.one_minus_beta1), b2 = _mm256_set1_ps(s.beta2),
               omb2 = _mm256_set1_ps(s.one_minus_beta2), decay = _mm256_set1_ps(s.decay),
               l2 = _mm256_set1_ps(s.l2), nss = _mm256_set1_ps(s.neg_step_size),
               bc2 = _mm256_set1_ps(s.bc2_sqrt), eps = _mm256_set1_ps(s.eps);
  const bool decoupled = s.decoupled, amsgrad = s.amsgrad;
  const AdamSources src = SourcesOf(span);
  const float *const src_p = src.param, *const src_m = src.m, *const src_v = src.v,
                     *const src_vmax = src.max_v;
  float *const dst_p = span.param, *const dst_m = span.m, *const dst_v = span.v,
               *const dst_vmax = span.max_v;
  const void* const grad = span.grad;
  void* const out = span.out;
  constexpr size_t kGradBytes = kGrad == Dtype::kF32 ? 4 : 2;
  size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    if (i % 16 == begin % 16) {  // once a 64-byte line of fp32
      Ahead(src_p + i, kAhead * 4);
      Ahead(src_m + i, kAhead * 4);
      Ahead(src_v + i, kAhead * 4);
      Ahead(static_cast<const char*>(grad) + i * kGradBytes, kAhead * kGradBytes);
      if (amsgrad) Ahead(src_vmax + i, kAhead * 4);
    }
    __m256 g = _mm256_mul_ps(LoadGrad8<kGrad>(grad, i), scale);
    __m256 p = _mm256_loadu_ps(src_p + i);
    if (decoupled) {
      p = _mm256_mul_ps(p, decay);
    } else {
      g = _mm256_fmadd_ps(p, l2, g);
    }
    const __m256 m = _mm256_fmadd_ps(g, omb1, _mm256_mul_ps(_mm256_loadu_ps(src_m + i), b1));
    const __m256 v =
        _mm256_fmadd_ps(_mm256_mul_ps(omb2, g), g, _mm256_mul_ps(_mm256_loadu_ps(src_v + i), b2));
    __m256 vn = v;
    if (amsgrad) {
      vn = NanMax8(_mm256_loadu_ps(src_vmax + i), v);
      _mm256_storeu_ps(dst_vmax + i, vn);
    }
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vn), bc2), eps);
    p = _mm256_fmadd_ps(nss, _mm256_div_ps(m, denom), p);
    _mm256_storeu_ps(dst_p + i, p);
    _mm256_storeu_ps(dst_m + i, m);
    _mm256_storeu_ps(dst_v + i, v);
    if constexpr (kOut == Out::kF32) {
      _mm256_storeu_ps(static_cast<float*>(out) + i, p);
    } else if constexpr (kOut != Out::kNone) {
      auto* o = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i);
      if constexpr (kOut == Out::kF16) {
        _mm_storeu_si128(o, _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      } else {
        _mm_storeu_si128(o, ToBf16x8(p));
      }
    }
  }
  return i;
}

template <Dtype kGrad>
TIERMEM_AVX2 size_t LoopFor(const StepScalars& s, const AdamSpan& span, size_t begin, size_t end) {
  if (span.out == nullptr) return Loop<kGrad, Out::kNone>(s, span, begin, end);
  switch (span.out_type) {
    case Dtype::kF32:
      return Loop<kGrad, Out::kF32>(s, span, begin, end);
    case Dtype::kF16:
      return Loop<kGrad, Out::kF16>(s, span, begin, end);
    case Dtype::kBF16:
      break;
  }
  return Loop<kGrad, Out::kBF16>(s, span, begin, end);
}

}  // namespace

TIERMEM_AVX2 void AdamKernelAvx2(const StepScalars& s, const AdamSpan& span, size_t begin,
                                 size_t end) {
  size_t i = begin;
  switch (span.grad_type) {
    case Dtype::kF32:
      i = LoopFor<Dtype::kF32>(s, span, begin, end);
      break;
    case Dtype::kBF16:
      i = LoopFor<Dtype::kBF16>(s, span, begin, end);
      break;
    case Dtype::kF16:
      i = LoopFor<Dtype::kF16>(s, span, begin, end);
      break;
  }
  if (i < end) AdamKernelBaseline(s, span, i, end);
}

}  // namespace tiermem::optim
