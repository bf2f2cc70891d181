// The CPU Adam's StateTensors straight over a Runtime: the one place where lib/optim's seam meets
// the runtime (lib/optim includes nothing of lib/runtime). Tests drive the pipeline with it under
// fault injection; the C API goes through handles instead (optim_c_api.cc).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "lib/optim/bucket_step.h"
#include "lib/runtime/runtime.h"

namespace tiermem::optim {

class RuntimeStateTensors : public StateTensors {
 public:
  explicit RuntimeStateTensors(Runtime& rt) : rt_(rt) {}
  absl::StatusOr<uint64_t> Bytes(uint64_t t) override { return rt_.TensorBytes(t); }
  absl::StatusOr<uint32_t> Residency(uint64_t t) override { return rt_.Residency(t); }
  absl::Status Prefetch(uint64_t t, tm_tier tier) override { return rt_.Prefetch(t, tier); }
  absl::StatusOr<void*> Acquire(uint64_t t, tm_tier tier, tm_access access) override {
    return rt_.Acquire(t, tier, access, nullptr, false, /*scheduled=*/false);
  }
  absl::Status Release(uint64_t t, tm_tier tier) override { return rt_.Release(t, tier); }
  absl::Status Hold(uint64_t t) override { return rt_.HoldForStep(t); }
  void Unhold(uint64_t t) override { rt_.UnholdForStep(t); }
  void Seal(uint64_t t) override { rt_.SealForStep(t); }
  absl::Status Offload(uint64_t t, tm_tier tier) override { return rt_.Offload(t, tier); }
  absl::Status Sync(uint64_t t) override { return rt_.Sync(t); }
  absl::StatusOr<uint64_t> Create(uint64_t bytes, const std::string& name) override {
    return rt_.CreateTensor({bytes, TM_CLASS_OPTIMIZER_STATE, TM_TIER_NVME, name});
  }
  absl::Status Destroy(uint64_t t) override { return rt_.DestroyTensor(t); }
  absl::Status SwapContents(const std::vector<std::pair<uint64_t, uint64_t>>& pairs) override {
    return rt_.SwapContents(pairs);
  }
  absl::Status DropClean(uint64_t t) override { return rt_.DropCleanCopy(t, TM_TIER_DRAM); }
  absl::StatusOr<uint64_t> DramCapacity() override {
    return rt_.Stats().tiers[TM_TIER_DRAM].capacity;
  }

 private:
  Runtime& rt_;
};

}  // namespace tiermem::optim
