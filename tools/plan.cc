// tiermem-plan: for a model shape, an HBM budget and the machine's bandwidths, what each rung
// of the ladder (keep, selective recompute, per-layer recompute, optimizer / activation /
// parameter offload) needs in HBM and adds to a step, and which one to use. --json for machines.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "lib/config/config.h"
#include "lib/plan/planner.h"
#include "lib/trace/trace.h"
#include "tools/probe_reading.h"

namespace tiermem {
namespace {

void Usage(FILE* f) {
  std::fprintf(
      f,
      "usage: tiermem-plan --layers L --hidden H --heads A --seq S --micro-batch B --params N\n"
      "                    --hbm SIZE --tflops T [--link-gbps G] [--nvme-gbps G] [--tp T]\n"
      "                    [--sequence-parallel] [--flash-attention] [--bytes-per-element E]\n"
      "                    [--probe FILE] [--json]\n"
      "  --params accepts 7e9 or 7B/70B/1.5T; --hbm a size (80GiB); bandwidths in GB/s (1e9 B/s);\n"
      "  --tflops is the achieved compute per GPU in 1e12 FLOP/s.\n"
      "  --probe FILE takes --link-gbps and --nvme-gbps from tiermem-probe --json output (given\n"
      "  flags win).\n");
}

bool Number(const std::string& v, double* out) {
  std::string n = v;
  double mult = 1;
  if (!n.empty()) {
    switch (n.back()) {
      case 'K':
        mult = 1e3;
        break;
      case 'M':
        mult = 1e6;
        break;
      case 'B':
      case 'G':
        mult = 1e9;
        break;
      case 'T':
        mult = 1e12;
        break;
      default:
        break;
    }
    if (mult != 1) n.pop_back();
  }
  if (!absl::SimpleAtod(n, out)) return false;
  *out *= mult;
  return true;
}

double GiB(double b) { return b / (1ull << 30); }

int Main(int argc, char** argv) {
  PlanInput in;
  bool json = false;
  double link = 0, nvme = 0, tflops = 0;
  std::string probe_file;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--json") {
      json = true;
      continue;
    }
    if (k == "--sequence-parallel") {
      in.sequence_parallel = true;
      continue;
    }
    if (k == "--flash-attention") {
      in.flash_attention = true;
      continue;
    }
    if (k == "--help" || k == "-h") {
      Usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      Usage(stderr);
      return 2;
    }
    std::string v = argv[++i];
    bool ok = true;
    if (k == "--probe") {
      probe_file = v;
    } else if (k == "--hbm") {
      auto size = ParseSize("--hbm", v);
      ok = size.ok() && size->percent == 0;
      if (ok) in.hbm_bytes = static_cast<double>(size->bytes);
    } else {
      double d = 0;
      ok = Number(v, &d);
      if (k == "--layers")
        in.layers = d;
      else if (k == "--hidden")
        in.hidden = d;
      else if (k == "--heads")
        in.heads = d;
      else if (k == "--seq")
        in.seq = d;
      else if (k == "--micro-batch")
        in.micro_batch = d;
      else if (k == "--params")
        in.params = d;
      else if (k == "--tp")
        in.tensor_parallel = d;
      else if (k == "--bytes-per-element")
        in.bytes_per_element = d;
      else if (k == "--link-gbps")
        link = d;
      else if (k == "--nvme-gbps")
        nvme = d;
      else if (k == "--tflops")
        tflops = d;
      else
        ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "tiermem-plan: bad argument %s %s\n", k.c_str(), v.c_str());
      Usage(stderr);
      return 2;
    }
  }
  in.link_bytes_per_s = link * 1e9;
  in.nvme_bytes_per_s = nvme * 1e9;
  std::string link_source = link > 0 ? "--link-gbps" : "";
  std::string nvme_source = nvme > 0 ? "--nvme-gbps" : "";
  if (!probe_file.empty()) {
    std::string text;
    if (std::FILE* f = std::fopen(probe_file.c_str(), "r")) {
      char buf[65536];
      size_t n = 0;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() < (64u << 20))
        text.append(buf, n);
      std::fclose(f);
    } else {
      std::fprintf(stderr, "tiermem-plan: --probe %s: %s\n", probe_file.c_str(),
                   std::strerror(errno));
      return 2;
    }
    auto probe = ReadProbeJson(text);
    if (!probe.ok()) {
      std::fprintf(stderr, "tiermem-plan: --probe %s: %s\n", probe_file.c_str(),
                   std::string(probe.status().message()).c_str());
      return 2;
    }
    if (link <= 0 && probe->link_bytes_per_s > 0) {
      in.link_bytes_per_s = probe->link_bytes_per_s;
      link_source = probe->link_source;
      if (!probe->gpu) {
        std::fprintf(stderr,
                     "tiermem-plan: warning: %s was measured without a GPU (%s): its HBM <-> DRAM "
                     "figure is host memory, not a PCIe link; give --link-gbps to override\n",
                     probe_file.c_str(), probe->device.c_str());
      }
    }
    if (nvme <= 0 && probe->nvme_bytes_per_s > 0) {
      in.nvme_bytes_per_s = probe->nvme_bytes_per_s;
      nvme_source = probe->nvme_source;
    }
  }
  in.flops_per_s = tflops * 1e12;
  auto plan = MakePlan(in);
  if (!plan.ok()) {
    std::fprintf(stderr, "tiermem-plan: %s\n", std::string(plan.status().message()).c_str());
    return 2;
  }
  const Plan& p = *plan;
  if (json) {
    std::printf(
        "{\"activation_bytes_per_layer\":{\"full\":%.0f,\"selective\":%.0f,\"checkpoint\":%.0f},\n"
        " \"model_state_bytes\":%.0f,\"forward_flops\":%.6g,\"step_compute_seconds\":%.6g,\n"
        " \"hbm_budget_bytes\":%.0f,\n \"link_gbps\":%.6g,\"link_source\":\"%s\","
        "\"nvme_gbps\":%.6g,\"nvme_source\":\"%s\",\n \"rungs\":[",
        p.activation_full, p.activation_selective, p.activation_checkpoint, p.model_state,
        p.forward_flops, p.step_compute_seconds, in.hbm_bytes, in.link_bytes_per_s / 1e9,
        JsonEscape(link_source).c_str(), in.nvme_bytes_per_s / 1e9,
        JsonEscape(nvme_source).c_str());
    for (int i = 0; i < kRungCount; ++i) {
      const RungResult& r = p.rungs[i];
      std::printf(
          "%s\n  "
          "{\"rung\":\"%s\",\"hbm_bytes\":%.0f,\"added_seconds\":%.6g,\"fits\":%s,\"available\":%"
          "s}",
          i ? "," : "", RungName(r.rung), r.hbm_bytes, r.added_seconds, r.fits ? "true" : "false",
          r.available ? "true" : "false");
    }
    std::printf("],\n \"recommended\":%s%s%s}\n", p.recommended < 0 ? "" : "\"",
                p.recommended < 0 ? "null" : RungName(p.rungs[p.recommended].rung),
                p.recommended < 0 ? "" : "\"");
    return 0;
  }
  std::printf(
      "activations per layer per GPU: %.3f GiB kept, %.3f GiB selective, %.3f GiB checkpointed\n",
      GiB(p.activation_full), GiB(p.activation_selective), GiB(p.activation_checkpoint));
  std::printf(
      "model state per GPU: %.2f GiB (16 B/param); compute %.3f s/step (forward %.4g FLOPs)\n",
      GiB(p.model_state), p.step_compute_seconds, p.forward_flops);
  std::printf("bandwidths: link %.2f GB/s (%s), nvme %.2f GB/s (%s)\n", in.link_bytes_per_s / 1e9,
              link_source.c_str(), in.nvme_bytes_per_s / 1e9,
              nvme_source.empty() ? "none" : nvme_source.c_str());
  std::printf("HBM budget: %.2f GiB\n\n%-30s %12s %14s %s\n", GiB(in.hbm_bytes), "rung", "HBM GiB",
              "added s/step", "fits");
  for (const RungResult& r : p.rungs) {
    std::printf("%-30s %12.2f %14.4f %s\n", RungName(r.rung), GiB(r.hbm_bytes), r.added_seconds,
                !r.available ? "n/a (no --nvme-gbps)"
                : r.fits     ? "yes"
                             : "no");
  }
  if (p.recommended < 0) {
    std::printf(
        "\nnothing fits: raise the budget, the tensor-parallel degree, or shrink the "
        "micro-batch\n");
    return 1;
  }
  const RungResult& best = p.rungs[p.recommended];
  std::printf("\nrecommended: %s (%.2f GiB, +%.4f s/step, +%.1f%%)\n", RungName(best.rung),
              GiB(best.hbm_bytes), best.added_seconds,
              100 * best.added_seconds / p.step_compute_seconds);
  return 0;
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) { return tiermem::Main(argc, argv); }
