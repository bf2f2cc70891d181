#include "lib/optim/bucket_step.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/base/status.h"

namespace tiermem::optim {

namespace {

absl::Status InBucket(const absl::Status& s, size_t bucket, const char* doing) {
  return WithContext(s, absl::StrFormat("bucket %zu: %s", bucket, doing));
}

absl::Status CheckBucket(StateTensors& tensors, const tm_adam_bucket& b, size_t index,
                         bool amsgrad) {
  auto bad = [index](const std::string& what) {
    return Error(TM_ERR_INVALID_ARGUMENT, absl::StrFormat("bucket %zu: %s", index, what));
  };
  if (b.count == 0) return absl::OkStatus();
  if (b.grad == nullptr) return bad("grad is NULL");
  if (b.grad_dtype < TM_DTYPE_F32 || b.grad_dtype >= TM_DTYPE_COUNT) {
    return bad("grad_dtype is not a tm_dtype");
  }
  if (b.param_out != nullptr &&
      (b.param_out_dtype < TM_DTYPE_F32 || b.param_out_dtype >= TM_DTYPE_COUNT)) {
    return bad("param_out_dtype is not a tm_dtype");
  }
  const uint64_t per = amsgrad ? 16 : 12;
  if (b.count > UINT64_MAX / per) return bad("count is too large");
  auto bytes = tensors.Bytes(b.state.bits);
  if (!bytes.ok()) return InBucket(bytes.status(), index, "state");
  if (*bytes < b.count * per) {
    return bad(absl::StrFormat("state holds %u bytes, %u needed for count %u%s", *bytes,
                               b.count * per, b.count, amsgrad ? " with amsgrad" : ""));
  }
  return absl::OkStatus();
}

AdamSpan SpanOver(const tm_adam_bucket& b, void* state, bool amsgrad) {
  float* base = static_cast<float*>(state);
  const size_t n = b.count;
  AdamSpan s;
  s.param = base;
  s.m = base + n;
  s.v = base + 2 * n;
  s.max_v = amsgrad ? base + 3 * n : nullptr;
  s.grad = b.grad;
  s.grad_type = static_cast<Dtype>(b.grad_dtype);
  s.out = b.param_out;
  s.out_type = static_cast<Dtype>(b.param_out_dtype);
  s.n = n;
  return s;
}

}  // namespace

BucketStepResult StepBuckets(AdamOptimizer& opt, StateTensors& tensors, int prefetch_depth,
                             uint64_t step, float grad_scale, const tm_adam_bucket* buckets,
                             size_t count) {
  BucketStepResult r;
  const bool amsgrad = opt.hyper().amsgrad;
  // Everything is checked, and where each state is, before anything moves.
  std::vector<bool> write_back(count, false);
  for (size_t i = 0; i < count; ++i) {
    if (r.status = CheckBucket(tensors, buckets[i], i, amsgrad); !r.status.ok()) return r;
    if (buckets[i].count == 0) continue;
    auto mask = tensors.Residency(buckets[i].state.bits);
    if (!mask.ok()) {
      r.status = InBucket(mask.status(), i, "state");
      return r;
    }
    // Only state that lives on NVMe goes back there; state in DRAM (or HBM) stays in DRAM. A DRAM
    // copy beside the NVMe one is a clean copy (inclusive DRAM, or a prefetch): on NVMe still.
    write_back[i] = (*mask & TM_TIER_BIT(TM_TIER_NVME)) != 0;
  }
  size_t ahead = 0;  // buckets whose prefetch has been asked for
  std::vector<size_t> written;
  for (size_t k = 0; k < count; ++k) {
    const size_t want = std::min(count, k + 1 + static_cast<size_t>(std::max(0, prefetch_depth)));
    for (ahead = std::max(ahead, k + 1); ahead < want; ++ahead) {
      // A hint: a failed read shows again at the bucket's acquire, which reports it.
      if (write_back[ahead]) (void)tensors.Prefetch(buckets[ahead].state.bits, TM_TIER_DRAM);
    }
    if (buckets[k].count == 0) {
      ++r.buckets_done;
      continue;
    }
    const uint64_t t = buckets[k].state.bits;
    // Waits for the bucket's prefetch and takes its failure, if any: the acquire reads again,
    // and reports the failure if it persists.
    (void)tensors.Sync(t);
    auto state = tensors.Acquire(t, TM_TIER_DRAM, TM_ACCESS_READ_WRITE);
    if (!state.ok()) {
      r.status = InBucket(state.status(), k, "reading its state into DRAM");
      break;
    }
    const AdamSpan span = SpanOver(buckets[k], *state, amsgrad);
    absl::Status stepped = opt.Step(step, grad_scale, &span, 1);
    absl::Status released = tensors.Release(t, TM_TIER_DRAM);
    if (!stepped.ok()) {  // checked above: only a bug gets here, before any element changed
      r.status = InBucket(stepped, k, "step");
      break;
    }
    ++r.buckets_done;
    if (!released.ok()) {
      r.status = InBucket(released, k, "release");
      break;
    }
    if (write_back[k]) {
      // Returns at once: the write runs while the next bucket steps.
      absl::Status s = tensors.Offload(t, TM_TIER_NVME);
      if (!s.ok() && r.status.ok()) r.status = InBucket(s, k, "writing its state back");
      written.push_back(k);
    }
  }
  // Prefetches past a failure are waited for, so that none is left to surprise a later sync.
  for (size_t i = r.buckets_done + 1; i < ahead && i < count; ++i) {
    (void)tensors.Sync(buckets[i].state.bits);
  }
  for (size_t k : written) {
    absl::Status s = tensors.Sync(buckets[k].state.bits);
    if (!s.ok() && r.status.ok()) r.status = InBucket(s, k, "writing its state back");
  }
  return r;
}

}  // namespace tiermem::optim
