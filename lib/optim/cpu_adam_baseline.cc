// The portable kernel: one element at a time, each operation rounded on its own (no FMA), in
// the order torch's scalar code takes them. It is the reference the vector kernels are held to,
// and steps the tails they leave.
#include <cmath>

#include "lib/optim/cpu_adam.h"
#include "lib/optim/half.h"

namespace tiermem::optim {

namespace {

float LoadGrad(const AdamSpan& span, size_t i) {
  switch (span.grad_type) {
    case Dtype::kBF16:
      return Bf16ToFloat(static_cast<const uint16_t*>(span.grad)[i]);
    case Dtype::kF16:
      return HalfToFloat(static_cast<const uint16_t*>(span.grad)[i]);
    case Dtype::kF32:
      break;
  }
  return static_cast<const float*>(span.grad)[i];
}

// torch.maximum: NaN when either is NaN.
float NanMax(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return a + b;
  return a > b ? a : b;
}

}  // namespace

void AdamKernelBaseline(const StepScalars& s, const AdamSpan& span, size_t begin, size_t end) {
  const AdamSources src = SourcesOf(span);
  for (size_t i = begin; i < end; ++i) {
    float g = LoadGrad(span, i) * s.grad_scale;
    float p = src.param[i];
    if (s.decoupled) {
      p = p * s.decay;
    } else {
      g = g + s.l2 * p;
    }
    const float m = src.m[i] * s.beta1 + s.one_minus_beta1 * g;
    const float v = src.v[i] * s.beta2 + s.one_minus_beta2 * g * g;
    float vn = v;
    if (s.amsgrad) {
      vn = NanMax(src.max_v[i], v);
      span.max_v[i] = vn;
    }
    const float denom = std::sqrt(vn) / s.bc2_sqrt + s.eps;
    p = p + s.neg_step_size * (m / denom);
    span.param[i] = p;
    span.m[i] = m;
    span.v[i] = v;
    if (span.out != nullptr) {
      if (span.out_type == Dtype::kF32) {
        static_cast<float*>(span.out)[i] = p;
      } else {
        auto* out = static_cast<uint16_t*>(span.out);
        out[i] = span.out_type == Dtype::kF16 ? FloatToHalf(p) : FloatToBf16(p);
      }
    }
  }
}

}  // namespace tiermem::optim
