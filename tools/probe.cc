// tiermem-probe: what tiermem finds on this machine, DRAM <-> NVMe bandwidth through the real
// path, and an end-to-end demo that pushes more tensors than HBM holds through NVMe and back.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>
#include <algorithm>

#include "absl/strings/str_format.h"
#include "lib/config.h"
#include "lib/runtime.h"
#include "lib/status.h"

namespace tiermem {
namespace {

using Clock = std::chrono::steady_clock;

void Usage() {
  std::printf(
      "usage: tiermem-probe [--config] [--no-bench] [--no-demo] [--bench-bytes SIZE]\n"
      "  --config           print every effective setting and where it came from, then exit\n"
      "  --no-bench         skip the DRAM <-> NVMe bandwidth measurement\n"
      "  --no-demo          skip the end-to-end offload demo\n"
      "  --bench-bytes SIZE bytes moved per bandwidth run (default 256MiB)\n"
      "Settings come from TIERMEM_* variables (docs/environment.md).\n");
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tiermem-probe: %s: %s\n", tm_status_string(ToTmStatus(s)),
               std::string(s.message()).c_str());
  return 1;
}

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

void PrintInfo(const Runtime& rt) {
  const RuntimeInfo& info = rt.info();
  const Config& c = rt.config();
  std::printf("device      %s\n", info.device.c_str());
  tm_stats s = const_cast<Runtime&>(rt).Stats();
  std::printf("tiers       hbm %s, dram %s, nvme %s\n",
              HumanBytes(s.tiers[TM_TIER_HBM].capacity).c_str(),
              HumanBytes(s.tiers[TM_TIER_DRAM].capacity).c_str(),
              HumanBytes(s.tiers[TM_TIER_NVME].capacity).c_str());
  if (info.numa_node >= 0) {
    std::printf("numa        DRAM tier bound to node %d of %d\n", info.numa_node, info.numa_nodes);
  } else {
    std::printf("numa        DRAM tier not bound (%d node(s))\n", info.numa_nodes);
  }
  std::printf("io engine   %s, block %s, queue depth %u, %u thread(s), %s buffers, %s files\n",
              info.io_engine.c_str(), HumanBytes(c.io_block_size).c_str(), c.io_queue_depth,
              c.io_threads, info.io_buffers_registered ? "registered" : "unregistered",
              info.io_files_registered ? "registered" : "unregistered");
  std::printf("staging     %u slots of %s in the DRAM pool (HBM <-> NVMe moves)\n",
              info.staging_slots, HumanBytes(info.staging_chunk).c_str());
  for (const auto& p : info.nvme) {
    std::printf("nvme path   %s: %s, alignment %u (%s), %s reserved\n", p.dir.c_str(),
                p.direct ? "O_DIRECT" : "buffered (O_DIRECT refused)", p.alignment,
                p.alignment_source.c_str(), HumanBytes(p.bytes).c_str());
  }
}

// Median of three timed DRAM -> NVMe offloads and NVMe -> DRAM acquires of one tensor.
absl::Status Bench(Runtime& rt, uint64_t bytes) {
  tm_stats s = rt.Stats();
  bytes = std::min({bytes, s.tiers[TM_TIER_DRAM].capacity / 2, s.tiers[TM_TIER_NVME].capacity / 2});
  bytes = bytes / (1 << 20) * (1 << 20);
  if (bytes == 0) return absl::OkStatus();
  auto h = rt.CreateTensor({bytes, TM_CLASS_OTHER, TM_TIER_DRAM, "probe-bandwidth"});
  if (!h.ok()) return h.status();
  std::vector<uint8_t> data(bytes);
  Fill(data, 7);
  if (auto st = rt.Write(*h, 0, data.data(), bytes); !st.ok()) return st;
  std::vector<double> write_s, read_s;
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
  std::sort(write_s.begin(), write_s.end());
  std::sort(read_s.begin(), read_s.end());
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf("bandwidth   DRAM -> NVMe write %7.2f GB/s   (%s, median of 3)\n", gb / write_s[1],
              HumanBytes(bytes).c_str());
  std::printf("bandwidth   NVMe -> DRAM read  %7.2f GB/s   (%s, median of 3)\n", gb / read_s[1],
              HumanBytes(bytes).c_str());
  return rt.DestroyTensor(*h);
}

// Tensors worth 1.5x a 256 MiB HBM budget: written into HBM, offloaded to NVMe when HBM is full,
// brought back one by one and checked byte for byte.
absl::Status Demo() {
  ConfigOverrides o;
  o.hbm_bytes = SizeSetting{256ull << 20, 0};
  auto cfg = LoadConfig(o, ProcessEnvironment(), {});
  if (!cfg.ok()) return Error(TM_ERR_CONFIG, cfg.status().message());
  auto created = Runtime::Create(*cfg);
  if (!created.ok()) return created.status();
  Runtime& rt = **created;
  const uint64_t hbm = rt.Stats().tiers[TM_TIER_HBM].capacity;
  const uint64_t size = 64ull << 20;
  const int count = static_cast<int>((hbm * 3 / 2 + size - 1) / size);
  std::printf("\ndemo        %d tensors of %s (%s) through an HBM budget of %s\n", count,
              HumanBytes(size).c_str(), HumanBytes(size * count).c_str(), HumanBytes(hbm).c_str());
  std::vector<uint64_t> handles;
  std::deque<uint64_t> in_hbm;  // oldest first
  std::vector<uint8_t> data(size), back(size);
  int offloads = 0;
  // Frees HBM by sending the oldest resident tensor to NVMe.
  auto make_room = [&]() -> absl::Status {
    if (in_hbm.empty()) return Error(TM_ERR_OUT_OF_MEMORY, "HBM full with nothing to offload");
    uint64_t victim = in_hbm.front();
    in_hbm.pop_front();
    ++offloads;
    if (auto s = rt.Offload(victim, TM_TIER_NVME); !s.ok()) return s;
    return rt.Sync(victim);
  };
  auto t0 = Clock::now();
  for (int i = 0; i < count; ++i) {
    auto h = rt.CreateTensor({size, TM_CLASS_ACTIVATION, TM_TIER_HBM, absl::StrFormat("act-%d", i)});
    if (!h.ok()) return h.status();
    Fill(data, static_cast<uint64_t>(i));
    absl::Status st;
    while (!(st = rt.Write(*h, 0, data.data(), size)).ok()) {
      if (ToTmStatus(st) != TM_ERR_OUT_OF_MEMORY) return st;
      if (auto m = make_room(); !m.ok()) return m;
    }
    handles.push_back(*h);
    in_hbm.push_back(*h);
  }
  int verified = 0;
  for (int i = 0; i < count; ++i) {
    uint64_t h = handles[i];
    absl::StatusOr<void*> p;
    while (!(p = rt.Acquire(h, TM_TIER_HBM, TM_ACCESS_READ, nullptr)).ok()) {
      if (ToTmStatus(p.status()) != TM_ERR_OUT_OF_MEMORY) return p.status();
      if (auto m = make_room(); !m.ok()) return m;
    }
    if (std::find(in_hbm.begin(), in_hbm.end(), h) == in_hbm.end()) in_hbm.push_back(h);
    Fill(data, static_cast<uint64_t>(i));
    if (auto st = rt.Read(h, 0, back.data(), size); !st.ok()) return st;
    if (auto st = rt.Release(h, TM_TIER_HBM); !st.ok()) return st;
    if (std::memcmp(data.data(), back.data(), size) != 0) {
      return Error(TM_ERR_INTERNAL, absl::StrFormat("tensor act-%d came back different", i));
    }
    ++verified;
  }
  double secs = Seconds(Clock::now() - t0);
  tm_stats s = rt.Stats();
  std::printf("demo        %d offloads to NVMe; %d/%d tensors came back bit-exact in %.2f s\n",
              offloads, verified, count, secs);
  std::printf("moved       hbm->dram %s, dram->nvme %s, nvme->dram %s, dram->hbm %s\n",
              HumanBytes(s.bytes_moved[TM_TIER_HBM][TM_TIER_DRAM]).c_str(),
              HumanBytes(s.bytes_moved[TM_TIER_DRAM][TM_TIER_NVME]).c_str(),
              HumanBytes(s.bytes_moved[TM_TIER_NVME][TM_TIER_DRAM]).c_str(),
              HumanBytes(s.bytes_moved[TM_TIER_DRAM][TM_TIER_HBM]).c_str());
  std::printf("peak        hbm %s of %s, dram %s, nvme %s\n",
              HumanBytes(s.tiers[TM_TIER_HBM].peak).c_str(),
              HumanBytes(s.tiers[TM_TIER_HBM].capacity).c_str(),
              HumanBytes(s.tiers[TM_TIER_DRAM].peak).c_str(),
              HumanBytes(s.tiers[TM_TIER_NVME].peak).c_str());
  for (uint64_t h : handles) {
    if (auto st = rt.DestroyTensor(h); !st.ok()) return st;
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  bool config_only = false, bench = true, demo = true;
  uint64_t bench_bytes = 256ull << 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config") {
      config_only = true;
    } else if (a == "--no-bench") {
      bench = false;
    } else if (a == "--no-demo") {
      demo = false;
    } else if (a == "--bench-bytes" && i + 1 < argc) {
      auto s = ParseSize("--bench-bytes", argv[++i]);
      if (!s.ok() || s->percent > 0 || s->bytes == 0) {
        std::fprintf(stderr, "tiermem-probe: --bench-bytes needs a size such as 256MiB\n");
        return 2;
      }
      bench_bytes = s->bytes;
    } else if (a == "--help" || a == "-h") {
      Usage();
      return 0;
    } else {
      std::fprintf(stderr, "tiermem-probe: unknown argument \"%s\"\n", a.c_str());
      Usage();
      return 2;
    }
  }
  auto cfg = LoadConfig({}, ProcessEnvironment(), ProcessTiermemVariables());
  if (!cfg.ok()) return Fail(Error(TM_ERR_CONFIG, cfg.status().message()));
  std::printf("tiermem-probe %d.%d.%d\n", TM_VERSION_MAJOR, TM_VERSION_MINOR, TM_VERSION_PATCH);
  auto rt = Runtime::Create(*cfg);
  if (!rt.ok()) return Fail(rt.status());
  if (config_only) {
    for (const auto& e : (*rt)->config().entries) {
      std::printf("%-24s %-16s (%s)\n", e.name.c_str(), e.value.c_str(), e.source.c_str());
    }
    return 0;
  }
  PrintInfo(**rt);
  if (bench) {
    if (auto s = Bench(**rt, bench_bytes); !s.ok()) return Fail(s);
  }
  rt->reset();
  if (demo) {
    if (auto s = Demo(); !s.ok()) return Fail(s);
  }
  return 0;
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) { return tiermem::Main(argc, argv); }
