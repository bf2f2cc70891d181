// The CPU Adam's C API: arguments named in errors, handles checked, host spans and tiermem
// tensors (DRAM and NVMe) stepped alike.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"
#include "tiermem/tiermem.h"

namespace {

using tiermem::testing::SmallConfig;
using tiermem::testing::TempDir;

std::string LastError() { return tm_last_error(); }

// An optimizer made with `rt` on `threads` threads; the zero handle (and a failure) if not.
tm_adam Adam(tm_runtime rt, int threads) {
  tm_adam_config c = TM_ADAM_CONFIG_INIT;
  c.threads = threads;
  tm_adam adam{0};
  EXPECT_EQ(tm_adam_create(rt, &c, &adam), TM_OK) << LastError();
  return adam;
}

// A DRAM-homed state tensor for `count` parameters (master | exp_avg | exp_avg_sq, fp32); the
// zero handle (and a failure) if not.
tm_tensor StateTensor(tm_runtime rt, uint64_t count) {
  tm_tensor_desc d = TM_TENSOR_DESC_INIT;
  d.bytes = 12 * count;
  d.cls = TM_CLASS_OPTIMIZER_STATE;
  d.home_tier = TM_TIER_DRAM;
  tm_tensor t{0};
  EXPECT_EQ(tm_tensor_create(rt, &d, &t), TM_OK) << LastError();
  return t;
}

TEST(OptimCApi, BadArgumentsAreNamed) {
  tm_adam adam{0};
  EXPECT_EQ(tm_adam_create({0}, nullptr, &adam), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("config"), std::string::npos) << LastError();
  tm_adam_config c = TM_ADAM_CONFIG_INIT;
  EXPECT_EQ(tm_adam_create({0}, &c, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("out"), std::string::npos) << LastError();
  c.beta1 = 1.5;
  EXPECT_EQ(tm_adam_create({0}, &c, &adam), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("beta1"), std::string::npos) << LastError();
  c = TM_ADAM_CONFIG_INIT;
  c.threads = -2;
  EXPECT_EQ(tm_adam_create({0}, &c, &adam), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("threads"), std::string::npos) << LastError();
  c = TM_ADAM_CONFIG_INIT;
  c.numa_node = 1000000;  // no machine has it
  EXPECT_EQ(tm_adam_create({0}, &c, &adam), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("numa_node = 1000000: no such NUMA node"), std::string::npos)
      << LastError();
  c = TM_ADAM_CONFIG_INIT;
  c.struct_size = 8;
  EXPECT_EQ(tm_adam_create({0}, &c, &adam), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("struct_size"), std::string::npos) << LastError();
  c = TM_ADAM_CONFIG_INIT;
  c.threads = 2;
  ASSERT_EQ(tm_adam_create({0}, &c, &adam), TM_OK) << LastError();
  int32_t threads = 0;
  ASSERT_EQ(tm_adam_threads(adam, &threads), TM_OK);
  EXPECT_EQ(threads, 2);
  float x = 0;
  tm_adam_span span = {&x, &x, &x, nullptr, nullptr, TM_DTYPE_F32, nullptr, TM_DTYPE_F32, 1};
  EXPECT_EQ(tm_adam_step(adam, 1, 1.0f, &span, 1), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("span 0: grad is NULL"), std::string::npos) << LastError();
  EXPECT_EQ(tm_adam_step(adam, 1, 1.0f, nullptr, 1), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("spans"), std::string::npos) << LastError();
  // Arrays of one span that overlap are refused before anything is written.
  {
    std::vector<float> buf(64, 1.0f), g(16, 0.5f);
    const std::vector<float> before = buf;
    float* b = buf.data();
    struct Case {
      tm_adam_span s;
      const char* names;
    };
    for (const Case& k :
         {Case{{b, b, b + 16, nullptr, g.data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32, 16},
               "param and exp_avg overlap"},
          Case{{b, b + 16, b + 24, nullptr, g.data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32, 16},
               "exp_avg and exp_avg_sq overlap"},
          Case{{b, b + 16, b + 32, nullptr, b + 8, TM_DTYPE_F32, nullptr, TM_DTYPE_F32, 16},
               "param and grad overlap"},
          Case{{b, b + 16, b + 32, nullptr, g.data(), TM_DTYPE_F32, b + 20, TM_DTYPE_BF16, 16},
               "exp_avg and param_out overlap"}}) {
      EXPECT_EQ(tm_adam_step(adam, 1, 1.0f, &k.s, 1), TM_ERR_INVALID_ARGUMENT) << k.names;
      EXPECT_NE(LastError().find(k.names), std::string::npos) << LastError();
    }
    EXPECT_EQ(buf, before) << "a refused step wrote";
    const tm_adam_span apart = {b,      b + 16,       b + 32, nullptr, g.data(), TM_DTYPE_F32,
                                b + 48, TM_DTYPE_F32, 16};
    EXPECT_EQ(tm_adam_step(adam, 1, 1.0f, &apart, 1), TM_OK) << LastError();
  }
  EXPECT_EQ(tm_adam_step(adam, 1, -1.0f, &span, 0), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("grad_scale"), std::string::npos) << LastError();
  tm_adam_bucket bucket = {{1}, 1, &x, TM_DTYPE_F32, nullptr, TM_DTYPE_F32};
  EXPECT_EQ(tm_adam_step_buckets(adam, 1, 1.0f, &bucket, 1, nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("without a runtime"), std::string::npos) << LastError();
  EXPECT_EQ(tm_optim_set_isa_limit(static_cast<tm_optim_isa>(9), nullptr), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("limit"), std::string::npos) << LastError();
  ASSERT_EQ(tm_adam_destroy(adam), TM_OK);
  EXPECT_EQ(tm_adam_destroy(adam), TM_ERR_INVALID_HANDLE) << "destroyed twice";
  EXPECT_EQ(tm_adam_step(adam, 1, 1.0f, &span, 1), TM_ERR_INVALID_HANDLE);
  EXPECT_EQ(tm_adam_destroy({0}), TM_ERR_INVALID_HANDLE);
}

TEST(OptimCApi, IsaCanBeForcedDown) {
  tm_optim_isa detected, active;
  ASSERT_EQ(tm_optim_isa_get(&detected, &active), TM_OK);
  EXPECT_EQ(active, detected);
  ASSERT_EQ(tm_optim_set_isa_limit(TM_OPTIM_ISA_BASELINE, &active), TM_OK);
  EXPECT_EQ(active, TM_OPTIM_ISA_BASELINE);
  ASSERT_EQ(tm_optim_set_isa_limit(TM_OPTIM_ISA_AVX512, &active), TM_OK);
  EXPECT_EQ(active, detected);
}

// Buckets in tensors (one in DRAM, others homed on NVMe) step as the same spans in host memory.
// Element counts near 2^64, where 12 or 16 bytes per element wrap around: each is refused by
// name before anything is read or stepped, in a bucket alone and in the second group of a
// group step, and a group with buckets NULL but a count is refused too.
TEST(OptimCApi, CountsNear2To64AreRefusedBeforeAnyStep) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt{0};
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << LastError();
  const tm_adam adam = Adam(rt, 1);
  const tm_tensor t = StateTensor(rt, 64);
  ASSERT_NE(adam.bits, 0u);
  ASSERT_NE(t.bits, 0u);
  std::vector<float> state(3 * 64, 1.0f), grad(64, 0.5f);
  ASSERT_EQ(tm_tensor_write(rt, t, 0, state.data(), 12 * 64), TM_OK) << LastError();
  const tm_adam_bucket good = {t, 64, grad.data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32};
  for (uint64_t count : {UINT64_MAX, UINT64_MAX / 12 + 1, (uint64_t{1} << 62) + 1}) {
    tm_adam_bucket huge = good;
    huge.count = count;
    size_t done = 99;
    EXPECT_EQ(tm_adam_step_buckets(adam, 1, 1.0f, &huge, 1, &done), TM_ERR_INVALID_ARGUMENT)
        << count;
    EXPECT_NE(LastError().find("count"), std::string::npos) << LastError();
    EXPECT_EQ(done, 0u);
    tm_adam_group groups[2] = {{nullptr, 1, &good, 1}, {nullptr, 1, &huge, 1}};
    EXPECT_EQ(tm_adam_step_groups(adam, 1.0f, groups, 2, &done), TM_ERR_INVALID_ARGUMENT);
    EXPECT_NE(LastError().find("group 1"), std::string::npos) << LastError();
    EXPECT_EQ(done, 0u);
  }
  tm_adam_group no_buckets = {nullptr, 1, nullptr, 3};
  size_t done = 99;
  EXPECT_EQ(tm_adam_step_groups(adam, 1.0f, &no_buckets, 1, &done), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("buckets"), std::string::npos) << LastError();
  std::vector<float> back(3 * 64);
  ASSERT_EQ(tm_tensor_read(rt, t, 0, back.data(), 12 * 64), TM_OK);
  EXPECT_EQ(back, state) << "a refused step changed the state";
  ASSERT_EQ(tm_adam_destroy(adam), TM_OK);
  ASSERT_EQ(tm_runtime_destroy(rt), TM_OK);
}

// An optimizer outlives the runtime it was made with: host spans still step (PyTorch's CPUAdam
// steps its state this way once the runtime's close brought it home), its bucket calls name the
// closed runtime, and destroy frees it.
TEST(OptimCApi, StepsHostSpansAfterItsRuntimeIsDestroyed) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt{0};
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << LastError();
  const tm_adam adam = Adam(rt, 2);
  const tm_tensor t = StateTensor(rt, 64);
  ASSERT_NE(adam.bits, 0u);
  ASSERT_NE(t.bits, 0u);
  ASSERT_EQ(tm_runtime_destroy(rt), TM_OK) << LastError();
  std::vector<float> p(4096, 1.0f), m(4096, 0.0f), v(4096, 0.0f), g(4096, 0.5f);
  tm_adam_span span = {p.data(),     m.data(), v.data(),     nullptr, g.data(),
                       TM_DTYPE_F32, nullptr,  TM_DTYPE_F32, p.size()};
  ASSERT_EQ(tm_adam_step(adam, 1, 1.0f, &span, 1), TM_OK) << LastError();
  ASSERT_EQ(tm_adam_step(adam, 2, 1.0f, &span, 1), TM_OK) << LastError();
  for (float x : p) ASSERT_LT(x, 1.0f);
  std::vector<float> grad(64, 0.5f);
  const tm_adam_bucket bucket = {t, 64, grad.data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32};
  size_t done = 99;
  EXPECT_EQ(tm_adam_step_buckets(adam, 1, 1.0f, &bucket, 1, &done), TM_ERR_INVALID_HANDLE);
  EXPECT_EQ(done, 0u);
  ASSERT_EQ(tm_adam_destroy(adam), TM_OK) << LastError();
}

TEST(OptimCApi, TensorBucketsMatchHostSpans) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt{0};
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << LastError();
  tm_adam_config c = TM_ADAM_CONFIG_INIT;
  c.lr = 3e-3;
  c.amsgrad = 1;
  c.threads = 2;
  tm_adam on_rt{0}, host{0};
  ASSERT_EQ(tm_adam_create(rt, &c, &on_rt), TM_OK) << LastError();
  ASSERT_EQ(tm_adam_create({0}, &c, &host), TM_OK) << LastError();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  const size_t sizes[] = {1, 1023, 100003};
  std::vector<std::vector<float>> state, grads;
  std::vector<tm_tensor> tensors;
  for (size_t b = 0; b < 3; ++b) {
    const size_t n = sizes[b];
    std::vector<float> s(4 * n);
    for (size_t i = 0; i < n; ++i) {
      s[i] = normal(rng);
      s[n + i] = 0.1f * normal(rng);
      s[2 * n + i] = s[3 * n + i] = 0.01f * std::abs(normal(rng));
    }
    std::vector<float> g(n);
    for (float& x : g) x = normal(rng);
    tm_tensor_desc d = TM_TENSOR_DESC_INIT;
    d.bytes = 16 * n;
    d.cls = TM_CLASS_OPTIMIZER_STATE;
    d.home_tier = b == 0 ? TM_TIER_DRAM : TM_TIER_NVME;
    tm_tensor t{0};
    ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK) << LastError();
    ASSERT_EQ(tm_tensor_write(rt, t, 0, s.data(), d.bytes), TM_OK) << LastError();
    tensors.push_back(t);
    state.push_back(std::move(s));
    grads.push_back(std::move(g));
  }
  for (uint64_t step = 1; step <= 2; ++step) {
    std::vector<tm_adam_bucket> buckets;
    std::vector<tm_adam_span> spans;
    for (size_t b = 0; b < 3; ++b) {
      const size_t n = sizes[b];
      float* s = state[b].data();
      buckets.push_back({tensors[b], n, grads[b].data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32});
      spans.push_back({s, s + n, s + 2 * n, s + 3 * n, grads[b].data(), TM_DTYPE_F32, nullptr,
                       TM_DTYPE_F32, n});
    }
    size_t done = 99;
    ASSERT_EQ(tm_adam_step_buckets(on_rt, step, 0.5f, buckets.data(), 3, &done), TM_OK)
        << LastError();
    EXPECT_EQ(done, 3u);
    ASSERT_EQ(tm_adam_step(host, step, 0.5f, spans.data(), 3), TM_OK) << LastError();
    for (size_t b = 0; b < 3; ++b) {
      std::vector<float> back(4 * sizes[b]);
      ASSERT_EQ(tm_tensor_read(rt, tensors[b], 0, back.data(), back.size() * 4), TM_OK);
      EXPECT_EQ(std::memcmp(back.data(), state[b].data(), back.size() * 4), 0) << b;
    }
  }
  // Step 3 in two groups: bucket 0 with a config of its own, buckets 1 and 2 with the
  // optimizer's (NULL), as host spans stepped under each config.
  tm_adam_config own = c;
  own.lr = 1e-2;
  own.weight_decay = 0.2;
  std::vector<tm_adam_bucket> buckets;
  std::vector<tm_adam_span> spans;
  for (size_t b = 0; b < 3; ++b) {
    const size_t n = sizes[b];
    float* s = state[b].data();
    buckets.push_back({tensors[b], n, grads[b].data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32});
    spans.push_back(
        {s, s + n, s + 2 * n, s + 3 * n, grads[b].data(), TM_DTYPE_F32, nullptr, TM_DTYPE_F32, n});
  }
  tm_adam_group groups[2] = {{&own, 3, buckets.data(), 1}, {nullptr, 3, buckets.data() + 1, 2}};
  size_t done = 99;
  EXPECT_EQ(tm_adam_step_groups(on_rt, 1.0f, nullptr, 2, &done), TM_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(done, 0u);
  tm_adam_config bad = own;
  bad.struct_size = 8;
  tm_adam_group bad_groups[2] = {groups[0], {&bad, 3, buckets.data() + 1, 2}};
  EXPECT_EQ(tm_adam_step_groups(on_rt, 1.0f, bad_groups, 2, &done), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("group 1"), std::string::npos) << LastError();
  ASSERT_EQ(tm_adam_step_groups(on_rt, 1.0f, groups, 2, &done), TM_OK) << LastError();
  EXPECT_EQ(done, 3u);
  ASSERT_EQ(tm_adam_set_hyper(host, &own), TM_OK);
  ASSERT_EQ(tm_adam_step(host, 3, 1.0f, spans.data(), 1), TM_OK) << LastError();
  ASSERT_EQ(tm_adam_set_hyper(host, &c), TM_OK);
  ASSERT_EQ(tm_adam_step(host, 3, 1.0f, spans.data() + 1, 2), TM_OK) << LastError();
  for (size_t b = 0; b < 3; ++b) {
    std::vector<float> back(4 * sizes[b]);
    ASSERT_EQ(tm_tensor_read(rt, tensors[b], 0, back.data(), back.size() * 4), TM_OK);
    EXPECT_EQ(std::memcmp(back.data(), state[b].data(), back.size() * 4), 0) << "group step " << b;
  }
  uint32_t mask = 0;
  ASSERT_EQ(tm_tensor_residency(rt, tensors[2], &mask), TM_OK);
  // Back on NVMe (DRAM may keep a clean copy: TIERMEM_DRAM_INCLUSIVE), never in HBM.
  EXPECT_EQ(mask & ~TM_TIER_BIT(TM_TIER_DRAM), TM_TIER_BIT(TM_TIER_NVME))
      << "state homed on NVMe went back there";
  EXPECT_EQ(tm_adam_destroy(on_rt), TM_OK);
  EXPECT_EQ(tm_adam_destroy(host), TM_OK);
  EXPECT_EQ(tm_runtime_destroy(rt), TM_OK);
}

