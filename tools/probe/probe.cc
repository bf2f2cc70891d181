// tiermem-probe: what tiermem finds on this machine, what its tiers can do (probe_measure.h),
// and --tune (tune.h); a table for humans or JSON (docs/probe.md).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "lib/base/status.h"
#include "lib/config/config.h"
#include "lib/runtime/runtime.h"
#include "tools/probe/io_sweep.h"
#include "tools/probe/probe_dram.h"
#include "tools/probe/probe_measure.h"
#include "tools/probe/probe_print.h"
#include "tools/probe/tune.h"

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

// A flag's bad value: quoted, with what the flag takes (a value that is another flag: the
// flag's own value was left out).
int Bad(const std::string& flag, const std::string& value, const char* wants) {
  if (absl::StartsWith(value, "--")) {
    return Usage2(absl::StrFormat("%s needs a value (%s), before %s", flag, wants, value).c_str());
  }
  return Usage2(absl::StrFormat("%s \"%s\": needs %s", flag, value, wants).c_str());
}

// What the command line asked for.
struct ProbeOptions {
  bool config_only = false, bench = true, sweep = true, demo = true, json = false, tune = false;
  bool sweep_only = false;
  uint64_t bench_bytes = 256ull << 20;
  int repeats = 5;
  SweepOptions sweep_options;
  TuneOptions tune_options;
  std::string tune_out = "tiermem.env";
  std::vector<std::string> given;  // the value flags and --sweep-full, in order
};

// A flag that takes a value (given last, without one: "needs a value", not "unknown").
bool IsValueFlag(const std::string& a) {
  for (const char* f : {"--bench-bytes", "--sweep-bytes", "--tune-bytes", "--sweep-blocks",
                        "--sweep-depths", "--repeats", "--tune-budget", "--tune-out"}) {
    if (a == f) return true;
  }
  return false;
}

// Flags that ask for two different runs: refused (exit 2) rather than one of them ignored.
std::optional<int> Contradiction(const ProbeOptions& o) {
  if (o.config_only && (o.tune || o.json)) {
    return Usage2("--config prints the settings and runs nothing: not with --tune or --json");
  }
  if (o.tune && o.sweep_only) return Usage2("--tune and --sweep-only are two different runs");
  if (o.sweep_only && !o.sweep) return Usage2("--sweep-only and --no-sweep contradict each other");
  if (o.sweep_only && !o.bench) {
    return Usage2(
        "--sweep-only and --no-bench contradict each other (the sweep is a bandwidth "
        "measurement)");
  }
  // A flag setting what this run does not do would be ignored: refused, naming what skips it.
  const char* skipped_by = o.config_only ? "--config" : o.tune ? "--tune" : nullptr;
  const bool bench = !o.config_only && !o.tune && o.bench && !o.sweep_only;
  const bool sweep = !o.config_only && !o.tune && ((o.bench && o.sweep) || o.sweep_only);
  for (const std::string& f : o.given) {
    const bool skip = f == "--no-bench" || f == "--no-sweep" || f == "--no-demo";
    if (o.config_only && (skip || f == "--sweep-only")) {
      return Usage2(("--config prints the settings and runs nothing: not with " + f).c_str());
    }
    if (o.tune && skip) {
      return Usage2(
          ("--tune runs only its search (no bandwidth table, sweep or demo): not with " + f)
              .c_str());
    }
    if (skip || f == "--sweep-only") continue;
    if (absl::StartsWith(f, "--tune-")) {
      if (!o.tune) return Usage2((f + " is for --tune: add --tune, or leave it out").c_str());
    } else if (f == "--bench-bytes" || f == "--repeats") {
      if (!bench) {
        const char* by = skipped_by ? skipped_by : o.sweep_only ? "--sweep-only" : "--no-bench";
        return Usage2((f + " sets the bandwidth measurements, which " + by + " skips").c_str());
      }
    } else if (!sweep) {  // --sweep-*
      const char* by = skipped_by ? skipped_by : !o.bench ? "--no-bench" : "--no-sweep";
      return Usage2((f + " sets the sweep, which " + by + " skips").c_str());
    }
  }
  return std::nullopt;
}

