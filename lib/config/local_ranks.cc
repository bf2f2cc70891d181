// Ranks on a node: which launcher variable gives the local rank and world size, Slurm's
// tasks-per-node lists, and how devices and percentage budgets are shared between ranks.
#include "lib/config/local_ranks.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tiermem {
namespace {

constexpr uint64_t kMaxRanks = 65536;

// A plain decimal number, no sign, no spaces around it but those a shell might leave.
std::optional<uint64_t> Number(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  uint64_t v = 0;
  if (text.empty() || !absl::ascii_isdigit(static_cast<unsigned char>(text[0])) ||
      !absl::SimpleAtoi(text, &v)) {
    return std::nullopt;
  }
  return v;
}

// One launcher: its local-rank variable and the variables that may give its local world size,
// in order. Slurm's are tasks-per-node lists.
struct Launcher {
  const char* rank;
  std::vector<const char*> world;
  bool slurm_lists = false;
};

const std::vector<Launcher>& Launchers() {
  static const auto* launchers = new std::vector<Launcher>{
      // torchrun sets LOCAL_WORLD_SIZE; DeepSpeed's launcher sets LOCAL_SIZE.
      {"LOCAL_RANK", {"LOCAL_WORLD_SIZE", "LOCAL_SIZE"}},
      {"OMPI_COMM_WORLD_LOCAL_RANK", {"OMPI_COMM_WORLD_LOCAL_SIZE"}},
      // srun sets the step's own count; SLURM_NTASKS_PER_NODE is what was asked for (and may
      // be more than a step runs), SLURM_TASKS_PER_NODE the job's layout.
      {"SLURM_LOCALID",
       {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"},
       true},
  };
  return *launchers;
}

}  // namespace

absl::StatusOr<int> SlurmTasksOnNode(absl::string_view what, absl::string_view text,
                                     std::optional<int> node_id) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrFormat("%s=\"%s\" %s", what, text, why));
  };
  // Entries "N" or "N(xR)": R consecutive nodes with N tasks each.
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // (tasks, nodes)
  uint64_t nodes = 0;
  for (absl::string_view entry : absl::StrSplit(absl::StripAsciiWhitespace(text), ',')) {
    uint64_t repeat = 1;
    if (const size_t open = entry.find('('); open != absl::string_view::npos) {
      absl::string_view tail = entry.substr(open);
      entry = entry.substr(0, open);
      if (!absl::ConsumePrefix(&tail, "(x") || !absl::ConsumeSuffix(&tail, ")")) {
        return bad("is not a Slurm tasks-per-node list (expected N, N(xR), N(xR),M...)");
      }
      auto r = Number(tail);
      if (!r.has_value() || *r == 0 || *r > kMaxRanks) {
        return bad("is not a Slurm tasks-per-node list (a repeat count must be 1 to 65536)");
      }
      repeat = *r;
    }
    auto n = Number(entry);
    if (!n.has_value() || *n == 0 || *n > kMaxRanks) {
      return bad("is not a Slurm tasks-per-node list (a task count must be 1 to 65536)");
    }
    runs.emplace_back(*n, repeat);
    nodes += repeat;
  }
  if (node_id.has_value()) {
    if (*node_id < 0 || static_cast<uint64_t>(*node_id) >= nodes) {
      return bad(absl::StrFormat("has %u node(s), not node %d (SLURM_NODEID)", nodes, *node_id));
    }
    uint64_t first = 0;
    for (const auto& [tasks, repeat] : runs) {
      if (static_cast<uint64_t>(*node_id) < first + repeat) return static_cast<int>(tasks);
      first += repeat;
    }
  }
  for (const auto& run : runs) {
    if (run.first != runs.front().first) {
      return bad(
          "gives nodes different task counts, and SLURM_NODEID does not say which node "
          "this is");
    }
  }
  return static_cast<int>(runs.front().first);
}

