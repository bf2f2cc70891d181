// The CPU Adam kernels against a scalar reference written from torch's per-element order of
// operations, on every instruction set this CPU runs.
//
// Tolerance (docs/c-api.md, "CPU Adam numerics"): the baseline kernel rounds every operation on
// its own in the reference's order, so it must match bit for bit. The vector kernels fuse four
// multiply-adds (the L2 term of Adam, m, v and the parameter update), each dropping one
// rounding of at most u = 2^-24 relative to its inputs. Carried through:
//   |dm| <= 3u * M,  M = |b1 m| + |(1-b1) g|            (two roundings of the sum, one dropped)
//   |dv| <= 4u * V,  V = |b2 v| + |(1-b2) g g|
//   denom = sqrt(v)/c2 + eps moves by <= (2u + 2u) relative, m / denom by <= 3u + 4u + u,
//   |dp| <= 2u * |p| + 12u * lr/c1 * M / denom
// With Adam's L2 term, g itself moves by u * |wd p|, which G = |g| + |wd p| stands for in M and V.
// The test uses these bounds with a factor 2 of slack; a kernel off by one misplaced operation
// exceeds them by orders of magnitude.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "lib/optim/adam_optimizer.h"
#include "lib/optim/cpu_adam.h"
#include "lib/optim/half.h"

namespace tiermem::optim {
namespace {

constexpr double kU = 1.0 / (1 << 24);

struct State {
  std::vector<float> p, m, v, vmax;
  std::vector<uint16_t> g16;
  std::vector<float> g32;
  std::vector<uint16_t> out16;
  std::vector<float> out32;
};

float GradAt(const State& s, Dtype t, size_t i) {
  if (t == Dtype::kF32) return s.g32[i];
  return t == Dtype::kBF16 ? Bf16ToFloat(s.g16[i]) : HalfToFloat(s.g16[i]);
}

// torch's _single_tensor_adam(w), one element, every operation rounded to float.
void Reference(const StepScalars& c, State& s, Dtype gt, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    float g = GradAt(s, gt, i) * c.grad_scale;
    float p = s.p[i];
    if (c.decoupled) {
      p = p * c.decay;  // param.mul_(1 - lr * wd)
    } else {
      const float l2 = c.l2 * p;
      g = g + l2;  // grad.add(param, alpha=wd)
    }
    const float mb = s.m[i] * c.beta1;
    const float gb = c.one_minus_beta1 * g;
    const float m = mb + gb;  // exp_avg.mul_(b1).add_(grad, alpha=1-b1)
    const float vb = s.v[i] * c.beta2;
    const float gg = c.one_minus_beta2 * g * g;
    const float v = vb + gg;  // exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1-b2)
    float vn = v;
    if (c.amsgrad) {
      vn = (std::isnan(s.vmax[i]) || std::isnan(v)) ? std::numeric_limits<float>::quiet_NaN()
                                                    : std::max(s.vmax[i], v);
      s.vmax[i] = vn;
    }
    const float root = std::sqrt(vn);
    const float scaled = root / c.bc2_sqrt;
    const float denom = scaled + c.eps;
    const float q = m / denom;
    const float upd = c.neg_step_size * q;
    s.p[i] = p + upd;  // param.addcdiv_(exp_avg, denom, value=-step_size)
    s.m[i] = m;
    s.v[i] = v;
  }
}

State MakeState(size_t n, Dtype gt, uint32_t seed, bool amsgrad) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  State s;
  s.p.resize(n);
  s.m.resize(n);
  s.v.resize(n);
  if (amsgrad) s.vmax.resize(n);
  s.g32.resize(n);
  s.g16.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = normal(rng);
    s.m[i] = 0.1f * normal(rng);
    s.v[i] = 0.01f * unit(rng) * unit(rng);
    if (amsgrad) s.vmax[i] = s.v[i] * (unit(rng) < 0.5f ? 1.5f : 0.5f);
    const float g = normal(rng) * (unit(rng) < 0.1f ? 1e-3f : 1.0f);
    s.g32[i] = g;
    s.g16[i] = gt == Dtype::kF16 ? FloatToHalf(g) : FloatToBf16(g);
  }
  return s;
}