// Reads the flags into *o; an exit code when the run ends here (help, or a bad flag).
std::optional<int> ParseArgs(int argc, char** argv, ProbeOptions* o) {
  SweepOptions& so = o->sweep_options;
  TuneOptions& to = o->tune_options;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if ((IsValueFlag(a) && has_value) || a == "--sweep-full" || a == "--no-bench" ||
        a == "--no-sweep" || a == "--no-demo" || a == "--sweep-only") {
      o->given.push_back(a);
    }
    if (a == "--config") {
      o->config_only = true;
    } else if (a == "--json") {
      o->json = true;
    } else if (a == "--no-bench") {
      o->bench = false;
    } else if (a == "--no-sweep") {
      o->sweep = false;
    } else if (a == "--sweep-full") {
      so.full_per_path = true;
    } else if (a == "--sweep-only") {
      o->sweep_only = true;
      o->demo = false;
    } else if (a == "--no-demo") {
      o->demo = false;
    } else if (a == "--tune") {
      o->tune = true;
    } else if ((a == "--bench-bytes" || a == "--sweep-bytes" || a == "--tune-bytes") && has_value) {
      const std::string v = argv[++i];
      auto s = ParseSize(a, v);
      if (!s.ok() || s->percent > 0 || s->bytes < (1u << 20) || s->bytes > (64ull << 30)) {
        return Bad(a, v, "a size from 1MiB to 64GiB, such as 256MiB");
      }
      (a == "--bench-bytes"   ? o->bench_bytes
       : a == "--sweep-bytes" ? so.bytes
                              : to.io_bytes) = s->bytes / (1 << 20) * (1 << 20);
    } else if (a == "--sweep-blocks" && has_value) {
      auto l = ParseList("--sweep-blocks", argv[++i], true);
      if (!l.has_value())
        return Bad(a, argv[i], "powers of two from 4KiB to 64MiB, such as 128KiB,1MiB");
      so.blocks = *l;
    } else if (a == "--sweep-depths" && has_value) {
      auto l = ParseList("--sweep-depths", argv[++i], false);
      if (!l.has_value()) return Bad(a, argv[i], "queue depths from 1 to 4096, such as 1,4,32");
      so.depths = *l;
    } else if (a == "--repeats" && has_value) {
      auto v = ParseUnsigned("--repeats", argv[++i]);
      if (!v.ok() || *v < 1 || *v > 1000) return Bad(a, argv[i], "a count from 1 to 1000");
      o->repeats = static_cast<int>(*v);
    } else if (a == "--tune-budget" && has_value) {
      double v = 0;
      if (!absl::SimpleAtod(argv[++i], &v) || !(v >= 1 && v <= 86400)) {
        return Bad(a, argv[i], "seconds from 1 to 86400");
      }
      to.budget_seconds = v;
    } else if (a == "--tune-out" && has_value) {
      o->tune_out = argv[++i];
      if (o->tune_out.empty()) return Usage2("--tune-out needs a file name");
    } else if (a == "--help" || a == "-h") {
      Usage();
      return 0;
    } else if (IsValueFlag(a)) {
      return Usage2((a + " needs a value (tiermem-probe --help)").c_str());
    } else {
      std::fprintf(stderr, "tiermem-probe: unknown argument \"%s\"\n", a.c_str());
      Usage();
      return 2;
    }
  }
  return Contradiction(*o);
}

// Whether path can be written (created, or replaced): its directory, and the file if it exists.
absl::Status CheckWritable(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
  if (access(dir.c_str(), W_OK | X_OK) != 0 ||
      (access(path.c_str(), F_OK) == 0 && access(path.c_str(), W_OK) != 0)) {
    return Error(TM_ERR_IO, absl::StrFormat("--tune-out %s cannot be written (%s): nothing was "
                                            "tuned",
                                            path, std::strerror(errno)));
  }
  return absl::OkStatus();
}