std::optional<LauncherRanks> DetectLauncherRanks(const EnvLookup& env) {
  for (const Launcher& l : Launchers()) {
    auto text = env(l.rank);
    if (!text.has_value()) continue;
    auto rank = Number(*text);
    if (!rank.has_value() || *rank >= kMaxRanks) continue;
    LauncherRanks out;
    out.rank = static_cast<int>(*rank);
    out.rank_variable = l.rank;
    std::optional<int> node_id;
    if (l.slurm_lists) {
      if (auto id = env("SLURM_NODEID"); id.has_value()) {
        if (auto n = Number(*id); n.has_value() && *n < kMaxRanks) node_id = static_cast<int>(*n);
      }
    }
    std::vector<std::string> problems;
    for (const char* name : l.world) {
      auto w = env(name);
      if (!w.has_value()) continue;
      std::optional<int> world;
      if (l.slurm_lists) {
        auto tasks = SlurmTasksOnNode(name, *w, node_id);
        if (!tasks.ok()) {
          problems.emplace_back(tasks.status().message());
          continue;
        }
        world = *tasks;
      } else if (auto n = Number(*w); n.has_value() && *n >= 1 && *n <= kMaxRanks) {
        world = static_cast<int>(*n);
      } else {
        problems.push_back(absl::StrFormat("%s=\"%s\" is not a number of ranks", name, *w));
        continue;
      }
      if (*world <= out.rank) {
        problems.push_back(
            absl::StrFormat("%s=%d is not above %s=%d", name, *world, l.rank, out.rank));
        continue;
      }
      out.world = world;
      out.world_variable = name;
      return out;
    }
    if (problems.empty()) {
      out.problem = absl::StrFormat("%s=%d is set but the launcher gives no local world size (%s)",
                                    l.rank, out.rank, absl::StrJoin(l.world, ", "));
    } else {
      out.problem = absl::StrJoin(problems, "; ");
    }
    return out;
  }
  return std::nullopt;
}

namespace {

Config::Entry* FindEntry(Config& c, absl::string_view name) {
  for (auto& e : c.entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace

absl::Status CheckLocalRanks(const EnvLookup& env, Config& c) {
  Config::Entry* rank = FindEntry(c, "TIERMEM_LOCAL_RANK");
  Config::Entry* world = FindEntry(c, "TIERMEM_LOCAL_WORLD_SIZE");
  if (rank == nullptr || world == nullptr) return absl::OkStatus();
  const bool world_given = !absl::StartsWith(world->source, "default") &&
                           !absl::StartsWith(world->source, "environment ");
  if (world->source == "default") {
    // No world size from the launcher that gave the rank: say why, once per runtime.
    if (auto l = DetectLauncherRanks(env); l.has_value() && !l->problem.empty()) {
      c.warnings.push_back(
          absl::StrCat(l->problem,
                       "; TIERMEM_LOCAL_WORLD_SIZE=1: percentage budgets are not split between "
                       "the ranks on this node (set TIERMEM_LOCAL_WORLD_SIZE)"));
    }
  }
  if (c.local_rank < c.local_world_size) return absl::OkStatus();
  if (world_given) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s=%d (%s) is not below %s=%d (%s): local ranks count from 0 to the local world size - 1",
        c.SettingName("TIERMEM_LOCAL_RANK"), c.local_rank, rank->source,
        c.SettingName("TIERMEM_LOCAL_WORLD_SIZE"), c.local_world_size, world->source));
  }
  if (world->source != "default") {
    // A rank given explicitly beyond the launcher's world size.
    c.warnings.push_back(absl::StrFormat(
        "TIERMEM_LOCAL_RANK=%d (%s) is not below the local world size %d (%s), which is passed "
        "over; TIERMEM_LOCAL_WORLD_SIZE=1: percentage budgets are not split between the ranks "
        "on this node",
        c.local_rank, rank->source, c.local_world_size, world->source));
    c.local_world_size = 1;
    world->value = "1";
    world->source = "default";
  }
  return absl::OkStatus();
}

int DefaultCudaDevice(int local_rank, int device_count) {
  if (device_count <= 0 || local_rank < 0) return 0;
  return local_rank % device_count;
}

int RanksOnDevice(int device, int local_world, int device_count) {
  if (device_count <= 0 || local_world <= 0 || device < 0 || device >= device_count) return 1;
  // Ranks device, device + count, device + 2 * count, ... below local_world.
  const int n = device < local_world ? (local_world - 1 - device) / device_count + 1 : 0;
  return n > 0 ? n : 1;
}

uint64_t RankShare(const SizeSetting& setting, uint64_t node_bytes, int sharers, uint64_t granule) {
  if (setting.percent <= 0) return setting.bytes;
  uint64_t share = setting.Resolve(node_bytes) / static_cast<uint64_t>(sharers > 0 ? sharers : 1);
  if (granule > 1) share -= share % granule;
  return share;
}

}  // namespace tiermem