AdamSpan SpanOf(State& s, Dtype gt, Dtype ot, bool with_out, size_t n) {
  AdamSpan span;
  span.param = s.p.data();
  span.m = s.m.data();
  span.v = s.v.data();
  span.max_v = s.vmax.empty() ? nullptr : s.vmax.data();
  span.grad = gt == Dtype::kF32 ? static_cast<const void*>(s.g32.data()) : s.g16.data();
  span.grad_type = gt;
  span.n = n;
  if (with_out) {
    s.out16.assign(n, 0);
    s.out32.assign(n, 0.0f);
    span.out = ot == Dtype::kF32 ? static_cast<void*>(s.out32.data()) : s.out16.data();
    span.out_type = ot;
  }
  return span;
}

bool SameFloat(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0;
}

// Compares a kernel's result with the reference's, element by element, within the bound above
// (exactly for the baseline).
void ExpectClose(const State& before, const State& got, const State& want, const StepScalars& c,
                 Dtype gt, size_t n, bool exact) {
  int reported = 0;
  for (size_t i = 0; i < n && reported < 5; ++i) {
    const double g = std::abs(GradAt(before, gt, i) * c.grad_scale) +
                     (c.decoupled ? 0.0 : std::abs(c.l2 * before.p[i]));
    const double M = std::abs(c.beta1 * before.m[i]) + std::abs(c.one_minus_beta1 * g);
    const double V = std::abs(c.beta2 * before.v[i]) + std::abs(c.one_minus_beta2 * g * g);
    const double vn = c.amsgrad ? std::max<double>(want.vmax[i], want.v[i]) : want.v[i];
    const double denom = std::sqrt(vn) / c.bc2_sqrt + c.eps;
    const double tol_m = 2 * 3 * kU * M, tol_v = 2 * 4 * kU * V;
    const double tol_p =
        2 * (2 * kU * std::abs(want.p[i]) + 12 * kU * std::abs(c.neg_step_size) * M / denom);
    auto check = [&](const char* what, float a, float b, double tol) {
      const bool ok = exact ? SameFloat(a, b)
                            : (std::isnan(a) ? std::isnan(b)
                                             : (std::isinf(a) ? a == b : std::abs(a - b) <= tol));
      if (!ok && reported++ < 5) {
        ADD_FAILURE() << what << "[" << i << "] = " << a << ", reference " << b << " (tolerance "
                      << (exact ? 0.0 : tol) << ")";
      }
    };
    check("param", got.p[i], want.p[i], tol_p);
    check("exp_avg", got.m[i], want.m[i], tol_m);
    check("exp_avg_sq", got.v[i], want.v[i], tol_v);
    if (c.amsgrad) check("max_exp_avg_sq", got.vmax[i], want.vmax[i], tol_v);
  }
}

// The parameter copy is the kernel's own fp32 result rounded, bit for bit.
void ExpectOutIsRounded(const State& got, Dtype ot, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (ot == Dtype::kF32) {
      ASSERT_TRUE(SameFloat(got.out32[i], got.p[i])) << i;
      continue;
    }
    const uint16_t want = ot == Dtype::kF16 ? FloatToHalf(got.p[i]) : FloatToBf16(got.p[i]);
    ASSERT_EQ(got.out16[i], want) << "element " << i << " p=" << got.p[i];
  }
}

class Kernel : public ::testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (static_cast<int>(GetParam()) > static_cast<int>(DetectedIsa())) {
      GTEST_SKIP() << "this CPU does not run " << IsaName(GetParam())
                   << " (best: " << IsaName(DetectedIsa()) << ")";
    }
    ASSERT_EQ(SetIsaLimit(GetParam()), GetParam());
  }
  void TearDown() override { SetIsaLimit(Isa::kAvx512); }
};

AdamHyper Hyper(bool adamw, bool amsgrad) {
  AdamHyper h;
  h.lr = 1e-2;
  h.weight_decay = 0.1;
  h.decoupled = adamw;
  h.amsgrad = amsgrad;
  return h;
}

