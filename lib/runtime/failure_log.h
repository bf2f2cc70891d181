// Failures of asynchronous work (offloads, stream-ordered copies, callers' copies), kept until a
// sync or step end reports them, even after their tensor is destroyed. Guarded by the runtime's
// lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tiermem {

class FailureLog {
 public:
  void Record(uint64_t handle, std::string tensor, absl::Status status) {
    failures_.push_back(Failure{handle, std::move(tensor), std::move(status)});
  }
  // Reports (and forgets) the failures of `handle` (0: of every tensor): the first, with how
  // many there were.
  absl::Status Take(uint64_t handle);

 private:
  struct Failure {
    uint64_t handle;
    std::string tensor;
    absl::Status status;
  };
  std::vector<Failure> failures_;
};

}  // namespace tiermem
