// tiermem-plan's table and JSON. The table shows the cumulative ladder for teaching, then the
// combinations that fit, cheapest first, and why the cheaper ones lose (they do not fit).
#include "tools/plan/plan_print.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "lib/plan/plan_ladder.h"
#include "lib/trace/trace.h"

namespace tiermem {
namespace {

// The table's unit of size: GiB, or MiB under a budget below 1 GiB (a small model's sizes all
// read 0.03 GiB otherwise). Set by PrintPlanText; JSON gives bytes.
struct SizeUnit {
  double bytes;
  const char* name;
};
SizeUnit unit{static_cast<double>(1ull << 30), "GiB"};

double Sz(double b) { return b / unit.bytes; }

// GB/s with two decimals, or three significant digits below 0.1 (0.001 read as 0.00, "none").
std::string Gbps(double bytes_per_s) {
  const double g = bytes_per_s / 1e9;
  return g > 0 && g < 0.1 ? absl::StrFormat("%.3g", g) : absl::StrFormat("%.2f", g);
}
std::string Hbm() { return std::string("HBM ") + unit.name; }

// Indices of p.combinations ordered as the planner ranks them: least added time, fewer rungs.
std::vector<int> Ranked(const Plan& p) {
  std::vector<int> order(p.combinations.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const PlanPrice &x = p.combinations[a], &y = p.combinations[b];
    if (x.added_seconds != y.added_seconds) return x.added_seconds < y.added_seconds;
    return std::popcount(x.rungs) < std::popcount(y.rungs);
  });
  return order;
}

std::string Missing(const PlanPrice& c, const PlanInput& in) {
  std::string why;
  if ((c.rungs & RungBit(Rung::kOptimizerOffload)) != 0 && in.dram_bytes_per_s <= 0) {
    why = "no DRAM bandwidth";
  }
  if ((c.rungs & (RungBit(Rung::kActivationOffloadNvme) | RungBit(Rung::kParameterOffload))) != 0 &&
      in.nvme_bytes_per_s <= 0) {
    why += why.empty() ? "no NVMe bandwidth" : ", no NVMe bandwidth";
  }
  return why;
}

// The CPU step with its state on NVMe: the DRAM it needs, at the least and for the disk's speed.
void PrintNvmeOptimizerStep(const PlanInput& in, const Plan& p) {
  if (in.nvme_bytes_per_s <= 0) {
    std::printf(
        "  with its state on NVMe (%.2f %s): not priced (no NVMe bandwidth); any DRAM budget of\n"
        "  %.0f KiB and up runs it (the DRAM tier, beside tiermem's staging pool)\n",
        Sz(p.optimizer_state_bytes), unit.name, p.optimizer_nvme_least_dram / 1024);
    return;
  }
  std::printf(
      "  with its state on NVMe (%.2f %s, read and written once a step): %.3f s at %.2f GB/s;\n"
      "  DRAM tier: %.0f KiB at the least, about %.0f MiB for the disk's speed\n",
      Sz(p.optimizer_state_bytes), unit.name, p.optimizer_nvme_seconds, in.nvme_bytes_per_s / 1e9,
      p.optimizer_nvme_least_dram / 1024, p.optimizer_nvme_full_speed_dram / (1 << 20));
}

void PrintOptimizerStep(const PlanInput& in, const Plan& p) {
  const double params = in.params / in.tensor_parallel;
  if (in.dram_bytes_per_s <= 0) {
    std::printf(
        "optimizer step on the CPU: not priced (no DRAM bandwidth: give --dram-gbps, or --probe\n"
        "  with a dram triad row); optimizer-state offload is left out\n");
    PrintNvmeOptimizerStep(in, p);
    return;
  }
  std::printf(
      "optimizer step on the CPU: %g B/param x %.4g params / %.2f GB/s = %.3f s; backward\n"
      "  %.3f s before recompute; ZeRO-Offload moves 2 B/param of grads down and 2 B/param of\n"
      "  params up: %.2f GB over the link\n",
      in.optimizer_bytes_per_param, params, in.dram_bytes_per_s / 1e9, p.optimizer_step_seconds,
      p.backward_seconds, p.optimizer_link_bytes / 1e9);
  PrintNvmeOptimizerStep(in, p);
}

void PrintWhy(const PlanPrice& c) {
  if ((c.rungs & RungBit(Rung::kOptimizerOffload)) != 0) {
    if (c.optimizer_exposed_seconds > 0) {
      std::printf("  the CPU optimizer step (%.3f s) outlasts backward (%.3f s): +%.4f s\n",
                  c.optimizer_step_seconds, c.backward_seconds, c.optimizer_exposed_seconds);
    } else {
      std::printf(
          "  the CPU optimizer step (%.3f s) hides under backward (%.3f s with recompute)\n",
          c.optimizer_step_seconds, c.backward_seconds);
    }
  }
  if (c.transfer_seconds > 0) {
    std::printf(
        "  transfers take %.3f s (%.2f GB over the link, %.2f GB to and from NVMe): %s\n",
        c.transfer_seconds, c.link_bytes / 1e9, c.nvme_bytes / 1e9,
        c.transfer_exposed_seconds > 0 ? "compute hides part of them" : "compute hides them");
  }
}

// The combinations that fit, cheapest first, each with its parts and its distance to the best.
void PrintFitting(const Plan& p, const std::vector<int>& order, const PlanPrice* best) {
  int fitting = 0;
  for (const PlanPrice& c : p.combinations) fitting += c.fits ? 1 : 0;
  std::printf("\ncombinations that fit, cheapest first (%d of %zu):\n", fitting,
              p.combinations.size());
  std::printf("%8s %9s %9s %9s %9s %9s  %s\n", Hbm().c_str(), "added s", "recompute", "transfer",
              "optimizer", "vs best", "combination");
  for (int i : order) {
    const PlanPrice& c = p.combinations[i];
    if (!c.fits) continue;
    const std::string vs = &c == best ? "best"
                           : c.added_seconds == best->added_seconds
                               ? "tie"
                               : absl::StrFormat("+%.4f", c.added_seconds - best->added_seconds);
    std::printf("%8.2f %9.4f %9.4f %9.4f %9.4f %9s  %s\n", Sz(c.hbm_bytes), c.added_seconds,
                c.recompute_seconds, c.transfer_exposed_seconds, c.optimizer_exposed_seconds,
                vs.c_str(), RungSetName(c.rungs).c_str());
  }
}

// Why the others lose: those ranked before the best do not fit; those not priced lack a
// bandwidth.
void PrintLosers(const PlanInput& in, const Plan& p, const std::vector<int>& order,
                 const PlanPrice* best) {
  bool header = false;
  for (int i : order) {
    const PlanPrice& c = p.combinations[i];
    if (&c == best) break;
    if (c.fits || !c.available) continue;
    if (!header) {
      std::printf("\nas cheap or cheaper, but over the budget:\n%8s %9s  %s\n", Hbm().c_str(),
                  "added s", "combination");
      header = true;
    }
    std::printf("%8.2f %9.4f  %s\n", Sz(c.hbm_bytes), c.added_seconds,
                RungSetName(c.rungs).c_str());
  }
  int unavailable = 0, would_fit = 0;
  std::string reasons;
  for (const PlanPrice& c : p.combinations) {
    if (c.available) continue;
    ++unavailable;
    would_fit += c.hbm_bytes <= in.hbm_bytes ? 1 : 0;
    const std::string why = Missing(c, in);
    if (reasons.find(why) == std::string::npos) reasons += (reasons.empty() ? "" : "; ") + why;
  }
  if (unavailable > 0) {
    std::printf("\nnot priced: %d combinations (%s); %d of them would fit the budget\n",
                unavailable, reasons.c_str(), would_fit);
  }
}

}  // namespace