// --tune: the search, its env file written and loaded back as the runtime will load it.
absl::Status RunTune(const Config& cfg, const ProbeOptions& o, Findings& f) {
  // The tuner runs alone: its measurements need the machine to themselves.
  auto r = Tune(cfg, o.tune_options, [](const std::string& s) { Progress(s); });
  if (!r.ok()) return r.status();
  f.tune = *r;
  char abs[4096];
  f.tune_file = o.tune_out[0] == '/' || getcwd(abs, sizeof abs) == nullptr
                    ? o.tune_out
                    : std::string(abs) + "/" + o.tune_out;
  std::FILE* out = std::fopen(f.tune_file.c_str(), "w");
  const std::string text = EnvFileText(*r, cfg, f.tune_file);
  if (out == nullptr || std::fputs(text.c_str(), out) < 0 || std::fclose(out) != 0) {
    return Error(TM_ERR_IO,
                 absl::StrFormat("cannot write %s: %s", f.tune_file, std::strerror(errno)));
  }
  const std::string written = f.tune_file;
  auto check = LoadConfig({},
                          [&written](const char* name) -> std::optional<std::string> {
                            if (std::string_view(name) == "TIERMEM_ENV_FILE") return written;
                            return std::nullopt;
                          },
                          {});
  if (!check.ok()) return Error(TM_ERR_INTERNAL, check.status().message());
  for (const char* v : {"TIERMEM_IO_BLOCK_SIZE", "TIERMEM_IO_QUEUE_DEPTH", "TIERMEM_IO_THREADS",
                        "TIERMEM_PREFETCH_DEPTH", "TIERMEM_NVME_GBPS"}) {
    if (std::getenv(v) != nullptr) {
      std::fprintf(stderr, "tiermem-probe: %s is set in the environment and wins over %s\n", v,
                   f.tune_file.c_str());
    }
  }
  return absl::OkStatus();
}

// The measurements and the demo the flags leave in.
absl::Status Measure(Runtime& rt, const Config& cfg, const ProbeOptions& o, Findings& f) {
  if (o.bench && !o.sweep_only) {
    Progress("measuring dram: triad");
    auto dram = DramTriad(o.bench_bytes, o.repeats);
    if (!dram.ok()) return dram.status();
    Progress("measuring dram: the CPU Adam step");
    if (absl::Status s = DramAdam(o.bench_bytes, *dram); !s.ok()) return s;
    f.dram = *dram;
    auto copies = Copies(rt, o.bench_bytes, o.repeats);
    if (!copies.ok()) return copies.status();
    f.copies = std::move(*copies);
  }
  if ((o.bench && o.sweep) || o.sweep_only) {
    auto s = Sweep(cfg, o.sweep_options);
    if (!s.ok()) return s.status();
    f.sweep = std::move(*s);
  }
  if (o.bench && !o.sweep_only) {
    auto m = Bench(rt, o.bench_bytes);
    if (!m.ok()) return m.status();
    f.bw = std::move(*m);
  }
  if (o.demo) {
    auto d = Demo();
    if (!d.ok()) return d.status();
    f.demo = *d;
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const auto start = Clock::now();
  ProbeOptions o;
  if (std::optional<int> exit = ParseArgs(argc, argv, &o); exit.has_value()) return *exit;
  if (o.tune) {  // where the file goes is checked first: the search takes up to a minute
    if (absl::Status s = CheckWritable(o.tune_out); !s.ok()) return Fail(s);
  }
  auto cfg = LoadConfig({}, ProcessEnvironment(), ProcessTiermemVariables());
  if (!cfg.ok()) return Fail(Error(TM_ERR_CONFIG, cfg.status().message()));
  if (!o.json) std::printf("tiermem-probe %s\n", tm_version_string());
  // The probe measures the tiers, not inclusive DRAM's hits: with a clean DRAM copy kept, the
  // "nvme -> dram" acquire would be a no-op reported at 100+ TB/s. --config still prints the
  // setting as configured.
  Config measured = *cfg;
  measured.dram_inclusive = false;
  // TIERMEM_TRACE is the demo's (its runtime reads the environment again): two runtimes of one
  // process writing one path leave the last one's trace, which would be this one's.
  if (o.demo && !o.tune && !o.config_only) measured.trace = std::string();
  auto rt = Runtime::Create(measured);
  if (!rt.ok()) return Fail(rt.status());
  if (o.config_only) {
    // What the runtime made of a setting (a percentage's bytes, `auto`'s choice) beside what
    // was given.
    for (const auto& e : (*rt)->config().entries) {
      const std::optional<std::string> given = cfg->Value(e.name);
      if (given.has_value() && *given != e.value) {
        std::printf("%-24s %-16s (%s: %s)\n", e.name.c_str(), e.value.c_str(), e.source.c_str(),
                    given->c_str());
      } else {
        std::printf("%-24s %-16s (%s)\n", e.name.c_str(), e.value.c_str(), e.source.c_str());
      }
    }
    return 0;
  }
  Findings f;
  const absl::Status s = o.tune ? RunTune(*cfg, o, f) : Measure(**rt, *cfg, o, f);
  if (!s.ok()) return Fail(s);
  ProgressDone();
  f.seconds = Seconds(Clock::now() - start);
  if (o.json) {
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
