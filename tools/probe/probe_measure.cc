// tiermem-probe's measurements: HBM copies by the device clock, the raw NVMe sweep, the runtime's
// own paths, and the end-to-end offload demo.
#include "tools/probe/probe_measure.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_format.h"
#include "io/host_memory.h"
#include "lib/base/status.h"
#include "lib/trace/trace.h"

namespace tiermem {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A byte pattern that differs per tensor and per position.
void Fill(std::vector<uint8_t>& buf, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < buf.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(buf.data() + i, &x, std::min<size_t>(8, buf.size() - i));
  }
}

double Median3(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[1];
}

}  // namespace

// One progress line on stderr: rewritten in place on a terminal, a line per step otherwise.
void Progress(const std::string& what) {
  static const bool tty = isatty(STDERR_FILENO) != 0;
  if (tty) {
    std::fprintf(stderr, "\r\033[Ktiermem-probe: %s", what.c_str());
  } else {
    std::fprintf(stderr, "tiermem-probe: %s\n", what.c_str());
  }
}
void ProgressDone() {
  if (isatty(STDERR_FILENO) != 0) std::fprintf(stderr, "\r\033[K");
}

// DRAM <-> NVMe through offload / acquire, and DRAM <-> HBM through acquire / offload: the real
// paths, engines, block size and queue depth; medians of three, data checked.
absl::StatusOr<std::vector<Measurement>> Bench(Runtime& rt, uint64_t bytes) {
  std::vector<Measurement> out;
  tm_stats s = rt.Stats();
  bytes = std::min({bytes, s.tiers[TM_TIER_DRAM].capacity / 2, s.tiers[TM_TIER_NVME].capacity / 2,
                    s.tiers[TM_TIER_HBM].capacity / 2});
  bytes = bytes / (1 << 20) * (1 << 20);
  if (bytes == 0) return out;
  auto h = rt.CreateTensor({bytes, TM_CLASS_OTHER, TM_TIER_DRAM, "probe-bandwidth"});
  if (!h.ok()) return h.status();
  std::vector<uint8_t> data(bytes);
  Fill(data, 7);
  if (auto st = rt.Write(*h, 0, data.data(), bytes); !st.ok()) return st;
  std::vector<double> write_s, read_s, up_s, down_s;
  Progress("measuring dram <-> nvme through the runtime");
  for (int i = 0; i < 3; ++i) {
    // A write acquire makes the NVMe copy stale, so that every offload really writes.
    auto dirty = rt.Acquire(*h, TM_TIER_DRAM, TM_ACCESS_READ_WRITE, nullptr);
    if (!dirty.ok()) return dirty.status();
    if (auto st = rt.Release(*h, TM_TIER_DRAM); !st.ok()) return st;
    auto t0 = Clock::now();
    if (auto st = rt.Offload(*h, TM_TIER_NVME); !st.ok()) return st;
    if (auto st = rt.Sync(*h); !st.ok()) return st;
    write_s.push_back(Seconds(Clock::now() - t0));
    t0 = Clock::now();
    auto p = rt.Acquire(*h, TM_TIER_DRAM, TM_ACCESS_READ, nullptr);
    if (!p.ok()) return p.status();
    read_s.push_back(Seconds(Clock::now() - t0));
    if (std::memcmp(*p, data.data(), bytes) != 0) {
      return Error(TM_ERR_INTERNAL, "bandwidth run read back different bytes");
    }
    if (auto st = rt.Release(*h, TM_TIER_DRAM); !st.ok()) return st;
  }
  Progress("measuring dram <-> hbm through the runtime");
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    auto up = rt.Acquire(*h, TM_TIER_HBM, TM_ACCESS_READ_WRITE, nullptr);  // copies up, drops below
    if (!up.ok()) return up.status();
    up_s.push_back(Seconds(Clock::now() - t0));
    if (auto st = rt.Release(*h, TM_TIER_HBM); !st.ok()) return st;
    t0 = Clock::now();
    if (auto st = rt.Offload(*h, TM_TIER_DRAM); !st.ok()) return st;
    if (auto st = rt.Sync(*h); !st.ok()) return st;
    down_s.push_back(Seconds(Clock::now() - t0));
  }
  std::vector<uint8_t> back(bytes);
  if (auto st = rt.Read(*h, 0, back.data(), bytes); !st.ok()) return st;
  if (back != data) return Error(TM_ERR_INTERNAL, "bandwidth run read back different bytes");
  const double gb = static_cast<double>(bytes) / 1e9;
  out.push_back({"dram", "nvme", bytes, gb / Median3(write_s)});
  out.push_back({"nvme", "dram", bytes, gb / Median3(read_s)});
  out.push_back({"dram", "hbm", bytes, gb / Median3(up_s)});
  out.push_back({"hbm", "dram", bytes, gb / Median3(down_s)});
  if (auto st = rt.DestroyTensor(*h); !st.ok()) return st;
  return out;
}

