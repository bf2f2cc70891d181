// The AVX2 + FMA + F16C kernel: 8 floats a step. Only the functions marked TIERMEM_AVX2 are
// compiled for those instruction sets (a target attribute, not a file-wide flag: an inline
// function of a header compiled for AVX2 could otherwise be the copy the linker keeps for every
// caller, and the library must run on any x86-64).
#include <immintrin.h>

#include "lib/optim/cpu_adam.h"

// Only the functions marked with this are compiled for the instruction set (GCC and clang).
#define TIERMEM_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace tiermem::optim {

namespace {

TIERMEM_AVX2 inline __m256 LoadGrad8(const AdamSpan& span, size_t i) {
  if (span.grad_type == Dtype::kF32)
    return _mm256_loadu_ps(static_cast<const float*>(span.grad) + i);
  const __m128i h = _mm_loadu_si128(
      reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(span.grad) + i));
  if (span.grad_type == Dtype::kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
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

}  // namespace

TIERMEM_AVX2 void AdamKernelAvx2(const StepScalars& s, const AdamSpan& span, size_t begin,
                                 size_t end) {
  const __m256 scale = _mm256_set1_ps(s.grad_scale), b1 = _mm256_set1_ps(s.beta1),
               omb1 = _mm256_set1_ps(s.one_minus_beta1), b2 = _mm256_set1_ps(s.beta2),
               omb2 = _mm256_set1_ps(s.one_minus_beta2), decay = _mm256_set1_ps(s.decay),
               l2 = _mm256_set1_ps(s.l2), nss = _mm256_set1_ps(s.neg_step_size),
               bc2 = _mm256_set1_ps(s.bc2_sqrt), eps = _mm256_set1_ps(s.eps);
  const AdamSources src = SourcesOf(span);
  size_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 g = _mm256_mul_ps(LoadGrad8(span, i), scale);
    __m256 p = _mm256_loadu_ps(src.param + i);
    if (s.decoupled) {
      p = _mm256_mul_ps(p, decay);
    } else {
      g = _mm256_fmadd_ps(p, l2, g);
    }
    const __m256 m = _mm256_fmadd_ps(g, omb1, _mm256_mul_ps(_mm256_loadu_ps(src.m + i), b1));
    const __m256 v =
        _mm256_fmadd_ps(_mm256_mul_ps(omb2, g), g, _mm256_mul_ps(_mm256_loadu_ps(src.v + i), b2));
    __m256 vn = v;
    if (s.amsgrad) {
      vn = NanMax8(_mm256_loadu_ps(src.max_v + i), v);
      _mm256_storeu_ps(span.max_v + i, vn);
    }
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vn), bc2), eps);
    p = _mm256_fmadd_ps(nss, _mm256_div_ps(m, denom), p);
    _mm256_storeu_ps(span.param + i, p);
    _mm256_storeu_ps(span.m + i, m);
    _mm256_storeu_ps(span.v + i, v);
    if (span.out != nullptr && span.out_type == Dtype::kF32) {
      _mm256_storeu_ps(static_cast<float*>(span.out) + i, p);
    } else if (span.out != nullptr) {
      auto* out = reinterpret_cast<__m128i*>(static_cast<uint16_t*>(span.out) + i);
      _mm_storeu_si128(out, span.out_type == Dtype::kF16
                                ? _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                : ToBf16x8(p));
    }
  }
  if (i < end) AdamKernelBaseline(s, span, i, end);
}

}  // namespace tiermem::optim