// The step in two halves (for ranks that agree on its outcome): a prepared step changes nothing
// until its commit; an abort leaves every state and param_out as before, and a prepare again
// then a commit give what one tm_adam_step_groups gives. While a step waits, another step of it
// (either call), a write of its state from any thread, another optimizer's step of that state
// and its destroy are refused (BUSY); a commit without a prepare is refused; destroying the
// optimizer aborts a step left prepared.
TEST(OptimCApi, PreparedStepCommitsOrAbortsWhole) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt{0};
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << LastError();
  tm_adam two = Adam(rt, 2), one = Adam(rt, 2);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  const size_t sizes[] = {3000, 70001};
  struct Side {
    std::vector<tm_tensor> tensors;
    std::vector<std::vector<uint16_t>> out;
  } halves, whole;
  std::vector<std::vector<float>> grads, start;
  for (size_t b = 0; b < 2; ++b) {
    const size_t n = sizes[b];
    std::vector<float> s(3 * n), g(n);
    for (size_t i = 0; i < n; ++i) {
      s[i] = normal(rng);
      s[n + i] = 0.1f * normal(rng);
      s[2 * n + i] = 0.01f * std::abs(normal(rng));
      g[i] = normal(rng);
    }
    for (Side* side : {&halves, &whole}) {
      tm_tensor_desc d = TM_TENSOR_DESC_INIT;
      d.bytes = 12 * n;
      d.cls = TM_CLASS_OPTIMIZER_STATE;
      d.home_tier = b == 0 ? TM_TIER_DRAM : TM_TIER_NVME;
      tm_tensor t{0};
      ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK) << LastError();
      ASSERT_EQ(tm_tensor_write(rt, t, 0, s.data(), d.bytes), TM_OK) << LastError();
      if (b == 1) {
        ASSERT_EQ(tm_tensor_offload(rt, t, TM_TIER_NVME), TM_OK) << LastError();
      }
      ASSERT_EQ(tm_tensor_sync(rt, t), TM_OK) << LastError();
      side->tensors.push_back(t);
      side->out.emplace_back(n, 0xabcd);
    }
    grads.push_back(std::move(g));
    start.push_back(std::move(s));
  }
  auto groups_of = [&](Side& side, std::vector<tm_adam_bucket>* buckets) {
    buckets->clear();
    for (size_t b = 0; b < 2; ++b) {
      buckets->push_back({side.tensors[b], sizes[b], grads[b].data(), TM_DTYPE_F32,
                          side.out[b].data(), TM_DTYPE_BF16});
    }
    return tm_adam_group{nullptr, 1, buckets->data(), buckets->size()};
  };
  auto unchanged = [&](Side& side) {
    for (size_t b = 0; b < 2; ++b) {
      std::vector<float> back(3 * sizes[b]);
      EXPECT_EQ(tm_tensor_read(rt, side.tensors[b], 0, back.data(), back.size() * 4), TM_OK);
      EXPECT_EQ(std::memcmp(back.data(), start[b].data(), back.size() * 4), 0) << b;
      EXPECT_EQ(side.out[b], std::vector<uint16_t>(sizes[b], 0xabcd)) << b;
    }
  };
  size_t done = 99;
  EXPECT_EQ(tm_adam_step_commit(two, &done), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("no step is prepared"), std::string::npos) << LastError();
  EXPECT_EQ(done, 0u);
  EXPECT_EQ(tm_adam_step_abort(two), TM_OK) << "nothing prepared: nothing to do";
  std::vector<tm_adam_bucket> bh, bw;
  tm_adam_group gh = groups_of(halves, &bh), gw = groups_of(whole, &bw);
  ASSERT_EQ(tm_adam_step_groups_prepare(two, 1.0f, &gh, 1), TM_OK) << LastError();
  unchanged(halves);
  EXPECT_EQ(tm_adam_step_groups_prepare(two, 1.0f, &gh, 1), TM_ERR_BUSY);
  EXPECT_NE(LastError().find("a prepared step waits"), std::string::npos) << LastError();
  EXPECT_EQ(tm_adam_step_groups(two, 1.0f, &gh, 1, &done), TM_ERR_BUSY);
  EXPECT_EQ(tm_adam_step_buckets(two, 1, 1.0f, bh.data(), bh.size(), &done), TM_ERR_BUSY);
  // The prepared step's states refuse this thread's writes, another optimizer's step and a
  // destroy, as they do another thread's: the commit would lose them.
  float x = 1.0f;
  EXPECT_EQ(tm_tensor_write(rt, halves.tensors[1], 0, &x, 4), TM_ERR_BUSY);
  EXPECT_NE(LastError().find("prepared Adam step"), std::string::npos) << LastError();
  EXPECT_EQ(tm_adam_step_groups(one, 1.0f, &gh, 1, &done), TM_ERR_BUSY);
  EXPECT_EQ(tm_tensor_destroy(rt, halves.tensors[0]), TM_ERR_BUSY);
  ASSERT_EQ(tm_adam_step_abort(two), TM_OK);
  unchanged(halves);
  EXPECT_EQ(tm_adam_step_commit(two, &done), TM_ERR_INVALID_ARGUMENT) << "aborted: gone";
  ASSERT_EQ(tm_adam_step_groups_prepare(two, 1.0f, &gh, 1), TM_OK) << LastError();
  ASSERT_EQ(tm_adam_step_commit(two, &done), TM_OK) << LastError();
  EXPECT_EQ(done, 2u);
  ASSERT_EQ(tm_adam_step_groups(one, 1.0f, &gw, 1, &done), TM_OK) << LastError();
  for (size_t b = 0; b < 2; ++b) {
    std::vector<float> a(3 * sizes[b]), w(3 * sizes[b]);
    ASSERT_EQ(tm_tensor_read(rt, halves.tensors[b], 0, a.data(), a.size() * 4), TM_OK);
    ASSERT_EQ(tm_tensor_read(rt, whole.tensors[b], 0, w.data(), w.size() * 4), TM_OK);
    EXPECT_EQ(std::memcmp(a.data(), w.data(), a.size() * 4), 0) << b;
    EXPECT_NE(std::memcmp(a.data(), start[b].data(), a.size() * 4), 0) << b << " stepped";
    EXPECT_EQ(halves.out[b], whole.out[b]) << b;
  }
  // Left prepared: the destroy aborts it, and the state can be written again.
  gh.step = 2;
  ASSERT_EQ(tm_adam_step_groups_prepare(two, 1.0f, &gh, 1), TM_OK) << LastError();
  ASSERT_EQ(tm_adam_destroy(two), TM_OK) << LastError();
  EXPECT_EQ(tm_tensor_write(rt, halves.tensors[1], 0, &x, 4), TM_OK) << LastError();
  ASSERT_EQ(tm_adam_destroy(one), TM_OK);
  ASSERT_EQ(tm_runtime_destroy(rt), TM_OK);
}