// Tensors worth 1.5x a 256 MiB HBM budget: written into HBM and offloaded to NVMe, brought back
// one by one and checked byte for byte, read back from NVMe (exclusive tiers).
absl::StatusOr<DemoResult> Demo() {
  ConfigOverrides o;
  o.hbm_bytes = SizeSetting{256ull << 20, 0};
  auto cfg = LoadConfig(o, ProcessEnvironment(), {});
  if (!cfg.ok()) return Error(TM_ERR_CONFIG, cfg.status().message());
  // The demo proves the round trip through NVMe: with inclusive DRAM (the default) a clean
  // DRAM copy would answer every read back, and NVMe would never be read.
  cfg->dram_inclusive = false;
  auto created = Runtime::Create(*cfg);
  if (!created.ok()) return created.status();
  Runtime& rt = **created;
  const uint64_t hbm = rt.Stats().tiers[TM_TIER_HBM].capacity;
  const uint64_t size = 64ull << 20;
  const int count = static_cast<int>((hbm * 3 / 2 + size - 1) / size);
  Progress("running the offload demo");
  std::vector<uint64_t> handles;
  std::vector<uint8_t> data(size), back(size);
  int offloads = 0;
  auto t0 = Clock::now();
  // Each tensor is written in HBM, then sent to NVMe while the next one is written: more than
  // HBM holds passes through it. Then each comes back to HBM and is checked byte for byte.
  for (int i = 0; i < count; ++i) {
    auto h =
        rt.CreateTensor({size, TM_CLASS_ACTIVATION, TM_TIER_HBM, absl::StrFormat("act-%d", i)});
    if (!h.ok()) return h.status();
    Fill(data, static_cast<uint64_t>(i));
    if (auto st = rt.Write(*h, 0, data.data(), size); !st.ok()) return st;
    if (auto st = rt.Offload(*h, TM_TIER_NVME); !st.ok()) return st;
    ++offloads;
    handles.push_back(*h);
  }
  if (auto st = rt.SyncAll(); !st.ok()) return st;
  int verified = 0;
  for (int i = 0; i < count; ++i) {
    uint64_t h = handles[i];
    auto p = rt.Acquire(h, TM_TIER_HBM, TM_ACCESS_READ, nullptr);
    if (!p.ok()) return p.status();
    Fill(data, static_cast<uint64_t>(i));
    if (auto st = rt.Read(h, 0, back.data(), size); !st.ok()) return st;
    if (auto st = rt.Release(h, TM_TIER_HBM); !st.ok()) return st;
    if (std::memcmp(data.data(), back.data(), size) != 0) {
      return Error(TM_ERR_INTERNAL, absl::StrFormat("tensor act-%d came back different", i));
    }
    ++verified;
  }
  DemoResult r;
  r.seconds = Seconds(Clock::now() - t0);
  r.tensors = count;
  r.offloads = offloads;
  r.verified = verified;
  r.tensor_bytes = size;
  r.hbm_budget = hbm;
  r.stats = rt.Stats();
  for (uint64_t h : handles) {
    if (auto st = rt.DestroyTensor(h); !st.ok()) return st;
  }
  return r;
}

