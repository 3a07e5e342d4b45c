// calibrate link: the inter-node link recovered from collectives timed across nodes, and the
// profile written with it.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "calibrate/link_fit.h"
#include "calibrate/micro_record.h"
#include "common/errors.h"
#include "common/text_file.h"
#include "model/toml_edit.h"
#include "test_util.h"

using namespace stepcast;
using namespace stepcast::calibrate;
namespace fs = std::filesystem;

namespace {

// Records timed on a planted link: 12.5 GB/s a GPU (a 100 Gb/s NIC) and 30 us latency, two
// nodes of one rank and two nodes of two, 1 MiB to 1 GiB. Their times are written by hand from
// the ring's cost (Patarasuk & Yuan 2009; nccl-tests' bus bandwidth): a collective of B bytes
// among n ranks moves B x 2 (n-1)/n (all-reduce) or B x (n-1)/n (reduce-scatter, all-gather)
// over each rank's link; across nodes that link is the node's NICs, G GPUs x 12.5 GB/s, at the
// inter-node efficiency (times the reduce-scatter / all-gather factor for those), and every call
// pays the collective latency plus the link's 30 us.
std::vector<MicroRecord> planted_records(const HardwareProfile& hw, double link_bps, double latency_s) {
  const CoefVector& c = hw.coefs;
  std::vector<MicroRecord> out;
  for (double world : {2.0, 4.0})
    for (double bytes = 1048576.0; bytes <= 1073741824.0; bytes *= 4)
      for (MicroBench b : {MicroBench::kAllReduce, MicroBench::kReduceScatter, MicroBench::kAllGather}) {
        const double gpus_per_node = world / 2.0;
        const double share = (world - 1.0) / world * (b == MicroBench::kAllReduce ? 2.0 : 1.0);
        const double eff = c[kInterBusEffFrac] * (b == MicroBench::kAllReduce ? 1.0 : c[kRsAgBusEffMult]);
        MicroRecord r;
        r.bench = b;
        r.bytes = bytes;
        r.world = world;
        r.nodes = 2;
        r.seconds = c[kCollLatencyS] + latency_s + bytes * share / (gpus_per_node * link_bps * eff);
        out.push_back(r);
      }
  return out;
}

}  // namespace

TEST_CASE("calibrate link recovers a planted inter-node link from collectives across nodes") {
  const HardwareProfile hw = test::hardware("h200-sxm");
  std::vector<MicroRecord> records = planted_records(hw, 12.5e9, 30e-6);
  // Records within one node say nothing of the link across nodes and are left out.
  MicroRecord within = records.front();
  within.nodes = 1;
  within.seconds = 1.0;
  records.push_back(within);
  const LinkFit fit = fit_inter_node_link(records, hw);
  CHECK(fit.records.size() == records.size() - 1);
  CHECK(fit.inter_node_bytes_per_s == doctest::Approx(12.5e9).epsilon(1e-3));
  CHECK(fit.inter_node_latency_s == doctest::Approx(30e-6).epsilon(1e-2));
  CHECK(fit.rms_log_error < 1e-3);
  for (size_t i = 0; i < fit.records.size(); ++i)
    CHECK(fit.predicted_s[i] == doctest::Approx(fit.records[i].seconds).epsilon(2e-3));
}

TEST_CASE("calibrate link: records 25 % slower beyond the latency give a rate 1.25 times lower") {
  // The same records, 25 % slower at every size beyond the latency: the fitted rate is 1/1.25 of the
  // planted one (the bytes' term scales, the latency stays).
  const HardwareProfile hw = test::hardware("h200-sxm");
  std::vector<MicroRecord> records = planted_records(hw, 12.5e9, 0.0);
  for (MicroRecord& r : records) r.seconds = hw.coefs[kCollLatencyS] + 1.25 * (r.seconds - hw.coefs[kCollLatencyS]);
  const LinkFit fit = fit_inter_node_link(records, hw);
  CHECK(fit.inter_node_bytes_per_s == doctest::Approx(12.5e9 / 1.25).epsilon(1e-3));
  CHECK(fit.inter_node_latency_s < 1e-7);
}

TEST_CASE("calibrate link needs collectives across nodes") {
  const HardwareProfile hw = test::hardware("h200-sxm");
  std::vector<MicroRecord> records = planted_records(hw, 12.5e9, 30e-6);
  for (MicroRecord& r : records) r.nodes = 1;
  CHECK_THROWS_WITH_AS(fit_inter_node_link(records, hw), doctest::Contains("no collective micro-benchmark across nodes"),
                       InputError);
}