int PrintPlanText(const PlanInput& in, const Plan& p, const PlanSources& src) {
  unit = in.hbm_bytes < static_cast<double>(1ull << 30)
             ? SizeUnit{static_cast<double>(1ull << 20), "MiB"}
             : SizeUnit{static_cast<double>(1ull << 30), "GiB"};
  std::printf(
      "activations per layer per GPU: %.3f %s kept, %.3f %s selective, %.3f %s checkpointed\n",
      Sz(p.activation_full), unit.name, Sz(p.activation_selective), unit.name,
      Sz(p.activation_checkpoint), unit.name);
  std::printf(
      "model state per GPU: %.2f %s (16 B/param); compute %.3f s/step (forward %.4g FLOPs)\n",
      Sz(p.model_state), unit.name, p.step_compute_seconds, p.forward_flops);
  std::printf("bandwidths: link %s GB/s (%s), nvme %s GB/s (%s), dram %s GB/s (%s)\n",
              Gbps(in.link_bytes_per_s).c_str(), src.link.c_str(),
              Gbps(in.nvme_bytes_per_s).c_str(), src.nvme.empty() ? "none" : src.nvme.c_str(),
              Gbps(in.dram_bytes_per_s).c_str(), src.dram.empty() ? "none" : src.dram.c_str());
  PrintOptimizerStep(in, p);
  std::printf("HBM budget: %.2f %s\n", Sz(in.hbm_bytes), unit.name);

  std::printf("\nthe ladder, each rung on top of those before it:\n%-30s %12s %14s %s\n", "rung",
              Hbm().c_str(), "added s/step", "fits");
  for (const RungResult& r : p.rungs) {
    std::printf("%-30s %12.2f %14.4f %s\n", RungName(r.rung), Sz(r.hbm_bytes), r.added_seconds,
                !r.available ? "n/a"
                : r.fits     ? "yes"
                             : "no");
  }

  const std::vector<int> order = Ranked(p);
  const PlanPrice* best =
      p.recommended_combination >= 0 ? &p.combinations[p.recommended_combination] : nullptr;
  PrintFitting(p, order, best);
  PrintLosers(in, p, order, best);
  if (best == nullptr) {
    std::printf(
        "\nnothing fits: raise the budget, the tensor-parallel degree, or shrink the "
        "micro-batch\n");
    return 1;
  }
  std::printf("\nrecommended: %s (%.2f %s, +%.4f s/step, +%.1f%%)\n",
              RungSetName(best->rungs).c_str(), Sz(best->hbm_bytes), unit.name, best->added_seconds,
              100 * best->added_seconds / p.step_compute_seconds);
  PrintWhy(*best);
  return 0;
}