absl::StatusOr<std::vector<CopyMeasurement>> Copies(Runtime& rt, uint64_t bytes, int repeats) {
  io::Device& dev = rt.device();
  bytes = std::max<uint64_t>(bytes / (1 << 20) * (1 << 20), 1 << 20);
  auto d1 = dev.AllocateSlab(bytes);
  if (!d1.ok()) return d1.status();
  auto d2 = dev.AllocateSlab(bytes);
  if (!d2.ok()) {
    dev.FreeSlab(*d1, bytes);
    return d2.status();
  }
  // Bound where the DRAM tier is: on a two-socket host an unbound buffer may measure the remote
  // socket's link, and the planner takes its link figure from this row.
  auto pinned = io::HostRegion::Create(bytes, rt.topology(), rt.info().numa_node);
  std::vector<uint8_t> pageable(bytes, 1);
  absl::Status st = pinned.status();
  // pinned is unset when the host memory could not be mapped: st says why.
  bool registered = false;
  if (st.ok()) st = dev.Fill(*d1, 3, bytes);
  if (st.ok()) st = dev.Fill(*d2, 4, bytes);
  if (st.ok()) {
    std::memset((*pinned)->data(), 2, bytes);
    st = dev.RegisterHost((*pinned)->data(), bytes);
    registered = st.ok();
  }
  std::vector<CopyMeasurement> out;
  using Kind = io::Device::CopyKind;
  struct Case {
    const char *from, *to, *mem;
    Kind kind;
    void* dst;
    const void* src;
  };
  if (st.ok()) {
    void* host = (*pinned)->data();
    const Case cases[] = {
        {"dram", "hbm", "pinned", Kind::kHostToDevice, *d1, host},
        {"hbm", "dram", "pinned", Kind::kDeviceToHost, host, *d1},
        {"dram", "hbm", "pageable", Kind::kHostToDevice, *d1, pageable.data()},
        {"hbm", "dram", "pageable", Kind::kDeviceToHost, pageable.data(), *d1},
        {"hbm", "hbm", "", Kind::kDeviceToDevice, *d2, *d1},
    };
    for (const Case& c : cases) {
      Progress(absl::StrFormat("measuring %s -> %s %s copies", c.from, c.to, c.mem));
      // Warm up until two copies agree within 10% and are no longer getting faster: memory
      // touched for the first time (on a VM, for several passes) costs page faults that are not
      // the link's. At most 10 rounds or 10 seconds.
      const auto warm_start = std::chrono::steady_clock::now();
      double best = 0;
      for (int w = 0; w < 10 && Seconds(std::chrono::steady_clock::now() - warm_start) < 10; ++w) {
        auto t = dev.TimeCopies(c.kind, c.dst, c.src, bytes, 2);
        if (!t.ok()) break;
        const double lo = std::min((*t)[0], (*t)[1]), hi = std::max((*t)[0], (*t)[1]);
        const bool steady = hi <= 1.1 * lo && w > 0 && lo >= 0.9 * best;
        best = w == 0 ? lo : std::min(best, lo);
        if (steady) break;
      }
      auto t = dev.TimeCopies(c.kind, c.dst, c.src, bytes, repeats);
      if (!t.ok()) {
        st = t.status();
        break;
      }
      std::sort(t->begin(), t->end());
      out.push_back({c.from, c.to, c.mem, bytes, repeats,
                     static_cast<double>(bytes) / 1e9 / (*t)[t->size() / 2]});
    }
  }
  if (registered) dev.UnregisterHost((*pinned)->data());
  dev.FreeSlab(*d2, bytes);
  dev.FreeSlab(*d1, bytes);
  if (!st.ok()) return st;
  return out;
}

absl::StatusOr<std::vector<SweepTarget>> Sweep(const Config& c, const SweepOptions& o) {
  std::vector<SweepTarget> targets;
  if (c.nvme_paths.size() > 1) {
    for (const auto& p : c.nvme_paths) targets.push_back({p, {p}, "", 0, {}});
  }
  targets.push_back(
      {c.nvme_paths.size() > 1 ? "striped" : c.nvme_paths[0], c.nvme_paths, "", 0, {}});
  // With many paths, a full grid on each alone would take minutes: each path alone is swept
  // over the depths at the configured block size, unless asked for in full.
  const bool per_path_full = o.full_per_path || c.nvme_paths.size() <= kFullGridPaths;
  for (SweepTarget& t : targets) {
    const bool alone = t.paths.size() == 1 && c.nvme_paths.size() > 1;
    const std::vector<uint32_t> blocks =
        alone && !per_path_full ? std::vector<uint32_t>{c.io_block_size} : o.blocks;
    // Whole stripes of the largest block on every path.
    const uint64_t unit = *std::max_element(blocks.begin(), blocks.end()) * t.paths.size();
    const uint64_t bytes = std::max<uint64_t>(o.bytes / unit, 1) * unit;
    auto s = IoSweep::Create(t.paths, bytes, c.io_engine);
    if (!s.ok()) return s.status();
    t.bytes = bytes;
    size_t done = 0;
    for (uint32_t b : blocks) {
      for (uint32_t q : o.depths) {
        Progress(absl::StrFormat("nvme sweep %s: block %s, queue depth %u (%zu of %zu)", t.name,
                                 HumanBytes(b), q, ++done, blocks.size() * o.depths.size()));
        auto p = (*s)->Measure(b, q, c.io_threads, 3);
        if (absl::IsInvalidArgument(p.status())) continue;  // below the O_DIRECT alignment
        if (!p.ok()) return p.status();
        t.points.push_back(*p);
      }
    }
    t.engine = (*s)->engine();
  }
  return targets;
}

const IoPoint* Best(const SweepTarget& t) {
  const IoPoint* best = nullptr;
  for (const IoPoint& p : t.points) {
    if (best == nullptr || p.combined_gbps() > best->combined_gbps()) best = &p;
  }
  return best;
}

}  // namespace tiermem
