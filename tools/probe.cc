// tiermem-probe: what tiermem finds on this machine, what its tiers can do (probe_measure.h),
// and --tune (tune.h); a table for humans or JSON (docs/probe.md).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "io/host_memory.h"
#include "lib/base/status.h"
#include "lib/config/config.h"
#include "lib/runtime/runtime.h"
#include "lib/trace/trace.h"
#include "tools/io_sweep.h"
#include "tools/probe_dram.h"
#include "tools/probe_measure.h"
#include "tools/tune.h"

namespace tiermem {
namespace {

using Clock = std::chrono::steady_clock;

void Usage() {
  std::printf(
      "usage: tiermem-probe [--config] [--json] [--no-bench] [--no-sweep] [--no-demo] "
      "[--sweep-only]\n"
      "                     [--bench-bytes SIZE] [--sweep-bytes SIZE] [--sweep-blocks LIST]\n"
      "                     [--sweep-depths LIST] [--sweep-full] [--repeats N]\n"
      "       tiermem-probe --tune [--tune-budget SECONDS] [--tune-out FILE] [--tune-bytes SIZE]\n"
      "                     [--json]\n"
      "  --config             print every effective setting and where it came from, then exit\n"
      "  --json               print the findings as JSON (schema: docs/probe.md)\n"
      "  --no-bench           skip every bandwidth measurement\n"
      "  --no-sweep           skip the DRAM <-> NVMe block size x queue depth sweep\n"
      "  --no-demo            skip the end-to-end offload demo\n"
      "  --sweep-only         run only the sweep (for bench/fio_compare.sh)\n"
      "  --bench-bytes SIZE   bytes per copy and runtime-path run (default 256MiB)\n"
      "  --sweep-bytes SIZE   bytes per sweep run, over all paths (default 256MiB)\n"
      "  --sweep-blocks LIST  block sizes of the sweep (default 128KiB,256KiB,1MiB,4MiB)\n"
      "  --sweep-depths LIST  queue depths of the sweep (default 1,4,16,32,64)\n"
      "  --sweep-full         the whole grid on each NVMe path alone, however many (default:\n"
      "                       with over 2 paths, each alone at the configured block size only)\n"
      "  --repeats N          timed copies per HBM measurement, median taken (default 5)\n"
      "  --tune               search I/O block size, queue depth, threads and prefetch depth;\n"
      "                       write them to an env file for TIERMEM_ENV_FILE\n"
      "  --tune-budget SECONDS  time the search may take (default 60)\n"
      "  --tune-out FILE      where the env file goes (default ./tiermem.env)\n"
      "  --tune-bytes SIZE    bytes per I/O measurement of the tuner (default 256MiB)\n"
      "Settings come from TIERMEM_* variables (docs/environment.md).\n");
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tiermem-probe: %s: %s\n", tm_status_string(ToTmStatus(s)),
               std::string(s.message()).c_str());
  return 1;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

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

struct Findings {
  std::vector<Measurement> bw;
  std::vector<CopyMeasurement> copies;
  std::optional<DramMeasurement> dram;
  std::vector<SweepTarget> sweep;
  std::optional<DemoResult> demo;
  std::optional<TuneResult> tune;
  std::string tune_file;
  double seconds = 0;
};

void PrintSweep(const SweepTarget& t) {
  std::printf("\nnvme sweep  %s (%s, %s per run, %u thread(s), median of 3): write / read GB/s\n",
              t.name.c_str(), t.engine.c_str(), HumanBytes(t.bytes).c_str(),
              t.points.empty() ? 0 : t.points[0].threads);
  std::vector<uint32_t> blocks, depths;
  for (const IoPoint& p : t.points) {
    if (std::find(blocks.begin(), blocks.end(), p.block_size) == blocks.end())
      blocks.push_back(p.block_size);
    if (std::find(depths.begin(), depths.end(), p.queue_depth) == depths.end())
      depths.push_back(p.queue_depth);
  }
  std::printf("  %-8s", "block");
  for (uint32_t q : depths) std::printf("  %13s", absl::StrFormat("qd %u", q).c_str());
  std::printf("\n");
  for (uint32_t b : blocks) {
    std::printf("  %-8s", HumanBytes(b).c_str());
    for (uint32_t q : depths) {
      std::string cell = "-";
      for (const IoPoint& p : t.points) {
        if (p.block_size == b && p.queue_depth == q) {
          cell = absl::StrFormat("%.2f / %.2f", p.write_gbps, p.read_gbps);
        }
      }
      std::printf("  %13s", cell.c_str());
    }
    std::printf("\n");
  }
  if (const IoPoint* best = Best(t)) {
    std::printf("  best     block %s, queue depth %u: write %.2f, read %.2f GB/s\n",
                HumanBytes(best->block_size).c_str(), best->queue_depth, best->write_gbps,
                best->read_gbps);
  }
}

void PrintTune(const TuneResult& r, const std::string& file) {
  std::printf("\ntune        %.0f s%s, engine %s\n", r.seconds,
              r.budget_exhausted ? " (budget reached: search cut short)" : "", r.engine.c_str());
  for (const IoPoint& p : r.io_tried) {
    std::printf("  tried     block %-7s qd %-4u threads %-2u  write %6.2f  read %6.2f GB/s\n",
                HumanBytes(p.block_size).c_str(), p.queue_depth, p.threads, p.write_gbps,
                p.read_gbps);
  }
  std::printf("  I/O       defaults block %s qd %u threads %u: %.2f / %.2f GB/s\n",
              HumanBytes(r.io_default.block_size).c_str(), r.io_default.queue_depth,
              r.io_default.threads, r.io_default.write_gbps, r.io_default.read_gbps);
  std::printf("  I/O       tuned    block %s qd %u threads %u: %.2f / %.2f GB/s (%.2fx)%s\n",
              HumanBytes(r.io_tuned.block_size).c_str(), r.io_tuned.queue_depth, r.io_tuned.threads,
              r.io_tuned.write_gbps, r.io_tuned.read_gbps,
              r.io_default.combined_gbps() > 0
                  ? r.io_tuned.combined_gbps() / r.io_default.combined_gbps()
                  : 0.0,
              r.io_kept_default ? ", defaults kept" : "");
  std::printf("  prefetch  step workload, %.2f ms compute per forward layer:", r.compute_ms);
  for (const auto& [d, sec] : r.depth_tried) std::printf(" depth %u %.1f ms;", d, sec * 1e3);
  std::printf(" chosen %u (default %u)\n", r.depth_tuned, r.depth_default);
  if (r.depth_rejected != 0) {
    std::printf("  prefetch  depth %u looked faster but lost a recheck against %u\n",
                r.depth_rejected, r.depth_default);
  }
  std::printf("  wrote     %s\n  use it    export TIERMEM_ENV_FILE=%s\n", file.c_str(),
              file.c_str());
}

void PrintHuman(Runtime& rt, const Findings& f) {
  PrintInfo(rt);
  const RuntimeInfo& info = rt.info();
  if (!info.no_gpu.empty()) {
    std::printf("gpu         none used (%s): HBM figures are the emulated device's\n",
                info.no_gpu.c_str());
  }
  if (!f.copies.empty() || f.dram.has_value()) std::printf("\n");
  if (f.dram.has_value()) std::printf("%s", DramRow(*f.dram).c_str());
  for (const CopyMeasurement& m : f.copies) {
    std::printf("copy        %-4s -> %-4s %-9s %8.2f GB/s   (%s, %s, median of %d)\n", m.from, m.to,
                m.host_memory, m.gbps, HumanBytes(m.bytes).c_str(),
                info.device_kind == "cuda" ? "CUDA events" : "wall clock", m.repeats);
  }
  for (const SweepTarget& t : f.sweep) PrintSweep(t);
  if (!f.bw.empty()) std::printf("\n");
  for (const Measurement& m : f.bw) {
    std::printf(
        "runtime     %-4s -> %-4s %7.2f GB/s   (%s through offload / acquire, median of 3)\n",
        m.from, m.to, m.gbps, HumanBytes(m.bytes).c_str());
  }
  if (f.tune.has_value()) PrintTune(*f.tune, f.tune_file);
  if (f.demo.has_value()) {
    const DemoResult& d = *f.demo;
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
  std::printf("\nprobe took %.1f s\n", f.seconds);
}

std::string JsonPoint(const IoPoint& p) {
  return absl::StrFormat(
      "{\"block_size\": %u, \"queue_depth\": %u, \"threads\": %u, "
      "\"write_gbps\": %.4f, \"read_gbps\": %.4f}",
      p.block_size, p.queue_depth, p.threads, p.write_gbps, p.read_gbps);
}

void PrintJson(Runtime& rt, const Findings& f) {
  const RuntimeInfo& info = rt.info();
  const Config& c = rt.config();
  tm_stats s = rt.Stats();
  std::printf("{\n  \"schema\": \"tiermem-probe/1\",\n  \"tiermem_version\": \"%s\",\n",
              tm_version_string());
  std::printf("  \"seconds\": %.3f,\n", f.seconds);
  std::printf("  \"device\": {\"kind\": \"%s\", \"description\": \"%s\"},\n",
              info.device_kind.c_str(), JsonEscape(info.device).c_str());
  std::printf("  \"gpu\": {\"present\": %s, \"reason\": \"%s\"},\n",
              info.device_kind == "cuda" ? "true" : "false", JsonEscape(info.no_gpu).c_str());
  std::printf("  \"tiers\": {\"hbm_bytes\": %llu, \"dram_bytes\": %llu, \"nvme_bytes\": %llu},\n",
              static_cast<unsigned long long>(s.tiers[TM_TIER_HBM].capacity),
              static_cast<unsigned long long>(s.tiers[TM_TIER_DRAM].capacity),
              static_cast<unsigned long long>(s.tiers[TM_TIER_NVME].capacity));
  std::printf("  \"numa\": {\"node\": %d, \"nodes\": %d},\n", info.numa_node, info.numa_nodes);
  std::printf(
      "  \"io\": {\"engine\": \"%s\", \"block_size\": %u, \"queue_depth\": %u, "
      "\"threads\": %u, \"buffers_registered\": %s, \"files_registered\": %s},\n",
      info.io_engine.c_str(), c.io_block_size, c.io_queue_depth, c.io_threads,
      info.io_buffers_registered ? "true" : "false", info.io_files_registered ? "true" : "false");
  std::printf("  \"staging\": {\"slot_bytes\": %llu, \"slots\": %u},\n",
              static_cast<unsigned long long>(info.staging_chunk), info.staging_slots);
  std::printf("  \"nvme_paths\": [");
  for (size_t i = 0; i < info.nvme.size(); ++i) {
    const auto& p = info.nvme[i];
    std::printf(
        "%s\n    {\"path\": \"%s\", \"direct\": %s, \"alignment\": %u, "
        "\"alignment_source\": \"%s\", \"bytes\": %llu}",
        i ? "," : "", JsonEscape(p.dir).c_str(), p.direct ? "true" : "false", p.alignment,
        p.alignment_source.c_str(), static_cast<unsigned long long>(p.bytes));
  }
  std::printf("],\n  \"copies\": [");
  for (size_t i = 0; i < f.copies.size(); ++i) {
    const CopyMeasurement& m = f.copies[i];
    std::printf(
        "%s\n    {\"from\": \"%s\", \"to\": \"%s\", \"host_memory\": \"%s\", "
        "\"bytes\": %llu, \"repeats\": %d, \"timer\": \"%s\", \"gbps\": %.4f}",
        i ? "," : "", m.from, m.to, m.host_memory, static_cast<unsigned long long>(m.bytes),
        m.repeats, info.device_kind == "cuda" ? "cuda-events" : "wall-clock", m.gbps);
  }
  std::printf("],\n  \"io_sweep\": [");
  for (size_t i = 0; i < f.sweep.size(); ++i) {
    const SweepTarget& t = f.sweep[i];
    std::string paths;
    for (const auto& p : t.paths) {
      absl::StrAppend(&paths, paths.empty() ? "" : ", ", "\"", JsonEscape(p), "\"");
    }
    std::printf(
        "%s\n    {\"target\": \"%s\", \"paths\": [%s], \"engine\": \"%s\", \"bytes\": %llu,"
        "\n     \"points\": [",
        i ? "," : "", JsonEscape(t.name).c_str(), paths.c_str(), t.engine.c_str(),
        static_cast<unsigned long long>(t.bytes));
    for (size_t j = 0; j < t.points.size(); ++j) {
      std::printf("%s\n       %s", j ? "," : "", JsonPoint(t.points[j]).c_str());
    }
    std::printf("]");
    if (const IoPoint* best = Best(t))
      std::printf(",\n     \"best\": %s", JsonPoint(*best).c_str());
    std::printf("}");
  }
  std::printf("],\n  \"bandwidth\": [");
  for (size_t i = 0; i < f.bw.size(); ++i) {
    std::printf(
        "%s\n    {\"from\": \"%s\", \"to\": \"%s\", \"bytes\": %llu, \"block_size\": %u, "
        "\"queue_depth\": %u, \"gbps\": %.4f}",
        i ? "," : "", f.bw[i].from, f.bw[i].to, static_cast<unsigned long long>(f.bw[i].bytes),
        c.io_block_size, c.io_queue_depth, f.bw[i].gbps);
  }
  std::printf("]");
  if (f.dram.has_value()) std::printf(",\n  %s", DramJson(*f.dram).c_str());
  if (f.tune.has_value()) {
    const TuneResult& r = *f.tune;
    std::printf(
        ",\n  \"tune\": {\"file\": \"%s\", \"seconds\": %.3f, \"budget_exhausted\": %s, "
        "\"engine\": \"%s\",\n    \"io_default\": %s,\n    \"io_tuned\": %s,\n"
        "    \"io_kept_default\": %s, \"compute_ms\": %.4f, \"prefetch_depth_default\": %u, "
        "\"prefetch_depth\": %u, \"prefetch_depth_rejected\": %u,\n    \"io_tried\": [",
        JsonEscape(f.tune_file).c_str(), r.seconds, r.budget_exhausted ? "true" : "false",
        r.engine.c_str(), JsonPoint(r.io_default).c_str(), JsonPoint(r.io_tuned).c_str(),
        r.io_kept_default ? "true" : "false", r.compute_ms, r.depth_default, r.depth_tuned,
        r.depth_rejected);
    for (size_t i = 0; i < r.io_tried.size(); ++i) {
      std::printf("%s\n      %s", i ? "," : "", JsonPoint(r.io_tried[i]).c_str());
    }
    std::printf("],\n    \"prefetch_tried\": [");
    for (size_t i = 0; i < r.depth_tried.size(); ++i) {
      std::printf("%s{\"depth\": %u, \"step_seconds\": %.6f}", i ? ", " : "",
                  r.depth_tried[i].first, r.depth_tried[i].second);
    }
    std::printf("]}");
  }
  if (f.demo.has_value()) {
    const DemoResult& d = *f.demo;
    std::printf(
        ",\n  \"demo\": {\"tensors\": %d, \"tensor_bytes\": %llu, \"hbm_budget\": %llu, "
        "\"offloads\": %d, \"verified\": %d, \"seconds\": %.4f}",
        d.tensors, static_cast<unsigned long long>(d.tensor_bytes),
        static_cast<unsigned long long>(d.hbm_budget), d.offloads, d.verified, d.seconds);
  }
  std::printf("\n}\n");
}

// "128KiB,1MiB" -> sizes; "1,4,16" -> counts. Empty optional on a bad list.
std::optional<std::vector<uint32_t>> ParseList(const char* flag, const char* text, bool sizes) {
  std::vector<uint32_t> out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    if (sizes) {
      auto s = ParseSize(flag, item);
      if (!s.ok() || s->percent > 0 || s->bytes < 4096 || s->bytes > (64u << 20) ||
          (s->bytes & (s->bytes - 1)) != 0) {
        return std::nullopt;
      }
      out.push_back(static_cast<uint32_t>(s->bytes));
    } else {
      auto v = ParseUnsigned(flag, item);
      if (!v.ok() || *v < 1 || *v > 4096) return std::nullopt;
      out.push_back(static_cast<uint32_t>(*v));
    }
  }
  if (out.empty()) return std::nullopt;
  return out;
}

int Usage2(const char* msg) {
  std::fprintf(stderr, "tiermem-probe: %s\n", msg);
  return 2;
}

int Main(int argc, char** argv) {
  const auto start = Clock::now();
  bool config_only = false, bench = true, sweep = true, demo = true, json = false, tune = false;
  bool sweep_only = false;
  uint64_t bench_bytes = 256ull << 20;
  int repeats = 5;
  SweepOptions so;
  TuneOptions to;
  std::string tune_out = "tiermem.env";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--config") {
      config_only = true;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--no-bench") {
      bench = false;
    } else if (a == "--no-sweep") {
      sweep = false;
    } else if (a == "--sweep-full") {
      so.full_per_path = true;
    } else if (a == "--sweep-only") {
      sweep_only = true;
      demo = false;
    } else if (a == "--no-demo") {
      demo = false;
    } else if (a == "--tune") {
      tune = true;
    } else if ((a == "--bench-bytes" || a == "--sweep-bytes" || a == "--tune-bytes") && has_value) {
      auto s = ParseSize(a, argv[++i]);
      if (!s.ok() || s->percent > 0 || s->bytes < (1u << 20) || s->bytes > (64ull << 30)) {
        return Usage2((a + " needs a size from 1MiB to 64GiB, such as 256MiB").c_str());
      }
      (a == "--bench-bytes"   ? bench_bytes
       : a == "--sweep-bytes" ? so.bytes
                              : to.io_bytes) = s->bytes / (1 << 20) * (1 << 20);
    } else if (a == "--sweep-blocks" && has_value) {
      auto l = ParseList("--sweep-blocks", argv[++i], true);
      if (!l.has_value())
        return Usage2("--sweep-blocks needs powers of two from 4KiB to 64MiB, such as 128KiB,1MiB");
      so.blocks = *l;
    } else if (a == "--sweep-depths" && has_value) {
      auto l = ParseList("--sweep-depths", argv[++i], false);
      if (!l.has_value())
        return Usage2("--sweep-depths needs queue depths from 1 to 4096, such as 1,4,32");
      so.depths = *l;
    } else if (a == "--repeats" && has_value) {
      auto v = ParseUnsigned("--repeats", argv[++i]);
      if (!v.ok() || *v < 1 || *v > 1000) return Usage2("--repeats needs a count from 1 to 1000");
      repeats = static_cast<int>(*v);
    } else if (a == "--tune-budget" && has_value) {
      double v = 0;
      if (!absl::SimpleAtod(argv[++i], &v) || !(v >= 1 && v <= 86400)) {
        return Usage2("--tune-budget needs seconds from 1 to 86400");
      }
      to.budget_seconds = v;
    } else if (a == "--tune-out" && has_value) {
      tune_out = argv[++i];
      if (tune_out.empty()) return Usage2("--tune-out needs a file name");
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
  // The probe measures the tiers, not inclusive DRAM's hits: with a clean DRAM copy kept, the
  // "nvme -> dram" acquire would be a no-op reported at 100+ TB/s. --config still prints the
  // setting as configured.
  Config measured = *cfg;
  measured.dram_inclusive = false;
  auto rt = Runtime::Create(measured);
  if (!rt.ok()) return Fail(rt.status());
  if (config_only) {
    for (const auto& e : (*rt)->config().entries) {
      std::printf("%-24s %-16s (%s)\n", e.name.c_str(), e.value.c_str(), e.source.c_str());
    }
    return 0;
  }
  Findings f;
  if (tune) {
    // The tuner runs alone: its measurements need the machine to themselves.
    auto r = Tune(*cfg, to, [](const std::string& s) { Progress(s); });
    if (!r.ok()) return Fail(r.status());
    f.tune = *r;
    char abs[4096];
    f.tune_file = tune_out[0] == '/' || getcwd(abs, sizeof abs) == nullptr
                      ? tune_out
                      : std::string(abs) + "/" + tune_out;
    std::FILE* out = std::fopen(f.tune_file.c_str(), "w");
    const std::string text = EnvFileText(*r, *cfg, f.tune_file);
    if (out == nullptr || std::fputs(text.c_str(), out) < 0 || std::fclose(out) != 0) {
      return Fail(Error(TM_ERR_IO,
                        absl::StrFormat("cannot write %s: %s", f.tune_file, std::strerror(errno))));
    }
    // The file must load as the runtime will load it.
    const std::string written = f.tune_file;
    auto check = LoadConfig({},
                            [&written](const char* name) -> std::optional<std::string> {
                              if (std::string_view(name) == "TIERMEM_ENV_FILE") return written;
                              return std::nullopt;
                            },
                            {});
    if (!check.ok()) return Fail(Error(TM_ERR_INTERNAL, check.status().message()));
    for (const char* v : {"TIERMEM_IO_BLOCK_SIZE", "TIERMEM_IO_QUEUE_DEPTH", "TIERMEM_IO_THREADS",
                          "TIERMEM_PREFETCH_DEPTH", "TIERMEM_NVME_GBPS"}) {
      if (std::getenv(v) != nullptr) {
        std::fprintf(stderr, "tiermem-probe: %s is set in the environment and wins over %s\n", v,
                     f.tune_file.c_str());
      }
    }
  } else {
    if (bench && !sweep_only) {
      Progress("measuring dram: triad");
      auto dram = DramTriad(bench_bytes, repeats);
      if (!dram.ok()) return Fail(dram.status());
      f.dram = *dram;
      auto copies = Copies(**rt, bench_bytes, repeats);
      if (!copies.ok()) return Fail(copies.status());
      f.copies = std::move(*copies);
    }
    if ((bench && sweep) || sweep_only) {
      auto s = Sweep(*cfg, so);
      if (!s.ok()) return Fail(s.status());
      f.sweep = std::move(*s);
    }
    if (bench && !sweep_only) {
      auto m = Bench(**rt, bench_bytes);
      if (!m.ok()) return Fail(m.status());
      f.bw = std::move(*m);
    }
    if (demo) {
      auto d = Demo();
      if (!d.ok()) return Fail(d.status());
      f.demo = *d;
    }
  }
  ProgressDone();
  f.seconds = Seconds(Clock::now() - start);
  if (json) {
    PrintJson(**rt, f);
  } else {
    PrintHuman(**rt, f);
  }
  if (f.demo.has_value() && f.demo->verified != f.demo->tensors) return 1;
  return 0;
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) { return tiermem::Main(argc, argv); }