// Every gradient type x every output, Adam and AdamW, amsgrad or not, odd lengths.
TEST_P(Kernel, EveryDtypePairAgainstTheReference) {
  const size_t lengths[] = {1, 7, 1023, 3 * kTileElements + 37};  // the last: no vector multiple
  const Dtype grads[] = {Dtype::kF32, Dtype::kBF16, Dtype::kF16};
  struct Out {
    bool with;
    Dtype type;
  };
  const Out outs[] = {
      {false, Dtype::kF32}, {true, Dtype::kF32}, {true, Dtype::kBF16}, {true, Dtype::kF16}};
  auto opt = AdamOptimizer::Create(Hyper(true, false), 3, -1);
  ASSERT_TRUE(opt.ok()) << opt.status();
  uint32_t seed = 1;
  for (bool adamw : {true, false}) {
    for (bool amsgrad : {false, true}) {
      ASSERT_TRUE((*opt)->SetHyper(Hyper(adamw, amsgrad)).ok());
      for (size_t n : lengths) {
        for (Dtype gt : grads) {
          for (const Out& o : outs) {
            SCOPED_TRACE(testing::Message()
                         << "adamw=" << adamw << " amsgrad=" << amsgrad << " n=" << n
                         << " grad=" << int(gt) << " out=" << (o.with ? int(o.type) : -1));
            const State before = MakeState(n, gt, seed++, amsgrad);
            State got = before, want = before;
            const uint64_t step = 3;
            const float scale = 0.75f;
            const AdamSpan span = SpanOf(got, gt, o.type, o.with, n);
            ASSERT_TRUE((*opt)->Step(step, scale, &span, 1).ok());
            const StepScalars c = MakeStepScalars((*opt)->hyper(), step, scale);
            Reference(c, want, gt, n);
            ExpectClose(before, got, want, c, gt, n, GetParam() == Isa::kBaseline);
            if (o.with) ExpectOutIsRounded(got, o.type, n);
          }
        }
      }
    }
  }
}

TEST_P(Kernel, NanAndInfGradients) {
  const size_t n = 1000;
  for (Dtype gt : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
    State before = MakeState(n, gt, 99, true);
    const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
    for (size_t i = 0; i < n; i += 17) {
      const float x = specials[(i / 17) % 3];
      before.g32[i] = x;
      before.g16[i] = gt == Dtype::kF16 ? FloatToHalf(x) : FloatToBf16(x);
    }
    auto opt = AdamOptimizer::Create(Hyper(true, true), 2, -1);
    ASSERT_TRUE(opt.ok());
    State got = before, want = before;
    const AdamSpan span = SpanOf(got, gt, Dtype::kBF16, true, n);
    ASSERT_TRUE((*opt)->Step(1, 1.0f, &span, 1).ok());
    const StepScalars c = MakeStepScalars((*opt)->hyper(), 1, 1.0f);
    Reference(c, want, gt, n);
    ExpectClose(before, got, want, c, gt, n, GetParam() == Isa::kBaseline);
    ExpectOutIsRounded(got, Dtype::kBF16, n);
    // As in torch: a NaN or infinite gradient makes its parameter NaN; the others stay finite.
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(std::isnan(got.p[i]), i % 17 == 0) << i;
      EXPECT_EQ(std::isnan(Bf16ToFloat(got.out16[i])), i % 17 == 0) << i;
    }
  }
}

// Parameters at the edges of bf16 and fp16: overflow to Inf, subnormals, ties, NaN, Inf.
TEST_P(Kernel, RoundedOutputsAtTheEdges) {
  const float edges[] = {65519.0f,
                         65520.0f,
                         65536.0f,
                         1e-7f,
                         5.96e-8f,
                         2.98e-8f,
                         3e-8f,
                         -0.0f,
                         1.0f + 1.0f / 256,
                         1.0f + 3.0f / 256,
                         3.4e38f,
                         -3.4e38f,
                         1e-40f,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN()};
  const size_t n = 16 * 3 + 5;
  AdamHyper h = Hyper(true, false);
  h.lr = 0.0;  // the parameter passes through unchanged
  auto opt = AdamOptimizer::Create(h, 1, -1);
  ASSERT_TRUE(opt.ok());
  for (Dtype ot : {Dtype::kBF16, Dtype::kF16}) {
    State s = MakeState(n, Dtype::kF32, 5, false);
    for (size_t i = 0; i < n; ++i) s.p[i] = edges[i % std::size(edges)];
    const AdamSpan span = SpanOf(s, Dtype::kF32, ot, true, n);
    ASSERT_TRUE((*opt)->Step(1, 1.0f, &span, 1).ok());
    ExpectOutIsRounded(s, ot, n);
  }
}

