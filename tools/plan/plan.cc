// tiermem-plan: for a model shape, an HBM budget and the machine's bandwidths, what each
// combination of the ladder's rungs (selective / per-layer recompute, optimizer-state,
// activation and parameter offload) needs in HBM and adds to a step, the CPU optimizer step
// included, and which one to use. --json for machines.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "lib/config/config.h"
#include "lib/plan/planner.h"
#include "tools/plan/plan_print.h"
#include "tools/plan/probe_reading.h"

namespace tiermem {
namespace {

void Usage(FILE* f) {
  std::fprintf(
      f,
      "usage: tiermem-plan --layers L --hidden H --heads A --seq S --micro-batch B --params N\n"
      "                    --hbm SIZE --tflops T [--link-gbps G] [--nvme-gbps G]\n"
      "                    [--dram-gbps G] [--optimizer-bytes-per-param N] [--tp T]\n"
      "                    [--sequence-parallel] [--flash-attention] [--bytes-per-element E]\n"
      "                    [--probe FILE] [--json]\n"
      "  --params accepts 7e9 or 7B/70B/1.5T; --hbm a size (80GiB); bandwidths in GB/s (1e9 B/s);\n"
      "  --tflops is the achieved compute per GPU in 1e12 FLOP/s.\n"
      "  --dram-gbps prices the CPU optimizer step (its bandwidth: the probe's adam step row);\n"
      "  without it, and without a probe file that has it, optimizer-state offload is left out.\n"
      "  --optimizer-bytes-per-param is the DRAM traffic of one CPU Adam step (default 28).\n"
      "  --probe FILE takes --link-gbps, --nvme-gbps and --dram-gbps from tiermem-probe --json\n"
      "  output (given flags win: --nvme-gbps 0 or --dram-gbps 0 leaves those rungs out).\n"
      "  Bandwidths start at 0.001 GB/s, --tflops at 0.001; every bad value is named at once.\n");
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

// Each numeric flag, where its value goes, the PlanInput field MakePlan names when it is out of
// range, and what a missing one is (nullptr: optional).
struct NumberFlag {
  const char* flag;
  double PlanInput::*field;  // nullptr: a bandwidth in GB/s, scaled after reading
  const char* field_name;
  const char* required;
};
constexpr NumberFlag kNumberFlags[] = {
    {"--layers", &PlanInput::layers, "layers", "the number of transformer layers"},
    {"--hidden", &PlanInput::hidden, "hidden", "the hidden size"},
    {"--heads", &PlanInput::heads, "heads", "the number of attention heads"},
    {"--seq", &PlanInput::seq, "seq", "the sequence length"},
    {"--micro-batch", &PlanInput::micro_batch, "micro_batch", "the micro-batch size"},
    {"--params", &PlanInput::params, "params", "the model's parameter count, such as 7B"},
    {"--tp", &PlanInput::tensor_parallel, "tensor_parallel", nullptr},
    {"--bytes-per-element", &PlanInput::bytes_per_element, "bytes_per_element", nullptr},
    {"--optimizer-bytes-per-param", &PlanInput::optimizer_bytes_per_param,
     "optimizer_bytes_per_param", nullptr},
    {"--tflops", &PlanInput::flops_per_s, "flops_per_s", "the achieved TFLOP/s per GPU"},
    {"--link-gbps", &PlanInput::link_bytes_per_s, "link_bytes_per_s",
     "the HBM <-> DRAM bandwidth in GB/s, or --probe FILE"},
    {"--nvme-gbps", &PlanInput::nvme_bytes_per_s, "nvme_bytes_per_s", nullptr},
    {"--dram-gbps", &PlanInput::dram_bytes_per_s, "dram_bytes_per_s", nullptr},
};
constexpr const char* kHbmRequired = "the HBM budget per GPU, such as 80GiB";

// A flag's value as given, and the unit it is scaled by into PlanInput.
double Scale(const std::string& flag) {
  if (flag == "--tflops") return 1e12;
  if (flag == "--link-gbps" || flag == "--nvme-gbps" || flag == "--dram-gbps") return 1e9;
  return 1;
}

int Bad(const std::string& message) {
  std::fprintf(stderr, "tiermem-plan: %s (see --help)\n", message.c_str());
  return 2;
}

std::string ReadFile(const std::string& path, bool* ok) {
  std::string text;
  std::FILE* f = std::fopen(path.c_str(), "r");
  *ok = f != nullptr;
  if (f == nullptr) return std::strerror(errno);
  char buf[65536];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && text.size() < (64u << 20))
    text.append(buf, n);
  std::fclose(f);
  return text;
}

// Fills the bandwidths the flags left out from tiermem-probe's JSON; empty on success, else why
// not.
std::string ApplyProbe(const std::string& file, const std::map<std::string, std::string>& given,
                       PlanInput* in, PlanSources* src) {
  bool ok = false;
  const std::string text = ReadFile(file, &ok);
  if (!ok) return "--probe " + file + ": " + text;
  auto probe = ReadProbeJson(text);
  if (!probe.ok()) return "--probe " + file + ": " + std::string(probe.status().message());
  if (!given.contains("--link-gbps") && probe->link_bytes_per_s > 0) {
    in->link_bytes_per_s = probe->link_bytes_per_s;
    src->link = probe->link_source;
    if (!probe->gpu) {
      std::fprintf(stderr,
                   "tiermem-plan: warning: %s was measured without a GPU (%s): its HBM <-> DRAM "
                   "figure is host memory, not a PCIe link; give --link-gbps to override\n",
                   file.c_str(), probe->device.c_str());
    }
  }
  if (!given.contains("--nvme-gbps") && probe->nvme_bytes_per_s > 0) {
    in->nvme_bytes_per_s = probe->nvme_bytes_per_s;
    src->nvme = probe->nvme_source;
  }
  if (!given.contains("--dram-gbps") && probe->dram_bytes_per_s > 0) {
    in->dram_bytes_per_s = probe->dram_bytes_per_s;
    src->dram = probe->dram_source;
  }
  return "";
}

// Every required flag that was not given, in one message; empty when none is missing.
std::string MissingFlags(const std::map<std::string, std::string>& given, const PlanInput& in,
                         std::set<std::string>* flags) {
  std::string missing;
  auto need = [&](const char* flag, const char* what) {
    missing += absl::StrCat(missing.empty() ? "" : "; ", flag, " is missing (", what, ")");
    flags->insert(flag);
  };
  for (const NumberFlag& f : kNumberFlags) {
    if (f.required == nullptr || given.contains(f.flag)) continue;
    if (std::string(f.flag) == "--link-gbps" && in.link_bytes_per_s > 0) continue;  // the probe's
    need(f.flag, f.required);
  }
  if (!given.contains("--hbm")) need("--hbm", kHbmRequired);
  return missing;
}

// Whether one of MakePlan's messages is a rule across fields ("hidden=4000 is not a multiple of
// heads=3: ..."), said as it is, not as one flag's.
bool AcrossFields(const std::string& m) {
  const size_t eq = m.find('='), colon = m.find(": ");
  return eq == std::string::npos || colon == std::string::npos || colon < eq ||
         m.substr(eq, colon - eq).find(' ') != std::string::npos;
}

// One of MakePlan's "field=value: why" as "--flag TEXT: why", in the units the user gave.
std::string FlagMessage(const std::string& m, const std::map<std::string, std::string>& given) {
  if (AcrossFields(m)) return m;
  const std::string field = m.substr(0, m.find('='));
  const std::string why = m.find(": ") == std::string::npos ? m : m.substr(m.find(": ") + 2);
  if (field == "hbm_bytes") return "--hbm " + given.at("--hbm") + ": " + why;
  for (const NumberFlag& f : kNumberFlags) {
    if (field != f.field_name) continue;
    const auto it = given.find(f.flag);
    return std::string(f.flag) + " " + (it != given.end() ? it->second : "(from --probe)") + ": " +
           why;
  }
  return m;
}

// The flag of one of MakePlan's "field=value: why" (empty: a rule across fields).
std::string FlagOf(const std::string& m) {
  if (AcrossFields(m)) return "";
  const std::string field = m.substr(0, m.find('='));
  if (field == "hbm_bytes") return "--hbm";
  for (const NumberFlag& f : kNumberFlags) {
    if (field == f.field_name) return f.flag;
  }
  return "";
}

int Main(int argc, char** argv) {
  PlanInput in;
  bool json = false;
  std::string probe_file;
  std::map<std::string, std::string> given;  // flag -> its text, for messages
  std::vector<std::string> bad;              // the flags that could not be read
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
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
    const NumberFlag* number = nullptr;
    for (const NumberFlag& f : kNumberFlags) {
      if (k == f.flag) number = &f;
    }
    if (number == nullptr && k != "--probe" && k != "--hbm") {
      bad.push_back("unknown argument " + k);
      continue;
    }
    if (i + 1 >= argc) {
      bad.push_back(k + " needs a value");
      continue;
    }
    const std::string v = argv[++i];
    given[k] = v;
    if (k == "--probe") {
      probe_file = v;
    } else if (k == "--hbm") {
      auto size = ParseSize("--hbm", v);
      if (!size.ok() || size->percent != 0) {
        bad.push_back("--hbm " + v + ": needs a size, such as 80GiB");
      } else {
        in.hbm_bytes = static_cast<double>(size->bytes);
      }
    } else {
      double d = 0;
      if (!Number(v, &d)) {
        bad.push_back(k + " " + v + ": not a number");
      } else {
        in.*(number->field) = d * Scale(k);
      }
    }
  }
  // Every flag that could not be read, then the probe file, every missing flag and every value
  // out of range, in one message (each pass hid the next).
  std::set<std::string> unreadable;
  for (const std::string& b : bad) unreadable.insert(b.substr(0, b.find(' ')));
  PlanSources src;
  if (given.contains("--link-gbps")) src.link = "--link-gbps";
  if (given.contains("--nvme-gbps")) src.nvme = "--nvme-gbps";
  if (given.contains("--dram-gbps")) src.dram = "--dram-gbps";
  if (!probe_file.empty()) {
    if (std::string why = ApplyProbe(probe_file, given, &in, &src); !why.empty()) {
      bad.push_back(why);
    }
  }
  std::set<std::string> missing_flags;
  if (const std::string missing = MissingFlags(given, in, &missing_flags); !missing.empty()) {
    bad.push_back(missing);
  }
  auto plan = MakePlan(in);
  if (!plan.ok()) {
    // A value out of range, of a flag that was given and read (a missing or unreadable one has
    // its message already).
    for (absl::string_view m : absl::StrSplit(plan.status().message(), "; ")) {
      const std::string flag = FlagOf(std::string(m));
      if (unreadable.contains(flag) || missing_flags.contains(flag)) continue;
      bad.push_back(FlagMessage(std::string(m), given));
    }
  }
  if (!bad.empty()) return Bad(absl::StrJoin(bad, "; "));
  return json ? PrintPlanJson(in, *plan, src) : PrintPlanText(in, *plan, src);
}

}  // namespace
}  // namespace tiermem

int main(int argc, char** argv) { return tiermem::Main(argc, argv); }
