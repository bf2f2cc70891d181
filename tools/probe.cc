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
#include <optional>

#include "absl/strings/str_format.h"
#include "lib/config.h"
#include "lib/runtime.h"
#include "lib/status.h"
#include "lib/trace.h"

namespace tiermem {
namespace {

using Clock = std::chrono::steady_clock;

void Usage() {
  std::printf(
      "usage: tiermem-probe [--config] [--json] [--no-bench] [--no-demo] [--bench-bytes SIZE]\n"
      "  --config           print every effective setting and where it came from, then exit\n"
      "  --json             print the findings as JSON (schema: docs/probe.md)\n"
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

struct Measurement {
  const char* from;
  const char* to;
  uint64_t bytes;
  double gbps;  // 1e9 bytes per second, median of 3
};

double Median3(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[1];
}

void Progress(const char* what) { std::fprintf(stderr, "tiermem-probe: measuring %s\n", what); }

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
  Progress("dram <-> nvme");
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
  Progress("dram <-> hbm");
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

struct DemoResult {
  int tensors = 0, offloads = 0, verified = 0;
  uint64_t tensor_bytes = 0, hbm_budget = 0;
  double seconds = 0;
  tm_stats stats{};
};

// Tensors worth 1.5x a 256 MiB HBM budget: written into HBM and offloaded to NVMe, brought back
// one by one and checked byte for byte.
absl::StatusOr<DemoResult> Demo() {
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
  Progress("the offload demo");
  std::vector<uint64_t> handles;
  std::vector<uint8_t> data(size), back(size);
  int offloads = 0;
  auto t0 = Clock::now();
  // Each tensor is written in HBM, then sent to NVMe while the next one is written: more than
  // HBM holds passes through it. Then each comes back to HBM and is checked byte for byte.
  for (int i = 0; i < count; ++i) {
    auto h = rt.CreateTensor({size, TM_CLASS_ACTIVATION, TM_TIER_HBM, absl::StrFormat("act-%d", i)});
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

void PrintHuman(const Runtime& rt, const std::vector<Measurement>& bw,
                const std::optional<DemoResult>& demo) {
  PrintInfo(rt);
  for (const Measurement& m : bw) {
    std::printf("bandwidth   %-4s -> %-4s %7.2f GB/s   (%s, median of 3)\n", m.from, m.to, m.gbps,
                HumanBytes(m.bytes).c_str());
  }
  if (!demo.has_value()) return;
  const DemoResult& d = *demo;
  const tm_stats& s = d.stats;
  std::printf("\ndemo        %d tensors of %s (%s) through an HBM budget of %s\n", d.tensors,
              HumanBytes(d.tensor_bytes).c_str(), HumanBytes(d.tensor_bytes * d.tensors).c_str(),
              HumanBytes(d.hbm_budget).c_str());
  std::printf("demo        %d offloads to NVMe; %d/%d tensors came back bit-exact in %.2f s\n",
              d.offloads, d.verified, d.tensors, d.seconds);
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
}

void PrintJson(const Runtime& rt, const std::vector<Measurement>& bw,
               const std::optional<DemoResult>& demo) {
  const RuntimeInfo& info = rt.info();
  const Config& c = rt.config();
  tm_stats s = const_cast<Runtime&>(rt).Stats();
  std::printf("{\n  \"schema\": \"tiermem-probe/1\",\n  \"tiermem_version\": \"%s\",\n",
              tm_version_string());
  std::printf("  \"device\": {\"kind\": \"%s\", \"description\": \"%s\"},\n",
              info.device_kind.c_str(), JsonEscape(info.device).c_str());
  std::printf("  \"tiers\": {\"hbm_bytes\": %llu, \"dram_bytes\": %llu, \"nvme_bytes\": %llu},\n",
              static_cast<unsigned long long>(s.tiers[TM_TIER_HBM].capacity),
              static_cast<unsigned long long>(s.tiers[TM_TIER_DRAM].capacity),
              static_cast<unsigned long long>(s.tiers[TM_TIER_NVME].capacity));
  std::printf("  \"numa\": {\"node\": %d, \"nodes\": %d},\n", info.numa_node, info.numa_nodes);
  std::printf("  \"io\": {\"engine\": \"%s\", \"block_size\": %u, \"queue_depth\": %u, "
              "\"threads\": %u, \"buffers_registered\": %s, \"files_registered\": %s},\n",
              info.io_engine.c_str(), c.io_block_size, c.io_queue_depth, c.io_threads,
              info.io_buffers_registered ? "true" : "false",
              info.io_files_registered ? "true" : "false");
  std::printf("  \"staging\": {\"slot_bytes\": %llu, \"slots\": %u},\n",
              static_cast<unsigned long long>(info.staging_chunk), info.staging_slots);
  std::printf("  \"nvme_paths\": [");
  for (size_t i = 0; i < info.nvme.size(); ++i) {
    const auto& p = info.nvme[i];
    std::printf("%s\n    {\"path\": \"%s\", \"direct\": %s, \"alignment\": %u, "
                "\"alignment_source\": \"%s\", \"bytes\": %llu}",
                i ? "," : "", JsonEscape(p.dir).c_str(), p.direct ? "true" : "false", p.alignment,
                p.alignment_source.c_str(), static_cast<unsigned long long>(p.bytes));
  }
  std::printf("],\n  \"bandwidth\": [");
  for (size_t i = 0; i < bw.size(); ++i) {
    std::printf("%s\n    {\"from\": \"%s\", \"to\": \"%s\", \"bytes\": %llu, \"block_size\": %u, "
                "\"queue_depth\": %u, \"gbps\": %.4f}",
                i ? "," : "", bw[i].from, bw[i].to, static_cast<unsigned long long>(bw[i].bytes),
                c.io_block_size, c.io_queue_depth, bw[i].gbps);
  }
  std::printf("]");
  if (demo.has_value()) {
    std::printf(",\n  \"demo\": {\"tensors\": %d, \"tensor_bytes\": %llu, \"hbm_budget\": %llu, "
                "\"offloads\": %d, \"verified\": %d, \"seconds\": %.4f}",
                demo->tensors, static_cast<unsigned long long>(demo->tensor_bytes),
                static_cast<unsigned long long>(demo->hbm_budget), demo->offloads, demo->verified,
                demo->seconds);
  }
  std::printf("\n}\n");
}

int Main(int argc, char** argv) {
  bool config_only = false, bench = true, demo = true, json = false;
  uint64_t bench_bytes = 256ull << 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--config") {
      config_only = true;
    } else if (a == "--json") {
      json = true;
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
  if (!json) std::printf("tiermem-probe %s\n", tm_version_string());
  auto rt = Runtime::Create(*cfg);
  if (!rt.ok()) return Fail(rt.status());
  if (config_only) {
    for (const auto& e : (*rt)->config().entries) {
      std::printf("%-24s %-16s (%s)\n", e.name.c_str(), e.value.c_str(), e.source.c_str());
    }
    return 0;
  }
  std::vector<Measurement> bw;
  if (bench) {
    auto m = Bench(**rt, bench_bytes);
    if (!m.ok()) return Fail(m.status());
    bw = std::move(*m);
  }
  std::optional<DemoResult> result;
  if (demo) {
    auto d = Demo();
    if (!d.ok()) return Fail(d.status());
    result = *d;
  }
  if (json) {
    PrintJson(**rt, bw, result);
  } else {
    PrintHuman(**rt, bw, result);
  }
  if (result.has_value() && result->verified != result->tensors) return 1;
  return 0;
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) { return tiermem::Main(argc, argv); }