// A step prepared in parts (tm_adam_step_groups_extend: a sharded model's units, one at a time)
// is one step: an abort undoes every part, a commit gives what one tm_adam_step_groups over all
// the buckets gives. A part that fails (a bad bucket, a state already in the step) is undone
// alone and says so, the parts before it stay prepared; an extend with nothing prepared is
// refused. An NVMe bucket has read its gradient when its part returns.
TEST(OptimCApi, StepPreparedInPartsIsOneStep) {
  TempDir dir;
  tm_config cfg = SmallConfig(dir.path());
  tm_runtime rt{0};
  ASSERT_EQ(tm_runtime_create(&cfg, &rt), TM_OK) << LastError();
  tm_adam parts = Adam(rt, 2), one = Adam(rt, 2);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  const size_t sizes[] = {2000, 50001, 777};
  constexpr size_t kBuckets = 3;
  std::vector<tm_tensor> mine, theirs;
  std::vector<std::vector<float>> start, grads;
  std::vector<std::vector<uint16_t>> out_mine, out_theirs;
  for (size_t b = 0; b < kBuckets; ++b) {
    const size_t n = sizes[b];
    std::vector<float> s(3 * n), g(n);
    for (size_t i = 0; i < n; ++i) {
      s[i] = normal(rng);
      s[n + i] = 0.1f * normal(rng);
      s[2 * n + i] = 0.01f * std::abs(normal(rng));
      g[i] = normal(rng);
    }
    for (auto* side : {&mine, &theirs}) {
      tm_tensor_desc d = TM_TENSOR_DESC_INIT;
      d.bytes = 12 * n;
      d.cls = TM_CLASS_OPTIMIZER_STATE;
      d.home_tier = b == 0 ? TM_TIER_DRAM : TM_TIER_NVME;
      tm_tensor t{0};
      ASSERT_EQ(tm_tensor_create(rt, &d, &t), TM_OK) << LastError();
      ASSERT_EQ(tm_tensor_write(rt, t, 0, s.data(), d.bytes), TM_OK) << LastError();
      if (b > 0) {
        ASSERT_EQ(tm_tensor_offload(rt, t, TM_TIER_NVME), TM_OK) << LastError();
      }
      ASSERT_EQ(tm_tensor_sync(rt, t), TM_OK) << LastError();
      side->push_back(t);
    }
    out_mine.emplace_back(n, 0xabcd);
    out_theirs.emplace_back(n, 0xabcd);
    start.push_back(std::move(s));
    grads.push_back(std::move(g));
  }
  auto bucket = [&](std::vector<tm_tensor>& t, std::vector<std::vector<uint16_t>>& out,
                    const float* grad, size_t b) {
    return tm_adam_bucket{t[b], sizes[b], grad, TM_DTYPE_F32, out[b].data(), TM_DTYPE_BF16};
  };
  auto unchanged = [&] {
    for (size_t b = 0; b < kBuckets; ++b) {
      std::vector<float> back(3 * sizes[b]);
      EXPECT_EQ(tm_tensor_read(rt, mine[b], 0, back.data(), back.size() * 4), TM_OK);
      EXPECT_EQ(std::memcmp(back.data(), start[b].data(), back.size() * 4), 0) << b;
      EXPECT_EQ(out_mine[b], std::vector<uint16_t>(sizes[b], 0xabcd)) << b;
    }
  };
  // Part 1: the DRAM bucket and the first NVMe one; part 2: the last NVMe bucket, from a copy
  // of its gradient that is spoiled once the part returns (read by then).
  std::vector<tm_adam_bucket> first = {bucket(mine, out_mine, grads[0].data(), 0),
                                       bucket(mine, out_mine, grads[1].data(), 1)};
  std::vector<float> copy = grads[2];
  tm_adam_bucket second = bucket(mine, out_mine, copy.data(), 2);
  tm_adam_group g1{nullptr, 1, first.data(), first.size()}, g2{nullptr, 1, &second, 1};
  EXPECT_EQ(tm_adam_step_groups_extend(parts, 0.5f, &g2, 1, 0), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("no step is prepared"), std::string::npos) << LastError();

  ASSERT_EQ(tm_adam_step_groups_prepare(parts, 0.5f, &g1, 1), TM_OK) << LastError();
  tm_adam_bucket again = first[1];
  tm_adam_group twice{nullptr, 1, &again, 1};
  EXPECT_EQ(tm_adam_step_groups_extend(parts, 0.5f, &twice, 1, 0), TM_ERR_BUSY)
      << "a state already in the step";
  tm_adam_bucket short_state = second;
  short_state.count = sizes[2] + 1;
  tm_adam_group bad{nullptr, 1, &short_state, 1};
  EXPECT_EQ(tm_adam_step_groups_extend(parts, 0.5f, &bad, 1, 0), TM_ERR_INVALID_ARGUMENT);
  EXPECT_NE(LastError().find("not taken"), std::string::npos) << LastError();
  ASSERT_EQ(tm_adam_step_groups_extend(parts, 0.5f, &g2, 1, 0), TM_OK) << LastError();
  unchanged();
  ASSERT_EQ(tm_adam_step_abort(parts), TM_OK);
  unchanged();

  ASSERT_EQ(tm_adam_step_groups_prepare(parts, 0.5f, &g1, 1), TM_OK) << LastError();
  ASSERT_EQ(tm_adam_step_groups_extend(parts, 0.5f, &bad, 1, 0), TM_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(tm_adam_step_groups_extend(parts, 0.5f, &g2, 1, 0), TM_OK) << LastError();
  std::fill(copy.begin(), copy.end(), 1e30f);  // read already: the commit must not need it
  size_t done = 0;
  ASSERT_EQ(tm_adam_step_commit(parts, &done), TM_OK) << LastError();
  EXPECT_EQ(done, kBuckets);
  EXPECT_EQ(tm_adam_step_groups_extend(parts, 0.5f, &g2, 1, 0), TM_ERR_INVALID_ARGUMENT)
      << "committed: nothing prepared";

  std::vector<tm_adam_bucket> all;
  for (size_t b = 0; b < kBuckets; ++b)
    all.push_back(bucket(theirs, out_theirs, grads[b].data(), b));
  tm_adam_group whole{nullptr, 1, all.data(), all.size()};
  ASSERT_EQ(tm_adam_step_groups(one, 0.5f, &whole, 1, &done), TM_OK) << LastError();
  for (size_t b = 0; b < kBuckets; ++b) {
    std::vector<float> a(3 * sizes[b]), w(3 * sizes[b]);
    ASSERT_EQ(tm_tensor_read(rt, mine[b], 0, a.data(), a.size() * 4), TM_OK);
    ASSERT_EQ(tm_tensor_read(rt, theirs[b], 0, w.data(), w.size() * 4), TM_OK);
    EXPECT_EQ(std::memcmp(a.data(), w.data(), a.size() * 4), 0) << b;
    EXPECT_NE(std::memcmp(a.data(), start[b].data(), a.size() * 4), 0) << b << " stepped";
    EXPECT_EQ(out_mine[b], out_theirs[b]) << b;
  }

  // Step 2 from an empty prepare, every part added with TM_ADAM_OUT_SCRATCH: the NVMe buckets'
  // param_out is written when their part returns, the DRAM bucket's at the commit; the states
  // as one step of them all gives.
  EXPECT_EQ(tm_adam_step_groups_extend(parts, 0.5f, &g2, 1, 0x80), TM_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(tm_adam_step_groups_prepare(parts, 0.5f, nullptr, 0), TM_OK) << LastError();
  std::vector<std::vector<uint16_t>> scratch;
  for (size_t b = 0; b < kBuckets; ++b) scratch.emplace_back(sizes[b], 0);
  std::vector<tm_adam_bucket> each;
  for (size_t b = 0; b < kBuckets; ++b) each.push_back(bucket(mine, scratch, grads[b].data(), b));
  for (size_t b = 0; b < kBuckets; ++b) {
    tm_adam_group g{nullptr, 2, &each[b], 1};
    ASSERT_EQ(tm_adam_step_groups_extend(parts, 0.5f, &g, 1, TM_ADAM_OUT_SCRATCH), TM_OK)
        << LastError();
    EXPECT_EQ(scratch[b] != std::vector<uint16_t>(sizes[b], 0), b > 0)
        << b << ": an NVMe bucket's scratch is written at once, a DRAM one's at the commit";
  }
  ASSERT_EQ(tm_adam_step_commit(parts, &done), TM_OK) << LastError();
  for (size_t b = 0; b < kBuckets; ++b) all[b].param_out = out_theirs[b].data();
  whole.step = 2;
  ASSERT_EQ(tm_adam_step_groups(one, 0.5f, &whole, 1, &done), TM_OK) << LastError();
  for (size_t b = 0; b < kBuckets; ++b) {
    std::vector<float> a(3 * sizes[b]), w(3 * sizes[b]);
    ASSERT_EQ(tm_tensor_read(rt, mine[b], 0, a.data(), a.size() * 4), TM_OK);
    ASSERT_EQ(tm_tensor_read(rt, theirs[b], 0, w.data(), w.size() * 4), TM_OK);
    EXPECT_EQ(std::memcmp(a.data(), w.data(), a.size() * 4), 0) << "step 2, " << b;
    EXPECT_EQ(scratch[b], out_theirs[b]) << "step 2, " << b;
  }
  ASSERT_EQ(tm_adam_destroy(parts), TM_OK);
  ASSERT_EQ(tm_adam_destroy(one), TM_OK);
  ASSERT_EQ(tm_runtime_destroy(rt), TM_OK);
}

}  // namespace
