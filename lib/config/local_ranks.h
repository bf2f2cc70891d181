// Ranks on a node: the launchers' variables (torchrun, DeepSpeed, Open MPI, Slurm), the CUDA
// device a local rank defaults to, and a rank's share of a percentage budget.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lib/config/config.h"

namespace tiermem {

// What a launcher says about this process's place on its node.
struct LauncherRanks {
  int rank = 0;
  std::string rank_variable;  // e.g. "LOCAL_RANK"
  // The local world size from the same launcher; nullopt when it gave none that fits the rank.
  std::optional<int> world;
  std::string world_variable;  // the variable `world` came from
  // Why the launcher's world size was not taken (empty when it was).
  std::string problem;
};

// The first launcher whose local-rank variable holds a rank (0-65535), in the order torchrun and
// DeepSpeed (LOCAL_RANK), Open MPI (OMPI_COMM_WORLD_LOCAL_RANK), Slurm (SLURM_LOCALID); with its
// world size from the same launcher (LOCAL_WORLD_SIZE, else DeepSpeed's LOCAL_SIZE;
// OMPI_COMM_WORLD_LOCAL_SIZE; SLURM_STEP_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE or
// SLURM_TASKS_PER_NODE at SLURM_NODEID). A variable that is not a number is passed over: the
// launchers' variables are not tiermem's to judge. nullopt when no launcher gives a rank.
std::optional<LauncherRanks> DetectLauncherRanks(const EnvLookup& env);

// After the settings are loaded: the local rank must be below a local world size that was given
// (in tm_config, the environment or the env file), else InvalidArgument naming both and where
// they came from. A launcher's world size that does not fit is passed over with a warning in
// `config.warnings`: percentage budgets are then not split (world size 1), never wrongly split.
absl::Status CheckLocalRanks(const EnvLookup& env, Config& config);

// This node's task count from a Slurm tasks-per-node list: "4", "2(x3)", "2(x3),1", "5,4(x3)".
// `node_id` (SLURM_NODEID) picks the entry; without it, the list must give every node the same
// count. InvalidArgument naming `what` when the text is malformed, the node is not in the list,
// or the count differs between nodes and no node id says which applies.
absl::StatusOr<int> SlurmTasksOnNode(absl::string_view what, absl::string_view text,
                                     std::optional<int> node_id);

// The CUDA device a local rank uses when TIERMEM_CUDA_DEVICE is not set: rank mod the devices
// this process sees (CUDA_VISIBLE_DEVICES included), so that 8 ranks on 8 GPUs take one each
// and a launcher that gives each rank one visible device gets device 0 everywhere.
int DefaultCudaDevice(int local_rank, int device_count);

// How many of the local ranks 0..local_world-1 default to `device` (rank mod device_count).
int RanksOnDevice(int device, int local_world, int device_count);

// A rank's budget from a setting resolved against `node_bytes` (the node's physical size):
// a percentage is a share of the node split evenly over `sharers` and rounded down to
// `granule`; an absolute size is this rank's own and is returned as is.
uint64_t RankShare(const SizeSetting& setting, uint64_t node_bytes, int sharers, uint64_t granule);

}  // namespace tiermem