TEST_P(Kernel, MoreThreadsThanCores) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const int threads = static_cast<int>(4 * cores + 3);
  const size_t n = 5 * kTileElements + 11;
  auto many = AdamOptimizer::Create(Hyper(true, false), threads, -1);
  auto one = AdamOptimizer::Create(Hyper(true, false), 1, -1);
  ASSERT_TRUE(many.ok() && one.ok());
  EXPECT_EQ((*many)->threads(), threads);
  const State before = MakeState(n, Dtype::kBF16, 7, false);
  State a = before, b = before;
  for (uint64_t step = 1; step <= 3; ++step) {
    const AdamSpan sa = SpanOf(a, Dtype::kBF16, Dtype::kBF16, true, n);
    const AdamSpan sb = SpanOf(b, Dtype::kBF16, Dtype::kBF16, true, n);
    ASSERT_TRUE((*many)->Step(step, 1.0f, &sa, 1).ok());
    ASSERT_TRUE((*one)->Step(step, 1.0f, &sb, 1).ok());
  }
  // Same kernel, same elements: the split into tiles changes nothing.
  EXPECT_EQ(std::memcmp(a.p.data(), b.p.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(a.m.data(), b.m.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(a.v.data(), b.v.data(), n * 4), 0);
  EXPECT_NE(std::memcmp(a.p.data(), before.p.data(), n * 4), 0) << "nothing stepped";
}

INSTANTIATE_TEST_SUITE_P(Isas, Kernel, ::testing::Values(Isa::kBaseline, Isa::kAvx2, Isa::kAvx512),
                         [](const auto& info) { return std::string(IsaName(info.param)); });

TEST(Conversions, Bf16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808000u)), 0x3f80) << "tie to even (down)";
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f818000u)), 0x3f82) << "tie to even (up)";
  EXPECT_EQ(FloatToBf16(BitsFloat(0x3f808001u)), 0x3f81) << "above the tie";
  EXPECT_EQ(FloatToBf16(BitsFloat(0x7f7fffffu)), 0x7f80) << "largest float rounds to Inf";
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(BitsFloat(0x7f800001u)))))
      << "a NaN whose payload is in the low bits stays a NaN";
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(BitsFloat(0xffc00000u)))));
}

TEST(Conversions, HalfRoundTripsAndRounds) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << std::hex << h;
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
    // The midpoint to the next half up rounds to the even one of the two.
    if ((h & 0x7fffu) < 0x7bffu) {
      const double next = HalfToFloat(static_cast<uint16_t>(h + 1));
      const float mid = static_cast<float>((static_cast<double>(f) + next) / 2);
      const uint16_t even = (h & 1u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
      ASSERT_EQ(FloatToHalf(mid), even) << std::hex << h;
    }
  }
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00) << "rounds up to Inf";
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e-8f), 0x0000) << "below half the smallest subnormal";
}

TEST(Isa, LimitIsCappedByTheCpu) {
  EXPECT_EQ(SetIsaLimit(Isa::kBaseline), Isa::kBaseline);
  EXPECT_EQ(ActiveIsa(), Isa::kBaseline);
  EXPECT_EQ(SetIsaLimit(Isa::kAvx512), DetectedIsa());
  EXPECT_EQ(ActiveIsa(), DetectedIsa());
}

TEST(Validation, BadSpansAndHyperparametersAreNamed) {
  auto opt = AdamOptimizer::Create(Hyper(true, true), 1, -1);
  ASSERT_TRUE(opt.ok());
  State s = MakeState(8, Dtype::kF32, 3, true);
  AdamSpan span = SpanOf(s, Dtype::kF32, Dtype::kF32, false, 8);
  span.max_v = nullptr;
  absl::Status st = (*opt)->Step(1, 1.0f, &span, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("max_exp_avg_sq"), std::string::npos) << st;
  span = SpanOf(s, Dtype::kF32, Dtype::kF32, false, 8);
  span.grad_type = static_cast<Dtype>(7);
  st = (*opt)->Step(1, 1.0f, &span, 1);
  EXPECT_NE(st.message().find("grad_dtype"), std::string::npos) << st;
  EXPECT_NE((*opt)->Step(0, 1.0f, &span, 1).message().find("step"), std::string::npos);
  AdamHyper h;
  h.beta2 = 1.0;
  st = (*opt)->SetHyper(h);
  EXPECT_NE(st.message().find("beta2"), std::string::npos) << st;
  EXPECT_FALSE(AdamOptimizer::Create(Hyper(true, false), 0, -1).ok());
  EXPECT_EQ(s.p, MakeState(8, Dtype::kF32, 3, true).p) << "a rejected step changed nothing";
}

}  // namespace
}  // namespace tiermem::optim
