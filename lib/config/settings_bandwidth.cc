// The bandwidths that price a recompute against the round trip it saves (tm_tensor_set_recompute):
// TIERMEM_LINK_GBPS (HBM <-> DRAM) and TIERMEM_NVME_GBPS (DRAM <-> NVMe), per direction.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "lib/config/config.h"
#include "lib/config/config_internal.h"

namespace tiermem {
namespace {

// A GB/s row: 0 (the documented default, resolved by the runtime) up to 1e6.
Setting GbpsRow(std::string name, std::string default_doc, std::string summary,
                double Config::*field) {
  Setting s;
  s.name = name;
  s.values = "GB/s, 0-1e6";
  s.default_doc = std::move(default_doc);
  s.summary = std::move(summary);
  s.default_value = [](const EnvLookup&) { return Setting::Default{"0", "default"}; };
  s.parse = [name, field](absl::string_view t, Config& c) -> absl::Status {
    double v = 0;
    if (!ParseDecimal(t, &v) || !std::isfinite(v) || v < 0 || v > 1e6) {
      return Bad(name, t, "expected GB/s from 0 (the default) to 1e6");
    }
    c.*field = v;
    return absl::OkStatus();
  };
  s.format = [field](const Config& c) { return absl::StrCat(c.*field); };
  return s;
}

}  // namespace

void BandwidthRows(std::vector<Setting>& rows) {
  rows.push_back(GbpsRow("TIERMEM_LINK_GBPS", "`0` (auto)",
                         "The HBM <-> DRAM bandwidth per direction that prices a recompute "
                         "against writing a copy down from HBM and reading it back,",
                         &Config::link_gbps));
  rows.push_back(GbpsRow("TIERMEM_NVME_GBPS", "`0` (auto)",
                         "The DRAM <-> NVMe bandwidth per direction that prices a recompute "
                         "against writing a copy down from DRAM and reading it back,",
                         &Config::nvme_gbps));
}

}  // namespace tiermem
