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
  // `kept`: the tensor is valid where it was (a move between tiers failed), not short of bytes
  // a caller's copy was to bring.
  void Record(uint64_t handle, std::string tensor, absl::Status status, bool kept) {
    failures_.push_back(Failure{handle, std::move(tensor), std::move(status), kept});
  }
  // Reports (and forgets) the failures of `handle` (0: of every tensor): the first, with how
  // many there were, and, when every one of them kept its tensor, that they lost nothing.
  absl::Status Take(uint64_t handle);

 private:
  struct Failure {
    uint64_t handle;
    std::string tensor;
    absl::Status status;
    bool kept;
  };
  std::vector<Failure> failures_;
};

}  // namespace tiermem
