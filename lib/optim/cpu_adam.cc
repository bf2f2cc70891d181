// Instruction-set dispatch and the per-step scalars.
#include "lib/optim/cpu_adam.h"

#include <cpuid.h>

#include <atomic>
#include <cmath>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"

namespace tiermem::optim {

namespace {

// F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know the name). The OS's
// saving of the YMM state is checked by the AVX2 test beside it.
bool HasF16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

Isa Detect() {
  __builtin_cpu_init();
  // GCC's checks include the OS saving the wider registers (XGETBV).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma") && HasF16c()) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c()) {
    return Isa::kAvx2;
  }
  return Isa::kBaseline;
}

std::atomic<int>& ActiveSlot() {
  static std::atomic<int> active{static_cast<int>(Detect())};
  return active;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kBaseline:
      break;
  }
  return "baseline";
}

Isa DetectedIsa() {
  static const Isa detected = Detect();
  return detected;
}

Isa SetIsaLimit(Isa limit) {
  const Isa use = static_cast<int>(limit) < static_cast<int>(DetectedIsa()) ? limit : DetectedIsa();
  ActiveSlot().store(static_cast<int>(use), std::memory_order_relaxed);
  return use;
}

Isa ActiveIsa() { return static_cast<Isa>(ActiveSlot().load(std::memory_order_relaxed)); }

absl::Status ValidateHyper(const AdamHyper& h) {
  auto bad = [](const char* name, double value, const char* want) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("adam config: %s = %g, want %s", name, value, want));
  };
  if (!(h.lr >= 0.0) || !std::isfinite(h.lr)) return bad("lr", h.lr, "a finite value >= 0");
  if (!(h.beta1 >= 0.0 && h.beta1 < 1.0)) return bad("beta1", h.beta1, "0 <= beta1 < 1");
  if (!(h.beta2 >= 0.0 && h.beta2 < 1.0)) return bad("beta2", h.beta2, "0 <= beta2 < 1");
  if (!(h.eps >= 0.0) || !std::isfinite(h.eps)) return bad("eps", h.eps, "a finite value >= 0");
  if (!(h.weight_decay >= 0.0) || !std::isfinite(h.weight_decay)) {
    return bad("weight_decay", h.weight_decay, "a finite value >= 0");
  }
  return absl::OkStatus();
}

StepScalars MakeStepScalars(const AdamHyper& h, uint64_t step, float grad_scale) {
  // As torch computes them: Python floats (double), each rounded to float where the tensor op
  // takes it as a scalar.
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(h.beta1, t);
  const double bc2 = 1.0 - std::pow(h.beta2, t);
  StepScalars s;
  s.grad_scale = grad_scale;
  s.beta1 = static_cast<float>(h.beta1);
  s.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  s.l2 = static_cast<float>(h.weight_decay);
  s.neg_step_size = static_cast<float>(-(h.lr / bc1));
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  s.eps = static_cast<float>(h.eps);
  s.decoupled = h.decoupled;
  s.amsgrad = h.amsgrad;
  return s;
}

void AdamStepRange(Isa isa, const StepScalars& s, const AdamSpan& span, size_t begin, size_t end) {
  switch (isa) {
    case Isa::kAvx512:
      AdamKernelAvx512(s, span, begin, end);
      return;
    case Isa::kAvx2:
      AdamKernelAvx2(s, span, begin, end);
      return;
    case Isa::kBaseline:
      break;
  }
  AdamKernelBaseline(s, span, begin, end);
}

}  // namespace tiermem::optim
