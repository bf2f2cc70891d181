// The tools' JSON reader and how tiermem-plan takes bandwidths from tiermem-probe's output.
#include <gtest/gtest.h>

#include <string>

#include "tools/plan/probe_reading.h"
#include "tools/probe/probe_dram.h"
#include "tools/probe/tune.h"
#include "tools/shared/json.h"

namespace tiermem {
namespace {

TEST(Json, ReadsEveryKindOfValue) {
  auto v = ParseJson(R"( {"a": [1, -2.5e3, 0.125, true, false, null],
                          "s": "q\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "o": {"x": {}} , "e": []} )");
  ASSERT_TRUE(v.ok()) << v.status();
  const JsonValue* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->array().size(), 6u);
  EXPECT_EQ(a->array()[0].number(), 1);
  EXPECT_EQ(a->array()[1].number(), -2500);
  EXPECT_EQ(a->array()[2].number(), 0.125);
  EXPECT_TRUE(a->array()[3].boolean());
  EXPECT_EQ(a->array()[4].type(), JsonValue::Type::kBool);
  EXPECT_FALSE(a->array()[4].boolean());
  EXPECT_EQ(a->array()[5].type(), JsonValue::Type::kNull);
  EXPECT_EQ(v->Find("s")->string(), "q\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  EXPECT_EQ(v->Find("o")->Find("x")->type(), JsonValue::Type::kObject);
  EXPECT_TRUE(v->Find("e")->array().empty());
  EXPECT_EQ(v->Find("missing"), nullptr);
  EXPECT_EQ(a->Find("a"), nullptr);  // not an object
}

TEST(Json, RejectsMalformedTextSayingWhere) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c :
       {Case{"", "at byte 0, expected a value"}, Case{"{\"a\" 1}", "at byte 5, expected ':'"},
        Case{"[1, 2", "expected ',' or ']'"}, Case{"[01]", "expected ',' or ']'"},
        Case{"{\"a\": 1,}", "a member name in quotes"},
        Case{"\"tab\there\"", "no control character"}, Case{"\"\\x\"", "a valid escape"},
        Case{"\"\\ud800\"", "low half of a surrogate"}, Case{"1.", "a digit after '.'"},
        Case{"1e", "a digit in the exponent"}, Case{"1e999", "a finite number"},
        Case{"tru", "true or false"}, Case{"{} {}", "end of input"},
        Case{"\"open", "a closing quote"}}) {
    auto v = ParseJson(c.text);
    ASSERT_FALSE(v.ok()) << c.text;
    EXPECT_NE(v.status().message().find(c.says), absl::string_view::npos)
        << c.text << " -> " << v.status().message();
  }
  std::string deep(100, '[');
  EXPECT_FALSE(ParseJson(deep + std::string(100, ']')).ok());
}

constexpr const char* kProbe = R"({
  "schema": "tiermem-probe/1", "device": {"kind": "cuda", "description": "cuda:0 H200"},
  "gpu": {"present": true, "reason": ""},
  "copies": [
    {"from": "dram", "to": "hbm", "host_memory": "pinned", "gbps": 55.5},
    {"from": "hbm", "to": "dram", "host_memory": "pinned", "gbps": 53.25},
    {"from": "dram", "to": "hbm", "host_memory": "pageable", "gbps": 20.0},
    {"from": "hbm", "to": "dram", "host_memory": "pageable", "gbps": 10.0},
    {"from": "hbm", "to": "hbm", "host_memory": "", "gbps": 3000}],
  "io_sweep": [{"target": "striped", "best": {"block_size": 1048576, "queue_depth": 64,
                "write_gbps": 12.0, "read_gbps": 13.0}}],
  "bandwidth": [
    {"from": "dram", "to": "nvme", "gbps": 6.5}, {"from": "nvme", "to": "dram", "gbps": 7.0},
    {"from": "dram", "to": "hbm", "gbps": 40.0}, {"from": "hbm", "to": "dram", "gbps": 41.0}],
  "dram": {"kernel": "triad", "bytes": 268435456, "threads": 16, "repeats": 5,
           "triad_gbps": 123.5}
})";

TEST(ReadProbeJson, PinnedCopiesAndRuntimePathSlowerDirection) {
  auto b = ReadProbeJson(kProbe);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_DOUBLE_EQ(b->link_bytes_per_s, 53.25e9);
  EXPECT_NE(b->link_source.find("pinned"), std::string::npos);
  EXPECT_DOUBLE_EQ(b->nvme_bytes_per_s, 6.5e9);
  EXPECT_NE(b->nvme_source.find("runtime path"), std::string::npos);
  EXPECT_TRUE(b->gpu);
  EXPECT_EQ(b->device, "cuda:0 H200");
  EXPECT_DOUBLE_EQ(b->dram_bytes_per_s, 123.5e9);
  EXPECT_NE(b->dram_source.find("triad, 16 thread(s)"), std::string::npos) << b->dram_source;
}

