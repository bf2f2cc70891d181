// tiermem-probe's report (probe_print.h).
#include "tools/probe/probe_print.h"

#include <cinttypes>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "lib/trace/trace.h"

namespace tiermem {
namespace {

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
    std::printf("nvme path   %s: %s, alignment %u (%s), %s %s\n", p.dir.c_str(),
                p.direct ? "O_DIRECT" : "buffered (O_DIRECT refused)", p.alignment,
                p.alignment_source.c_str(), HumanBytes(p.bytes).c_str(),
                p.reserved ? "reserved" : "sized, not reserved (the file system has no fallocate)");
  }
}

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
  if (r.io_rejected.has_value()) {
    const IoPoint& p = *r.io_rejected;
    std::printf(
        "  I/O       search's pick block %s qd %u threads %u: %.2f / %.2f GB/s (%.2fx): "
        "lost the final check\n",
        HumanBytes(p.block_size).c_str(), p.queue_depth, p.threads, p.write_gbps, p.read_gbps,
        r.io_default.combined_gbps() > 0 ? p.combined_gbps() / r.io_default.combined_gbps() : 0.0);
  }
  std::printf("  prefetch  step workload, %.2f ms compute per forward layer:", r.compute_ms);
  for (const auto& [d, sec] : r.depth_tried) std::printf(" depth %u %.1f ms;", d, sec * 1e3);
  if (r.depth_tried.empty()) {  // as the env file says it
    std::printf(" not measured (the budget ran out first): the setting in effect, %u, kept\n",
                r.depth_tuned);
  } else {
    std::printf(" chosen %u (default %u)\n", r.depth_tuned, r.depth_default);
  }
  if (r.depth_rejected != 0) {
    std::printf("  prefetch  depth %u looked faster but lost a recheck against %u\n",
                r.depth_rejected, r.depth_default);
  }
  std::printf("  wrote     %s\n  use it    export TIERMEM_ENV_FILE=%s\n", file.c_str(),
              file.c_str());
}

std::string JsonPoint(const IoPoint& p) {
  return absl::StrFormat(
      "{\"block_size\": %u, \"queue_depth\": %u, \"threads\": %u, "
      "\"write_gbps\": %.4f, \"read_gbps\": %.4f}",
      p.block_size, p.queue_depth, p.threads, p.write_gbps, p.read_gbps);
}

}  // namespace

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
        "\"alignment_source\": \"%s\", \"bytes\": %llu, \"reserved\": %s}",
        i ? "," : "", JsonEscape(p.dir).c_str(), p.direct ? "true" : "false", p.alignment,
        p.alignment_source.c_str(), static_cast<unsigned long long>(p.bytes),
        p.reserved ? "true" : "false");
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
        "    \"io_kept_default\": %s, \"io_rejected\": %s,\n    \"compute_ms\": %.4f, "
        "\"prefetch_depth_default\": %u, \"prefetch_depth\": %u, \"prefetch_depth_rejected\": %u,\n"
        "    \"io_tried\": [",
        JsonEscape(f.tune_file).c_str(), r.seconds, r.budget_exhausted ? "true" : "false",
        r.engine.c_str(), JsonPoint(r.io_default).c_str(), JsonPoint(r.io_tuned).c_str(),
        r.io_kept_default ? "true" : "false",
        r.io_rejected.has_value() ? JsonPoint(*r.io_rejected).c_str() : "null", r.compute_ms,
        r.depth_default, r.depth_tuned, r.depth_rejected);
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

}  // namespace tiermem