TEST_CASE("the profile with the measured link: name and the two [links] keys replaced, the rest as it was") {
  const HardwareProfile hw = test::hardware("h200-sxm");
  const std::string text = read_text_file(hw.path);
  const std::string out = with_inter_node_link(text, hw.path, "h200-sxm-emulated-nodes", 3.5e9, 4e-5, "measured here");
  const HardwareProfile back = parse_hardware_profile(out, "written");
  CHECK(back.name == "h200-sxm-emulated-nodes");
  CHECK(back.links.inter_node_bytes_per_s == doctest::Approx(3.5e9));
  CHECK(back.links.inter_node_latency_s == doctest::Approx(4e-5));
  CHECK(back.links.intra_node_bytes_per_s == hw.links.intra_node_bytes_per_s);
  CHECK(back.gpu.name == hw.gpu.name);  // [gpu] name is not the profile's
  CHECK(back.coefs == parse_hardware_profile(text, "original").coefs);
  // Line for line the same but for those three.
  std::istringstream a(text), b(out);
  std::string la, lb;
  int changed = 0;
  while (std::getline(a, la) && std::getline(b, lb)) changed += la != lb;
  CHECK(changed == 3);
  // A profile without the keys is named with the key it lacks.
  std::string no_latency = text;
  no_latency.erase(no_latency.find("inter_node_latency_s"), no_latency.find('\n', no_latency.find("inter_node_latency_s")) -
                                                              no_latency.find("inter_node_latency_s") + 1);
  CHECK_THROWS_WITH_AS(with_inter_node_link(no_latency, "p.toml", "x", 1e9, 0, "s"),
                       doctest::Contains("p.toml: key 'links.inter_node_latency_s' is missing"), InputError);
}

TEST_CASE("set_toml_key replaces one key of one table and nothing else; erase_toml_table takes a table and its subtables") {
  // Hand-written text: a top-level key, two tables holding a key of the same name, an array whose
  // continuation row starts with '[' (not a header), and a comment that mentions the key.
  std::string text =
      "name = \"a\"\n"
      "[gpu]\n"
      "rate = 1\n"
      "# rate = 99 in a comment is not the key\n"
      "sizes = [\n"
      "[1, 2]]\n"
      "[links]\n"
      "  rate   = 2\n"
      "rate_x = 3\n";
  set_toml_key(text, "links", "rate", "{ value = 7, source = \"s\" }", "t.toml");
  set_toml_key(text, "", "name", "\"b\"", "t.toml");
  CHECK(text ==
        "name = \"b\"\n"
        "[gpu]\n"
        "rate = 1\n"
        "# rate = 99 in a comment is not the key\n"
        "sizes = [\n"
        "[1, 2]]\n"
        "[links]\n"
        "rate = { value = 7, source = \"s\" }\n"
        "rate_x = 3\n");
  CHECK_THROWS_WITH_AS(set_toml_key(text, "links", "latency", "1", "t.toml"),
                       doctest::Contains("t.toml: key 'links.latency' is missing"), InputError);
  CHECK_THROWS_WITH_AS(set_toml_key(text, "", "rate", "1", "t.toml"), doctest::Contains("t.toml: key 'rate' is missing"),
                       InputError);

  std::string sections = "a = 1\n[engines.x]\nk = 1\n[engines.x.interval]\nq = 2\n[engines.y]\nk = 3\n";
  CHECK(erase_toml_table(sections, "engines.x"));
  CHECK(sections == "a = 1\n[engines.y]\nk = 3\n");
  CHECK_FALSE(erase_toml_table(sections, "engines.z"));
}

TEST_CASE("upsert_toml_key replaces a key where it is, else adds it right after its table's header") {
  std::string text =
      "[gpu]\n"
      "rate = 1\n"
      "[host]\n"
      "pcie_gen = 5\n"
      "[links]\n"
      "rate = 2\n";
  upsert_toml_key(text, "host", "pageable_bytes_per_s", "{ value = 1e10, source = \"m\" }", "t.toml");
  upsert_toml_key(text, "links", "rate", "3", "t.toml");
  CHECK(text ==
        "[gpu]\n"
        "rate = 1\n"
        "[host]\n"
        "pageable_bytes_per_s = { value = 1e10, source = \"m\" }\n"
        "pcie_gen = 5\n"
        "[links]\n"
        "rate = 3\n");
  upsert_toml_key(text, "host", "pageable_bytes_per_s", "{ value = 2e10, source = \"n\" }", "t.toml");
  CHECK(text.find("pageable_bytes_per_s = { value = 2e10, source = \"n\" }\npcie_gen") != std::string::npos);
  CHECK(text.find("1e10") == std::string::npos);
  CHECK_THROWS_WITH_AS(upsert_toml_key(text, "nics", "rate", "1", "t.toml"),
                       doctest::Contains("t.toml: table '[nics]' is missing"), InputError);
}