namespace {

std::string JsonNames(RungSet set) {
  std::string out = "[";
  for (int i = 1; i < kRungCount; ++i) {
    if ((set & RungBit(static_cast<Rung>(i))) == 0) continue;
    out += absl::StrFormat("%s\"%s\"", out.size() > 1 ? "," : "", RungName(static_cast<Rung>(i)));
  }
  return out + "]";
}

const char* Bool(bool b) { return b ? "true" : "false"; }

}  // namespace

int PrintPlanJson(const PlanInput& in, const Plan& p, const PlanSources& src) {
  std::printf(
      "{\"activation_bytes_per_layer\":{\"full\":%.0f,\"selective\":%.0f,\"checkpoint\":%.0f},\n"
      " \"model_state_bytes\":%.0f,\"forward_flops\":%.6g,\"step_compute_seconds\":%.6g,\n"
      " \"backward_seconds\":%.6g,\"hbm_budget_bytes\":%.0f,\n"
      " \"link_gbps\":%.6g,\"link_source\":\"%s\",\"nvme_gbps\":%.6g,\"nvme_source\":\"%s\",\n"
      " \"dram_gbps\":%.6g,\"dram_source\":\"%s\",\n",
      p.activation_full, p.activation_selective, p.activation_checkpoint, p.model_state,
      p.forward_flops, p.step_compute_seconds, p.backward_seconds, in.hbm_bytes,
      in.link_bytes_per_s / 1e9, JsonEscape(src.link).c_str(), in.nvme_bytes_per_s / 1e9,
      JsonEscape(src.nvme).c_str(), in.dram_bytes_per_s / 1e9, JsonEscape(src.dram).c_str());
  std::printf(
      " \"optimizer_step\":{\"priced\":%s,\"bytes_per_param\":%.6g,\"params_per_gpu\":%.6g,"
      "\"cpu_seconds\":%.6g,\"link_bytes\":%.0f,\"link_seconds\":%.6g,\n"
      "  \"state_bytes\":%.0f,\"nvme_seconds\":%.6g,\"nvme_least_dram_bytes\":%.0f,"
      "\"nvme_full_speed_dram_bytes\":%.0f},\n \"rungs\":[",
      Bool(in.dram_bytes_per_s > 0), in.optimizer_bytes_per_param, in.params / in.tensor_parallel,
      p.optimizer_step_seconds, p.optimizer_link_bytes,
      p.optimizer_link_bytes / in.link_bytes_per_s, p.optimizer_state_bytes,
      p.optimizer_nvme_seconds, p.optimizer_nvme_least_dram, p.optimizer_nvme_full_speed_dram);
  for (int i = 0; i < kRungCount; ++i) {
    const RungResult& r = p.rungs[i];
    std::printf(
        "%s\n  {\"rung\":\"%s\",\"applied\":%s,\"hbm_bytes\":%.0f,\"added_seconds\":%.6g,"
        "\"fits\":%s,\"available\":%s}",
        i ? "," : "", RungName(r.rung), JsonNames(r.rungs).c_str(), r.hbm_bytes, r.added_seconds,
        Bool(r.fits), Bool(r.available));
  }
  std::printf("],\n \"combinations\":[");
  for (size_t i = 0; i < p.combinations.size(); ++i) {
    const PlanPrice& c = p.combinations[i];
    std::printf(
        "%s\n  {\"name\":\"%s\",\"rungs\":%s,\"hbm_bytes\":%.0f,\"state_bytes\":%.0f,"
        "\"activation_bytes\":%.0f,\"added_seconds\":%.9g,\"recompute_seconds\":%.9g,"
        "\"transfer_seconds\":%.9g,\"transfer_exposed_seconds\":%.9g,"
        "\"optimizer_step_seconds\":%.9g,\"backward_seconds\":%.9g,"
        "\"optimizer_exposed_seconds\":%.9g,\"optimizer_hidden\":%s,\"link_bytes\":%.0f,"
        "\"nvme_bytes\":%.0f,\"fits\":%s,\"available\":%s}",
        i ? "," : "", RungSetName(c.rungs).c_str(), JsonNames(c.rungs).c_str(), c.hbm_bytes,
        c.state_bytes, c.activation_bytes, c.added_seconds, c.recompute_seconds, c.transfer_seconds,
        c.transfer_exposed_seconds, c.optimizer_step_seconds, c.backward_seconds,
        c.optimizer_exposed_seconds,
        Bool((c.rungs & RungBit(Rung::kOptimizerOffload)) != 0 && c.optimizer_exposed_seconds == 0),
        c.link_bytes, c.nvme_bytes, Bool(c.fits), Bool(c.available));
  }
  if (p.recommended_combination < 0) {
    std::printf("],\n \"recommended\":null,\"recommended_rungs\":null}\n");
    return 0;
  }
  const RungSet best = p.combinations[p.recommended_combination].rungs;
  std::printf("],\n \"recommended\":\"%s\",\"recommended_rungs\":%s}\n", RungSetName(best).c_str(),
              JsonNames(best).c_str());
  return 0;
}

}  // namespace tiermem
