#include "lib/optim/adam_optimizer.h"

#include <cmath>
#include <cstdint>
#include <iterator>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"

namespace tiermem::optim {

absl::Status ValidateSpan(const AdamSpan& span, size_t index, bool amsgrad) {
  auto bad = [index](const char* what) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("span %zu: %s", index, what));
  };
  if (span.n == 0) return absl::OkStatus();
  if (span.param == nullptr) return bad("param is NULL");
  if (span.m == nullptr) return bad("exp_avg is NULL");
  if (span.v == nullptr) return bad("exp_avg_sq is NULL");
  if (amsgrad && span.max_v == nullptr) return bad("max_exp_avg_sq is NULL (amsgrad is on)");
  if (span.grad == nullptr) return bad("grad is NULL");
  auto valid = [](Dtype d) { return d == Dtype::kF32 || d == Dtype::kBF16 || d == Dtype::kF16; };
  if (!valid(span.grad_type)) return bad("grad_dtype is not TM_DTYPE_F32, _BF16 or _F16");
  if (span.out != nullptr && !valid(span.out_type)) {
    return bad("param_out_dtype is not TM_DTYPE_F32, _BF16 or _F16");
  }
  if (span.n > (SIZE_MAX / 8)) return bad("count is too large");
  // The arrays of one span are read and written in one pass: two that overlap would step on
  // each other's values (a silently wrong state, not an error the kernel could see).
  struct Range {
    const char* name;
    uintptr_t begin;
    size_t bytes;
  };
  auto bytes_of = [](Dtype d) { return d == Dtype::kF32 ? size_t{4} : size_t{2}; };
  const Range ranges[] = {
      {"param", reinterpret_cast<uintptr_t>(span.param), span.n * 4},
      {"exp_avg", reinterpret_cast<uintptr_t>(span.m), span.n * 4},
      {"exp_avg_sq", reinterpret_cast<uintptr_t>(span.v), span.n * 4},
      {"max_exp_avg_sq", amsgrad ? reinterpret_cast<uintptr_t>(span.max_v) : 0, span.n * 4},
      {"grad", reinterpret_cast<uintptr_t>(span.grad), span.n * bytes_of(span.grad_type)},
      {"param_out", reinterpret_cast<uintptr_t>(span.out), span.n * bytes_of(span.out_type)}};
  for (size_t i = 0; i < std::size(ranges); ++i) {
    for (size_t j = i + 1; j < std::size(ranges); ++j) {
      const Range& a = ranges[i];
      const Range& b = ranges[j];
      if (a.begin == 0 || b.begin == 0) continue;
      if (a.begin < b.begin + b.bytes && b.begin < a.begin + a.bytes) {
        return Error(TM_ERR_INVALID_ARGUMENT,
                     absl::StrFormat("span %zu: %s and %s overlap: each array of a span must "
                                     "have memory of its own",
                                     index, a.name, b.name));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AdamOptimizer>> AdamOptimizer::Create(const AdamHyper& hyper,
                                                                     int threads, int numa_node) {
  if (absl::Status s = ValidateHyper(hyper); !s.ok()) return s;
  std::unique_ptr<AdamOptimizer> opt(new AdamOptimizer());
  opt->hyper_ = hyper;
  auto pool = StreamPool::Create(threads, numa_node);
  if (!pool.ok()) return pool.status();
  opt->pool_ = std::move(*pool);
  return opt;
}

absl::Status AdamOptimizer::SetHyper(const AdamHyper& hyper) {
  if (absl::Status s = ValidateHyper(hyper); !s.ok()) return s;
  hyper_ = hyper;
  return absl::OkStatus();
}

absl::Status AdamOptimizer::StepWith(const AdamHyper& hyper, uint64_t step, float grad_scale,
                                     const AdamSpan* spans, size_t count) {
  if (count > 0 && spans == nullptr) return Error(TM_ERR_INVALID_ARGUMENT, "spans is NULL");
  if (&hyper != &hyper_) {
    if (absl::Status s = ValidateHyper(hyper); !s.ok()) return s;
  }
  if (step == 0) return Error(TM_ERR_INVALID_ARGUMENT, "step = 0, want the step number from 1");
  if (!std::isfinite(grad_scale) || grad_scale < 0.0f) {
    return Error(TM_ERR_INVALID_ARGUMENT,
                 absl::StrFormat("grad_scale = %g, want a finite value >= 0", grad_scale));
  }
  struct Tile {
    size_t span, begin, end;
  };
  std::vector<Tile> tiles;
  for (size_t i = 0; i < count; ++i) {
    if (absl::Status s = ValidateSpan(spans[i], i, hyper.amsgrad); !s.ok()) return s;
    for (size_t b = 0; b < spans[i].n; b += kTileElements) {
      tiles.push_back({i, b, std::min(spans[i].n, b + kTileElements)});
    }
  }
  const StepScalars scalars = MakeStepScalars(hyper, step, grad_scale);
  const Isa isa = ActiveIsa();
  pool_->Run(tiles.size(), [&](size_t t) {
    const Tile& tile = tiles[t];
    AdamStepRange(isa, scalars, spans[tile.span], tile.begin, tile.end);
  });
  return absl::OkStatus();
}

}  // namespace tiermem::optim
