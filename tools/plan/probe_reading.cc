#include "tools/plan/probe_reading.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "tools/shared/json.h"

namespace tiermem {
namespace {

std::string Str(const JsonValue* v) { return v != nullptr && v->is_string() ? v->string() : ""; }
double Num(const JsonValue* v) { return v != nullptr && v->is_number() ? v->number() : 0; }

// min(from->to, to->from) over the entries of `list` that match, in GB/s; 0 unless both exist.
double SlowerDirection(const JsonValue* list, const char* a, const char* b,
                       const char* host_memory) {
  if (list == nullptr || list->type() != JsonValue::Type::kArray) return 0;
  double ab = 0, ba = 0;
  for (const JsonValue& e : list->array()) {
    if (host_memory != nullptr && Str(e.Find("host_memory")) != host_memory) continue;
    const std::string from = Str(e.Find("from")), to = Str(e.Find("to"));
    if (from == a && to == b) ab = Num(e.Find("gbps"));
    if (from == b && to == a) ba = Num(e.Find("gbps"));
  }
  return ab > 0 && ba > 0 ? std::min(ab, ba) : 0;
}

}  // namespace

absl::StatusOr<ProbeBandwidths> ReadProbeJson(absl::string_view text) {
  auto root = ParseJson(text);
  if (!root.ok()) return root.status();
  if (root->type() != JsonValue::Type::kObject) {
    return absl::InvalidArgumentError("not tiermem-probe output: not a JSON object");
  }
  const std::string schema = Str(root->Find("schema"));
  if (schema != "tiermem-probe/1") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "not tiermem-probe output: schema is \"%s\", expected \"tiermem-probe/1\"", schema));
  }
  ProbeBandwidths out;
  const JsonValue* device = root->Find("device");
  out.device = device != nullptr ? Str(device->Find("description")) : "";
  const JsonValue* gpu = root->Find("gpu");
  const JsonValue* present = gpu != nullptr ? gpu->Find("present") : nullptr;
  out.gpu = present != nullptr && present->type() == JsonValue::Type::kBool
                ? present->boolean()
                : device != nullptr && Str(device->Find("kind")) == "cuda";

  if (double g = SlowerDirection(root->Find("copies"), "dram", "hbm", "pinned"); g > 0) {
    out.link_bytes_per_s = g * 1e9;
    out.link_source = "probe copies dram <-> hbm, pinned, slower direction";
  } else if (double r = SlowerDirection(root->Find("bandwidth"), "dram", "hbm", nullptr); r > 0) {
    out.link_bytes_per_s = r * 1e9;
    out.link_source = "probe runtime path dram <-> hbm, slower direction";
  }
  if (double r = SlowerDirection(root->Find("bandwidth"), "dram", "nvme", nullptr); r > 0) {
    out.nvme_bytes_per_s = r * 1e9;
    out.nvme_source = "probe runtime path dram <-> nvme, slower direction";
  } else if (const JsonValue* sweep = root->Find("io_sweep");
             sweep != nullptr && sweep->type() == JsonValue::Type::kArray &&
             !sweep->array().empty()) {
    // The last target is the one over all paths ("striped", or the only path).
    const JsonValue* best = sweep->array().back().Find("best");
    if (best != nullptr) {
      double w = Num(best->Find("write_gbps")), r2 = Num(best->Find("read_gbps"));
      if (w > 0 && r2 > 0) {
        out.nvme_bytes_per_s = std::min(w, r2) * 1e9;
        out.nvme_source =
            absl::StrFormat("probe sweep best over all paths (block %.0f, depth %.0f)",
                            Num(best->Find("block_size")), Num(best->Find("queue_depth")));
      }
    }
  }
  if (const JsonValue* dram = root->Find("dram"); dram != nullptr) {
    // The CPU Adam step's own bandwidth where the probe measured it: the triad counts no
    // write-allocate and runs slower per byte than the fused step it would price.
    if (double g = Num(dram->Find("adam_gbps")); g > 0) {
      const JsonValue* isa = dram->Find("adam_isa");
      out.dram_bytes_per_s = g * 1e9;
      out.dram_source = absl::StrFormat("probe CPU Adam step, kernel %s, %.0f thread(s)",
                                        isa != nullptr && isa->is_string() ? isa->string() : "?",
                                        Num(dram->Find("threads")));
    } else if (double t = Num(dram->Find("triad_gbps")); t > 0) {
      out.dram_bytes_per_s = t * 1e9;
      out.dram_source =
          absl::StrFormat("probe dram triad, %.0f thread(s)", Num(dram->Find("threads")));
    }
  }
  return out;
}

}  // namespace tiermem
