// The AVX-512 (F) kernel: 16 floats a step. Only the functions marked TIERMEM_AVX512 are
// compiled for AVX-512F (a target attribute, as in cpu_adam_avx2.cc).
// GCC 12 warns that the _mm512_undefined_*() pass-through operand of its own intrinsics "may be
// used uninitialized" (it is undefined on purpose); nothing of this file's is concerned.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "lib/optim/cpu_adam.h"

// Only the functions marked with this are compiled for the instruction set (GCC and clang).
#define TIERMEM_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

namespace tiermem::optim {

namespace {

TIERMEM_AVX512 inline __m512 LoadGrad16(const AdamSpan& span, size_t i) {
  if (span.grad_type == Dtype::kF32)
    return _mm512_loadu_ps(static_cast<const float*>(span.grad) + i);
  const __m256i h = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(span.grad) + i));
  if (span.grad_type == Dtype::kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Round to nearest even on the low 16 bits; a NaN stays a NaN (made quiet).
TIERMEM_AVX512 inline __m256i ToBf16x16(__m512 p) {
  const __m512i u = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
  const __mmask16 is_nan = _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(is_nan, r, nan));
}

TIERMEM_AVX512 inline __m512 NanMax16(__m512 a, __m512 b) {
  const __mmask16 unordered = _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q);
  return _mm512_mask_blend_ps(unordered, _mm512_max_ps(a, b), _mm512_add_ps(a, b));
}

}  // namespace

TIERMEM_AVX512 void AdamKernelAvx512(const StepScalars& s, const AdamSpan& span, size_t begin,
                                     size_t end) {
  const __m512 scale = _mm512_set1_ps(s.grad_scale), b1 = _mm512_set1_ps(s.beta1),
               omb1 = _mm512_set1_ps(s.one_minus_beta1), b2 = _mm512_set1_ps(s.beta2),
               omb2 = _mm512_set1_ps(s.one_minus_beta2), decay = _mm512_set1_ps(s.decay),
               l2 = _mm512_set1_ps(s.l2), nss = _mm512_set1_ps(s.neg_step_size),
               bc2 = _mm512_set1_ps(s.bc2_sqrt), eps = _mm512_set1_ps(s.eps);
  const AdamSources src = SourcesOf(span);
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 g = _mm512_mul_ps(LoadGrad16(span, i), scale);
    __m512 p = _mm512_loadu_ps(src.param + i);
    if (s.decoupled) {
      p = _mm512_mul_ps(p, decay);
    } else {
      g = _mm512_fmadd_ps(p, l2, g);
    }
    const __m512 m = _mm512_fmadd_ps(g, omb1, _mm512_mul_ps(_mm512_loadu_ps(src.m + i), b1));
    const __m512 v =
        _mm512_fmadd_ps(_mm512_mul_ps(omb2, g), g, _mm512_mul_ps(_mm512_loadu_ps(src.v + i), b2));
    __m512 vn = v;
    if (s.amsgrad) {
      vn = NanMax16(_mm512_loadu_ps(src.max_v + i), v);
      _mm512_storeu_ps(span.max_v + i, vn);
    }
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vn), bc2), eps);
    p = _mm512_fmadd_ps(nss, _mm512_div_ps(m, denom), p);
    _mm512_storeu_ps(span.param + i, p);
    _mm512_storeu_ps(span.m + i, m);
    _mm512_storeu_ps(span.v + i, v);
    if (span.out != nullptr && span.out_type == Dtype::kF32) {
      _mm512_storeu_ps(static_cast<float*>(span.out) + i, p);
    } else if (span.out != nullptr) {
      auto* out = reinterpret_cast<__m256i*>(static_cast<uint16_t*>(span.out) + i);
      _mm256_storeu_si256(out,
                          span.out_type == Dtype::kF16
                              ? _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                              : ToBf16x16(p));
    }
  }
  if (i < end) AdamKernelBaseline(s, span, i, end);
}

}  // namespace tiermem::optim
