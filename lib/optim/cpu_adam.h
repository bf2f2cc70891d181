// A fused Adam / AdamW step over fp32 master weights and moments in host memory, vectorized
// with run-time dispatch (AVX-512, AVX2 + FMA + F16C, or a portable baseline). One pass reads the
// parameter, m, v and the gradient and writes the parameter, m and v (28 bytes per parameter
// with fp32 gradients), optionally also the updated parameter rounded to bf16 or fp16.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tiermem::optim {

enum class Dtype { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Instruction sets a kernel exists for, lowest first.
enum class Isa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
const char* IsaName(Isa isa);
// The best instruction set this CPU (and OS) runs.
Isa DetectedIsa();
// Caps the instruction set used (process-wide; tests force each path with it). A cap above what
// the CPU runs is lowered to DetectedIsa(). Returns the instruction set now in use.
Isa SetIsaLimit(Isa limit);
Isa ActiveIsa();

// Hyperparameters, as torch.optim.Adam / AdamW take them.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;  // AdamW: decay the parameter; else Adam: L2 added to the gradient
  bool amsgrad = false;
};
absl::Status ValidateHyper(const AdamHyper& h);

// The per-step scalars of one step, derived in double as torch does, then rounded to float.
struct StepScalars {
  float grad_scale;  // multiplies each gradient first (clipping coefficient; 1: none)
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float decay;          // AdamW: 1 - lr * weight_decay
  float l2;             // Adam: weight_decay added times the parameter to the gradient
  float neg_step_size;  // -lr / (1 - beta1^step)
  float bc2_sqrt;       // sqrt(1 - beta2^step)
  float eps;
  bool decoupled, amsgrad;
};
// `step` counts from 1 (the step being taken).
StepScalars MakeStepScalars(const AdamHyper& h, uint64_t step, float grad_scale);

// One contiguous run of parameters and their state. `max_v` only with amsgrad; `out` (the
// updated parameter as out_type) may be null. Arrays of one span must not overlap. `src`, when
// set, holds the state the step starts from (param, m, v[, max_v] in the same layout as the
// destination, n apart): the step then writes the new state into param, m, v and leaves src as
// it was (the bucket pipeline steps NVMe state into a shadow version this way).
struct AdamSpan {
  float* param = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float* max_v = nullptr;
  const void* grad = nullptr;
  Dtype grad_type = Dtype::kF32;
  void* out = nullptr;
  Dtype out_type = Dtype::kBF16;
  size_t n = 0;
  const float* src = nullptr;
};

// Where the step reads each stream from: `src` when set, else the destination itself.
struct AdamSources {
  const float* param;
  const float* m;
  const float* v;
  const float* max_v;
};
inline AdamSources SourcesOf(const AdamSpan& s) {
  if (s.src == nullptr) return {s.param, s.m, s.v, s.max_v};
  return {s.src, s.src + s.n, s.src + 2 * s.n, s.max_v != nullptr ? s.src + 3 * s.n : nullptr};
}

// Steps elements [begin, end) of `span` on the calling thread with instruction set `isa` (which
// the CPU must run).
void AdamStepRange(Isa isa, const StepScalars& s, const AdamSpan& span, size_t begin, size_t end);

// The kernels, one per instruction set (cpu_adam_*.cc).
void AdamKernelBaseline(const StepScalars& s, const AdamSpan& span, size_t begin, size_t end);
void AdamKernelAvx2(const StepScalars& s, const AdamSpan& span, size_t begin, size_t end);
void AdamKernelAvx512(const StepScalars& s, const AdamSpan& span, size_t begin, size_t end);

}  // namespace tiermem::optim
