// Runtime set-up and tear-down: device, NUMA node, tiers, engines, staging ring, mover threads.
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "io/cuda_count.h"
#include "io/log.h"
#include "lib/base/status.h"
#include "lib/config/local_ranks.h"
#include "lib/runtime/runtime.h"

namespace tiermem {
namespace {

using io::Log;
using io::LogSeverity;

uint64_t PhysicalRam() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// What a percentage of TIERMEM_NVME_BYTES is of: the total size of the paths' file systems,
// each counted once. The total, not what is free now: ranks started one after another must get
// the same share, whoever reserved first (free space gave 39, 15 and 6 MiB by start order).
uint64_t NvmeNodeBytes(const std::vector<std::string>& dirs) {
  std::vector<dev_t> seen;
  uint64_t total = 0;
  for (const std::string& dir : dirs) {
    struct stat st = {};
    struct statvfs v = {};
    if (stat(dir.c_str(), &st) != 0 || statvfs(dir.c_str(), &v) != 0) continue;
    if (std::find(seen.begin(), seen.end(), st.st_dev) != seen.end()) continue;
    seen.push_back(st.st_dev);
    total += static_cast<uint64_t>(v.f_blocks) * v.f_frsize;
  }
  return total;
}

void SetEntry(Config& c, absl::string_view name, std::string value,
              std::optional<std::string> source = std::nullopt) {
  for (auto& e : c.entries) {
    if (e.name != name) continue;
    e.value = std::move(value);
    if (source.has_value()) e.source = std::move(*source);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const Config& config) {
  std::unique_ptr<Runtime> rt(new Runtime(config));
  if (auto s = rt->Init(); !s.ok()) return s;
  return rt;
}

Runtime::~Runtime() {
  movers_.Stop();
  if (core_.trace() != nullptr) {
    if (auto s = core_.trace()->Write(); !s.ok()) {
      Log(LogSeverity::kError, "%s", std::string(s.message()).c_str());
    }
  }
  // Copies still in flight and callers' work released on stream must pass before the memory
  // they use goes away.
  if (core_.mover() != nullptr) {
    CoreLock lock(core_);
    core_.ForEachTensor([&](Tensor& t) {
      if (t.landing.has_value()) (void)core_.mover()->copy_engine().Wait(*t.landing);
      for (const TensorCopy& c : t.copies) (void)io::WaitAll(c.uses);
    });
    copies_.WaitAll();
    (void)io::WaitAll(core_.DeferredFences());
    room_.WaitVacating();
  }
}

// What one step of set-up hands to the next.
struct Runtime::Setup {
  int devices_visible = 0;
  int node = -1;  // the DRAM tier's NUMA node, -1: unbound
  uint64_t hbm_bytes = 0, dram_bytes = 0, nvme_bytes = 0;
  StagingRing::Shape shape;
};

absl::Status Runtime::Init() {
  io::SetLogLevel(static_cast<LogSeverity>(core_.config().log_level));
  io::SetLogRank(core_.config().local_rank, core_.config().local_world_size);
  for (const auto& v : core_.config().unknown_variables) {
    Log(LogSeverity::kWarn, "%s is not a tiermem variable and is ignored (a typo?)", v.c_str());
  }
  for (const auto& w : core_.config().warnings) Log(LogSeverity::kWarn, "%s", w.c_str());

  Setup st;
  if (auto s = InitDevice(st); !s.ok()) return s;
  if (auto s = InitNuma(st); !s.ok()) return s;
  auto hbm = InitHbm(st);
  if (!hbm.ok()) return hbm.status();
  if (auto s = InitLowerTiers(st, std::move(*hbm)); !s.ok()) return s;
  if (auto s = InitEngines(st); !s.ok()) return s;
  StartMovers(st);
  return absl::OkStatus();
}

absl::Status Runtime::InitDevice(Setup& st) {
  // The CUDA device: the one asked for, else the local rank's (rank mod the devices visible).
  // The count is asked only to choose: without a device the backend below says why.

  if (core_.config().device != DeviceKind::kEmulated) {
    if (auto n = io::CudaDeviceCount(); n.ok()) st.devices_visible = *n;
  }
  if (core_.config().cuda_device < 0) {
    core_.mutable_config().cuda_device =
        DefaultCudaDevice(core_.config().local_rank, st.devices_visible);
    if (st.devices_visible > 0) {
      SetEntry(core_.mutable_config(), "TIERMEM_CUDA_DEVICE",
               absl::StrCat(core_.config().cuda_device),
               absl::StrFormat("default: local rank %d mod %d device(s)", core_.config().local_rank,
                               st.devices_visible));
    }
  }

  // The device backend.
  if (core_.config().device == DeviceKind::kEmulated) {
    core_.set_device(io::CreateEmulatedDevice({0, core_.config().emu_link_gbps}));
    core_.mutable_info().no_gpu = "TIERMEM_DEVICE=emulated";
  } else {
    auto cuda = io::CreateCudaDevice(core_.config().cuda_device);
    if (cuda.ok()) {
      core_.set_device(std::move(*cuda));
    } else if (core_.config().device == DeviceKind::kCuda ||
               absl::IsInvalidArgument(cuda.status())) {
      return Error(absl::IsInvalidArgument(cuda.status()) ? TM_ERR_CONFIG : TM_ERR_DEVICE,
                   absl::StrFormat("TIERMEM_DEVICE=%s: %s", DeviceKindName(core_.config().device),
                                   cuda.status().message()));
    } else {
      // Said once per process: a CPU-only machine creating many runtimes hears it once.
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        Log(LogSeverity::kWarn, "TIERMEM_DEVICE=auto: %s; using the emulated device",
            std::string(cuda.status().message()).c_str());
      }
      core_.set_device(io::CreateEmulatedDevice({0, core_.config().emu_link_gbps}));
      core_.mutable_info().no_gpu = std::string(cuda.status().message());
    }
  }
  core_.mutable_info().device = core_.device()->Describe();
  core_.mutable_info().device_kind = std::string(core_.device()->kind());
  if (core_.info().device_kind == "cuda")
    core_.mutable_info().cuda_device = std::max(core_.config().cuda_device, 0);
  // What was chosen, not what was asked: a binding reads it to know its pointers.
  SetEntry(core_.mutable_config(), "TIERMEM_DEVICE", core_.info().device_kind);

  return absl::OkStatus();
}

absl::Status Runtime::InitNuma(Setup& st) {
  // NUMA: the GPU's node, else this thread's.
  if (auto topo = io::Topology::Load(core_.device()->pci_bus_id().has_value()); topo.ok()) {
    core_.set_topology(std::move(*topo));
    core_.mutable_info().numa_nodes = core_.topology()->NodeCount();
  } else {
    Log(LogSeverity::kWarn, "hwloc: %s; host memory is not NUMA-bound",
        std::string(topo.status().message()).c_str());
  }
  int& node = st.node;
  if (core_.config().numa == NumaMode::kNode) {
    const std::string what = core_.config().SettingName("TIERMEM_NUMA");
    if (core_.topology() == nullptr) {
      return Error(TM_ERR_CONFIG, absl::StrFormat("%s=%d: the topology is unknown", what,
                                                  core_.config().numa_node));
    }
    if (!core_.topology()->HasNode(core_.config().numa_node)) {
      return Error(TM_ERR_CONFIG,
                   absl::StrFormat("%s=%d: no such NUMA node (this machine has %d)", what,
                                   core_.config().numa_node, core_.topology()->NodeCount()));
    }
    node = core_.config().numa_node;
  } else if (core_.config().numa == NumaMode::kAuto && core_.topology() != nullptr) {
    if (auto bus = core_.device()->pci_bus_id(); bus.has_value())
      node = core_.topology()->NodeOfPciDevice(*bus);
    if (node < 0) node = core_.topology()->NodeOfCallingThread();
  }

  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MemoryTier>> Runtime::InitHbm(Setup& st) {
  // Tiers. NVMe first: its alignment is the granule of the DRAM copies it reads and writes.
  // A percentage is a share of the node split evenly over the ranks that share the resource:
  // RAM and file systems over the local world; a GPU over the local ranks that default to it
  // (local rank mod device count), so a GPU of its own keeps its whole percentage. The emulated
  // device's memory is the node's RAM: shared by the whole local world. The CUDA default (half
  // the device) is a percentage too; absolute sizes are each rank's own.
  const int world = core_.config().local_world_size;
  const bool cuda = core_.device()->kind() == "cuda";
  const int hbm_sharers =
      cuda ? RanksOnDevice(core_.config().cuda_device, world, st.devices_visible) : world;
  uint64_t& hbm_bytes = st.hbm_bytes;
  if (core_.config().hbm_bytes.bytes == 0 && core_.config().hbm_bytes.percent == 0) {
    hbm_bytes = core_.device()->default_budget() / static_cast<uint64_t>(cuda ? hbm_sharers : 1);
  } else {
    // Of the memory free now, beside what a framework already holds; of the whole device when
    // ranks share it (what is free would depend on which rank started first).
    const uint64_t base =
        hbm_sharers > 1 ? core_.device()->physical_bytes() : core_.device()->free_bytes();
    hbm_bytes = RankShare(core_.config().hbm_bytes, base, hbm_sharers, 4096);
  }
  // Named as the caller set it: tm_config.hbm_bytes is not found in the environment.
  const std::string budget = core_.config().SettingName("TIERMEM_HBM_BYTES");
  if (hbm_bytes == 0) {
    return Error(TM_ERR_CONFIG,
                 absl::StrFormat("%s=%s resolves to 0 bytes (shared by %d rank(s))", budget,
                                 core_.config().hbm_bytes.ToString(), hbm_sharers));
  }
  SetEntry(core_.mutable_config(), "TIERMEM_HBM_BYTES", SizeSetting{hbm_bytes, 0}.ToString());
  auto hbm = MemoryTier::CreateHbm(*core_.device(), hbm_bytes, core_.config().device_allocator,
                                   core_.info().cuda_device, core_.config().hbm_layout, budget);
  if (!hbm.ok()) return hbm.status();
  if ((*hbm)->space().capacity() == 0) {
    // Below the tier's granule nothing could ever be placed: said now, as for a DRAM budget of
    // 0, not at the first acquire.
    return Error(TM_ERR_CONFIG,
                 absl::StrFormat("%s=%llu is below the HBM tier's granule (%llu "
                                 "bytes): no tensor could ever be placed there",
                                 budget, static_cast<unsigned long long>(hbm_bytes),
                                 static_cast<unsigned long long>((*hbm)->space().granule())));
  }
  // The mapped layout counts the budget in whole chunks, rounded down: said once, here, or the
  // tier is smaller than asked for without a word. A warning for a size the caller gave; a
  // share of the device rarely falls on a chunk, and that is only worth an info line.
  const uint64_t capacity = (*hbm)->space().capacity();
  if (core_.config().hbm_layout == HbmLayout::kMapped && !core_.config().device_allocator.set() &&
      capacity < hbm_bytes) {
    const bool given = core_.config().hbm_bytes.percent == 0 && core_.config().hbm_bytes.bytes != 0;
    Log(given ? LogSeverity::kWarn : LogSeverity::kInfo,
        "TIERMEM_HBM_LAYOUT=mapped: %s=%s is not a whole number of %s chunks; the HBM tier holds "
        "%s (rounded down)",
        budget.c_str(), HumanBytes(hbm_bytes).c_str(),
        HumanBytes((*hbm)->space().granule()).c_str(), HumanBytes(capacity).c_str());
  }

  return std::move(*hbm);
}

absl::Status Runtime::InitLowerTiers(Setup& st, std::unique_ptr<MemoryTier> hbm) {
  const int world = core_.config().local_world_size;
  // Whole stripes over every path, so that the tier rounds nothing up past the share.
  const uint64_t stripes =
      static_cast<uint64_t>(core_.config().io_block_size) * core_.config().nvme_paths.size();
  // Rounded down, as the other budgets are: the tier never takes more than it was given.
  // (NvmeTier::Create rounds the same way, and names the budget as given in its errors.)
  const uint64_t given = RankShare(core_.config().nvme_bytes,
                                   NvmeNodeBytes(core_.config().nvme_paths), world, stripes);
  const uint64_t nvme_bytes = st.nvme_bytes = stripes > 0 ? given - given % stripes : given;
  // The budgets are named as the caller set them (see InitHbm).
  const std::string nvme_budget = core_.config().SettingName("TIERMEM_NVME_BYTES");
  const std::string dram_budget = core_.config().SettingName("TIERMEM_DRAM_BYTES");
  if (nvme_bytes == 0) {
    // A percentage is of the file systems' size, shared by the node's ranks; a size is this
    // rank's own (an outside client read "shared by 2 rank(s)" as its 256KiB being split).
    const std::string share =
        core_.config().nvme_bytes.percent > 0
            ? absl::StrFormat(
                  "the file systems of %s hold %llu bytes, shared by %d rank(s), ",
                  core_.config().SettingName("TIERMEM_NVME_PATHS"),
                  static_cast<unsigned long long>(NvmeNodeBytes(core_.config().nvme_paths)), world)
            : std::string();
    return Error(TM_ERR_CONFIG,
                 absl::StrFormat("%s=%s resolves to 0 bytes (%sin whole stripes of %llu bytes: %s "
                                 "times the paths); the least budget is %llu bytes",
                                 nvme_budget, core_.config().nvme_bytes.ToString(), share,
                                 static_cast<unsigned long long>(stripes),
                                 core_.config().SettingName("TIERMEM_IO_BLOCK_SIZE"),
                                 static_cast<unsigned long long>(stripes)));
  }
  auto nvme = NvmeTier::Create(core_.config().nvme_paths, given, core_.config().io_block_size,
                               {nvme_budget, core_.config().SettingName("TIERMEM_NVME_PATHS"),
                                core_.config().SettingName("TIERMEM_IO_BLOCK_SIZE")});
  if (!nvme.ok()) return nvme.status();

  const uint64_t granule = std::max<uint64_t>(4096, (*nvme)->alignment());
  const uint64_t dram_bytes = st.dram_bytes =
      RankShare(core_.config().dram_bytes, PhysicalRam(), world, granule);
  if (dram_bytes == 0) {
    return Error(TM_ERR_CONFIG,
                 absl::StrFormat("%s=%s resolves to 0 bytes (shared by %d rank(s))", dram_budget,
                                 core_.config().dram_bytes.ToString(), world));
  }
  // HBM <-> NVMe moves are staged in pinned slots at the end of the DRAM pool.
  const StagingRing::Shape shape = st.shape = StagingRing::ShapeFor(
      dram_bytes, std::max<uint64_t>(4ull << 20, core_.config().io_block_size), granule);
  auto dram = MemoryTier::CreateDram(*core_.device(), core_.topology(), dram_bytes, st.node,
                                     granule, shape.bytes(), dram_budget);
  if (!dram.ok() && ToTmStatus(dram.status()) != TM_ERR_CONFIG &&
      core_.config().numa == NumaMode::kAuto && st.node >= 0) {
    // Unbound, then: warned about only when that works (when it fails too, its error is the one
    // that says why, without a warning that the tier went on).
    auto unbound = MemoryTier::CreateDram(*core_.device(), core_.topology(), dram_bytes, -1,
                                          granule, shape.bytes(), dram_budget);
    if (unbound.ok()) {
      Log(LogSeverity::kWarn, "%s; the DRAM tier is left unbound",
          std::string(dram.status().message()).c_str());
      st.node = -1;
    }
    dram = std::move(unbound);
  }
  if (!dram.ok()) return dram.status();
  // A percentage's effective value is the bytes it resolved to, as for HBM (InitHbm).
  if (core_.config().dram_bytes.percent > 0)
    SetEntry(core_.mutable_config(), "TIERMEM_DRAM_BYTES", SizeSetting{dram_bytes, 0}.ToString());
  if (core_.config().nvme_bytes.percent > 0)
    SetEntry(core_.mutable_config(), "TIERMEM_NVME_BYTES", SizeSetting{nvme_bytes, 0}.ToString());
  core_.set_tiers(std::make_unique<Tiers>(std::move(hbm), std::move(*dram), std::move(*nvme)));
  core_.mutable_info().numa_node = st.node;
  core_.mutable_info().tier_bytes[TM_TIER_HBM] = core_.tiers()->space(TM_TIER_HBM).capacity();
  core_.mutable_info().tier_bytes[TM_TIER_DRAM] = core_.tiers()->space(TM_TIER_DRAM).capacity();
  core_.mutable_info().tier_bytes[TM_TIER_NVME] = core_.tiers()->space(TM_TIER_NVME).capacity();

  return absl::OkStatus();
}

absl::Status Runtime::InitEngines(Setup& st) {
  // The I/O engine.
  io::IoEngineOptions opts;
  opts.block_size = core_.config().io_block_size;
  opts.queue_depth = core_.config().io_queue_depth;
  opts.threads = core_.config().io_threads;
  opts.buffers.push_back({core_.tiers()->dram().base(), core_.tiers()->dram().mapped_bytes()});
  for (const auto& f : core_.tiers()->nvme().files()) opts.files.push_back(f->fd());
  if (core_.config().io_engine == IoEngineKind::kPosix) {
    core_.set_io(io::CreatePosixEngine(opts));
  } else if (auto uring = io::CreateUringEngine(opts); uring.ok()) {
    core_.set_io(std::move(*uring));
  } else if (core_.config().io_engine == IoEngineKind::kUring) {
    return Error(TM_ERR_UNSUPPORTED,
                 absl::StrFormat("TIERMEM_IO_ENGINE=uring: %s", uring.status().message()));
  } else {
    Log(LogSeverity::kWarn, "TIERMEM_IO_ENGINE=auto: io_uring is unavailable (%s); using posix",
        std::string(uring.status().message()).c_str());
    core_.set_io(io::CreatePosixEngine(opts));
  }
  core_.mutable_info().io_engine = std::string(core_.io()->name());
  core_.mutable_info().io_buffers_registered = core_.io()->buffers_registered();
  core_.mutable_info().io_files_registered = core_.io()->files_registered();
  core_.mutable_info().staging_chunk = st.shape.chunk;
  core_.mutable_info().staging_slots = st.shape.slots;
  core_.set_staging(std::make_unique<StagingRing>(core_.tiers()->dram().reserved(), st.shape));
  // One sum per I/O block, or per staging chunk when the DRAM budget made chunks smaller: a
  // power of two dividing the chunk, so every chunk-by-chunk transfer covers whole blocks.
  if (core_.config().checksum == ChecksumKind::kXxh3) {
    core_.tiers()->nvme().EnableChecksums(
        std::min<uint64_t>(core_.config().io_block_size, st.shape.chunk & -st.shape.chunk));
  }
  for (const auto& f : core_.tiers()->nvme().files()) {
    core_.mutable_info().nvme.push_back(
        {f->dir(), f->direct(), f->alignment(), f->alignment_source(), f->size(), f->reserved()});
  }
  core_.set_mover(
      std::make_unique<Mover>(*core_.tiers(), *core_.device(), *core_.io(), *core_.staging()));
  // Opened now, not at destroy: a path that cannot be written fails create (TM_ERR_CONFIG).
  auto trace = Trace::Open(core_.config().trace, core_.config().local_rank,
                           core_.config().SettingName("TIERMEM_TRACE"));
  if (!trace.ok()) return trace.status();
  core_.set_trace(std::move(*trace));
  core_.mutable_info().prefetch_bytes =
      core_.config().prefetch_bytes.bytes == 0 && core_.config().prefetch_bytes.percent == 0
          ? st.hbm_bytes / 2
          : core_.config().prefetch_bytes.Resolve(st.hbm_bytes);
  prefetcher_.set_prefetch_limit(core_.info().prefetch_bytes);
  return absl::OkStatus();
}

void Runtime::StartMovers(const Setup& st) {
  // Asynchronous moves run on a few threads of their own; the engines below them keep the
  // links busy (each mover keeps the I/O queue depth in flight).
  movers_.Start(kMoverThreads);
  Log(LogSeverity::kInfo,
      "runtime ready: %s, HBM %s, DRAM %s (NUMA node %d), NVMe %s on %zu path(s), %s I/O",
      core_.info().device.c_str(), HumanBytes(st.hbm_bytes).c_str(),
      HumanBytes(st.dram_bytes).c_str(), st.node, HumanBytes(st.nvme_bytes).c_str(),
      core_.config().nvme_paths.size(), core_.info().io_engine.c_str());
}

}  // namespace tiermem