TEST(ReadProbeJson, FallsBackToRuntimePathAndSweep) {
  // Without copies and without the runtime's NVMe rows (an older or partial probe).
  auto b = ReadProbeJson(R"({"schema": "tiermem-probe/1", "device": {"kind": "emulated"},
      "io_sweep": [{"target": "/a", "best": {"write_gbps": 1, "read_gbps": 1}},
                   {"target": "striped", "best": {"block_size": 4194304, "queue_depth": 32,
                    "write_gbps": 12.0, "read_gbps": 9.0}}],
      "bandwidth": [{"from": "dram", "to": "hbm", "gbps": 40.0},
                    {"from": "hbm", "to": "dram", "gbps": 41.0}]})");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_DOUBLE_EQ(b->link_bytes_per_s, 40e9);
  EXPECT_NE(b->link_source.find("runtime path"), std::string::npos);
  EXPECT_DOUBLE_EQ(b->nvme_bytes_per_s, 9e9);
  EXPECT_NE(b->nvme_source.find("sweep best"), std::string::npos) << b->nvme_source;
  EXPECT_FALSE(b->gpu);
  // A probe from before the triad row: readable, with no DRAM figure.
  EXPECT_EQ(b->dram_bytes_per_s, 0);
  EXPECT_TRUE(b->dram_source.empty());
  // One direction only: not a figure.
  b = ReadProbeJson(R"({"schema": "tiermem-probe/1",
      "bandwidth": [{"from": "dram", "to": "nvme", "gbps": 6.5}]})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->nvme_bytes_per_s, 0);
  EXPECT_EQ(b->link_bytes_per_s, 0);
}

// The triad measures, checks its result, and its JSON member reads back as the planner's DRAM
// bandwidth.
TEST(DramTriad, MeasuresAndReadsBack) {
  auto m = DramTriad(16u << 20, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->bytes, 16u << 20);
  EXPECT_GE(m->threads, 1);
  EXPECT_EQ(m->repeats, 2);
  EXPECT_GT(m->gbps, 0.01);
  EXPECT_NE(DramRow(*m).find("triad"), std::string::npos);
  EXPECT_EQ(DramRow(*m).find("adam"), std::string::npos);
  auto b = ReadProbeJson("{\"schema\": \"tiermem-probe/1\", " + DramJson(*m) + "}");
  ASSERT_TRUE(b.ok()) << b.status() << DramJson(*m);
  EXPECT_NEAR(b->dram_bytes_per_s, m->gbps * 1e9, 1e5);
  EXPECT_NE(b->dram_source.find("triad"), std::string::npos) << b->dram_source;
}

// The CPU Adam step is measured with the kernel CPUAdam runs, checked, and is what the planner
// prices the optimizer step with where the probe has it (over the triad).
TEST(DramAdam, MeasuresAndIsThePlannersFigure) {
  auto m = DramTriad(16u << 20, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(DramAdam(16u << 20, *m).ok());
  EXPECT_EQ(m->adam_params, (16u << 20) / 4);
  EXPECT_GT(m->adam_gbps, 0.01);
  EXPECT_FALSE(m->adam_isa.empty());
  EXPECT_NE(DramRow(*m).find("adam step"), std::string::npos) << DramRow(*m);
  auto b = ReadProbeJson("{\"schema\": \"tiermem-probe/1\", " + DramJson(*m) + "}");
  ASSERT_TRUE(b.ok()) << b.status() << DramJson(*m);
  EXPECT_NEAR(b->dram_bytes_per_s, m->adam_gbps * 1e9, 1e5);
  EXPECT_NE(b->dram_source.find("CPU Adam step, kernel " + m->adam_isa), std::string::npos)
      << b->dram_source;
}

// A search's pick that lost the final check is written down beside the defaults kept, with its
// figures, not lost behind "nothing beat the defaults".
TEST(TuneEnvFile, NamesThePickThatLostTheFinalCheck) {
  TuneResult r;
  r.engine = "io_uring";
  r.io_default = IoPoint{1u << 20, 32, 1, 2.0, 3.0};
  r.io_tuned = r.io_default;
  r.io_kept_default = true;
  r.depth_tuned = r.depth_default = 2;
  const std::string plain = EnvFileText(r, Config{}, "/x/tiermem.env");
  EXPECT_NE(plain.find("(nothing beat the defaults)"), std::string::npos) << plain;
  EXPECT_EQ(plain.find("lost the final check"), std::string::npos) << plain;

  r.io_rejected = IoPoint{4u << 20, 64, 2, 1.9, 3.05};
  const std::string text = EnvFileText(r, Config{}, "/x/tiermem.env");
  EXPECT_EQ(text.find("(nothing beat the defaults)"), std::string::npos) << text;
  EXPECT_NE(text.find("the search's pick (block 4MiB, queue depth 64, 2 threads: 1.90 / 3.05 "
                      "GB/s) lost the final check against the defaults: defaults kept"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("export TIERMEM_IO_BLOCK_SIZE=1MiB\n"), std::string::npos) << text;
}

TEST(ReadProbeJson, RejectsOtherDocuments) {
  for (const char* text : {"[1]", "{\"schema\": \"tiermem-probe/2\"}", "{}", "not json"}) {
    auto b = ReadProbeJson(text);
    ASSERT_FALSE(b.ok()) << text;
    EXPECT_TRUE(absl::IsInvalidArgument(b.status()));
  }
}

}  // namespace
}  // namespace tiermem
