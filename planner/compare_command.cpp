#include "planner/compare_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/cli.h"
#include "common/errors.h"
#include "common/units.h"
#include "planner/compare.h"
#include "planner/plan_search.h"
#include "planner/report.h"

namespace stepcast {

namespace {

std::string hours_text(double s) { return fmt("%.1f", s / 3600.0); }

// `planner compare`: each GPU kind x GPU count, its best plan, the run's wall-clock and cost.
}  // namespace

int run_compare(CompareOptions& co) {
  CommonOptions& o = co.common;
  if (o.train_tokens == 0) throw InputError("--train-tokens is required (tokens of the whole fine-tune, e.g. 1e9)");
  if (o.train_tokens < 0)
    throw InputError("--train-tokens " + std::to_string(o.train_tokens) + " must be positive (tokens of the whole fine-tune, e.g. 1e9)");
  check_range("--train-tokens", o.train_tokens, 1, 1e16, false);
  if (co.max_gpus < 1 || co.max_gpus > 4096)
    throw InputError("--max-gpus " + std::to_string(co.max_gpus) + " is out of range [1, 4096]");
  check_range("--deadline-hours", co.deadline_hours, 1e-3, 1e6, true);
  check_range("--budget-usd", co.budget_usd, 1e-2, 1e9, true);
  const Engine eng = parse_engine(co.engine, "--engine");
  if (!co.svg.empty()) check_output_path(co.svg);
  if (!co.k8s_manifest.empty()) check_output_path(co.k8s_manifest);
  const auto overrides = parse_price_overrides(co.prices);
  const std::filesystem::path dir = data_dir(o);
  std::vector<std::string> kinds = co.hardware_list.empty() ? list_hardware(dir) : split_comma_list(co.hardware_list);
  if (kinds.empty()) throw InputError("--hardware \"" + co.hardware_list + "\" names no profile");
  for (const auto& [kind, usd] : overrides)
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end())
      throw InputError("--price " + kind + "=" + fmt("%g", usd) + ": " + kind + " is not among the compared kinds");
  const ModelSpec model = resolve_model(o.model, dir);

  std::vector<CompareRow> rows;
  std::vector<std::string> notes;
  // GPU counts the fixed global batch cannot spread over (the same whole number of sequences on
  // every rank): left out, and said once.
  std::set<int64_t> undivided_worlds;
  for (const std::string& kind : kinds) {
    const HardwareProfile hw = resolve_hardware(kind, dir);
    // The offer that prices this kind: --price, else --provider's, else the profile's first.
    PriceOffer offer;
    if (auto it = overrides.find(kind); it != overrides.end()) {
      offer.provider = "--price";
      offer.usd_per_gpu_hour = it->second;
    } else if (!co.provider.empty()) {
      auto f = std::find_if(hw.prices.begin(), hw.prices.end(), [&](const PriceOffer& p) { return p.provider == co.provider; });
      if (f == hw.prices.end()) {
        if (!co.hardware_list.empty())
          throw InputError(hw.path + ": no [[prices]] offer of provider \"" + co.provider + "\" for " + kind);
        notes.push_back(kind + ": left out, no price of provider " + co.provider);
        continue;
      }
      offer = *f;
    } else if (!hw.prices.empty()) {
      offer = hw.prices.front();
    } else {
      if (!co.hardware_list.empty())
        throw InputError(hw.path + ": key 'prices' is missing: no price for " + kind + " (give --price " + kind + "=USD)");
      notes.push_back(kind + ": left out, the profile has no price (--price " + kind + "=USD adds it)");
      continue;
    }
    for (const auto& [gpn, nodes] : gpu_layouts(hw.links.gpus_per_node_max, co.max_gpus)) {
      if (!batch_divides_ranks(co.global_batch, static_cast<int64_t>(gpn) * nodes)) {
        undivided_worlds.insert(static_cast<int64_t>(gpn) * nodes);
        continue;
      }
      CommonOptions lo = o;
      lo.gpus = gpn;
      lo.nodes = nodes;
      lo.hardware = kind;
      // The pod's host: the offer's published vCPUs and memory per GPU, else the profile's figures.
      std::vector<std::string> flags;
      if (offer.vcpus_per_gpu > 0) lo.cpu_cores = offer.vcpus_per_gpu * gpn;
      if (offer.memory_bytes_per_gpu > 0) lo.cpu_mem_gib = offer.memory_bytes_per_gpu * gpn / kBytesPerGiB;
      if (offer.vcpus_per_gpu <= 0 || offer.memory_bytes_per_gpu <= 0)
        flags.push_back("pod size not published: host from the profile");
      SearchRequest req;
      req.base = base_config(lo, model, eng);
      req.model = model;
      req.hardware = for_engine(hw, co.engine);
      req.limits = limits_of(lo);
      req.global_batch = co.global_batch;
      req.overlap_forward = eng == Engine::kStepcast;
      if (lo.peft == "auto") req.pefts = {PeftKind::kNone, PeftKind::kLora, PeftKind::kQlora};
      const SearchResult res = search_plans(req);
      // A pod of published size may be what holds a row back: the same search on the profile's
      // whole-server host says whether a plan needing more host memory or cores runs faster.
      if (offer.vcpus_per_gpu > 0 || offer.memory_bytes_per_gpu > 0) {
        SearchRequest server = req;
        server.limits.host_memory_bytes_node = 0;
        server.limits.cpu_cores_node = 0;
        const SearchResult on_server = search_plans(server);
        if (!on_server.ranked.empty() &&
            (res.ranked.empty() ||
             on_server.ranked.front().throughput.tokens_per_s > 1.05 * res.ranked.front().throughput.tokens_per_s)) {
          const Prediction& b = on_server.ranked.front();
          const double gain = res.ranked.empty() ? 0.0
                                                 : b.throughput.tokens_per_s / res.ranked.front().throughput.tokens_per_s - 1.0;
          flags.push_back(kind + " x" + std::to_string(gpn * nodes) + " is pod-limited: on the profile's server host (" +
                          fmt("%.0f", hw.host.cpu_cores_per_gpu * gpn) + " cores, " +
                          format_gib(hw.host.memory_bytes_per_gpu * gpn) + " GiB) " + family_name(b.config) +
                          " would run at " + fmt("%.0f", b.throughput.tokens_per_s) + " tokens/s" +
                          (res.ranked.empty() ? std::string(" (nothing fits the pod)") : " (+" + fmt("%.0f", 100 * gain) + " %)") +
                          "; the " + offer.provider + " pod has " + fmt("%.0f", offer.vcpus_per_gpu * gpn) + " vCPUs and " +
                          format_gib(offer.memory_bytes_per_gpu * gpn) + " GiB");
        }
      }
      if (res.ranked.empty()) {
        for (const std::string& f : flags)
          if (f.find("pod-limited") != std::string::npos) notes.push_back(f);
        continue;
      }
      CompareRow r;
      r.hardware = kind;
      r.provider = offer.provider;
      r.usd_per_gpu_hour = offer.usd_per_gpu_hour;
      r.kubernetes = offer.kubernetes;
      r.includes_host = offer.includes_host;
      r.calibrated = hw.coefs_calibrated;
      r.gpus_per_node = gpn;
      r.nodes = nodes;
      r.plan = res.ranked.front();
      const RunCost c = run_cost(o.train_tokens, r.plan.throughput.tokens_per_s, r.gpus(), r.usd_per_gpu_hour);
      r.wall_s = c.wall_s;
      r.gpu_hours = c.gpu_hours;
      r.cost_usd = c.cost_usd;
      // The plan's own interval (set_interval: the profile's cross-validated model, or on a GPU
      // never calibrated the published rows' quantile for plans with or without CPU offload).
      if ((hw.coefs_calibrated || hw.transferred_log_q95 > 0) && r.plan.step_std_s > 0)
        r.interval_frac = 1.96 * r.plan.step_std_s / r.plan.time.step_s;
      if (!offer.includes_host && offer.provider != "--price") flags.push_back("host CPU and memory billed apart");
      r.pod_cores_per_gpu = offer.vcpus_per_gpu > 0 ? offer.vcpus_per_gpu : hw.host.cpu_cores_per_gpu;
      r.gpu_name = hw.gpu.name;
      r.flags = flags;
      rows.push_back(std::move(r));
    }
  }
  if (!undivided_worlds.empty()) {
    std::string counts;
    for (int64_t w : undivided_worlds) counts += (counts.empty() ? "" : ", ") + std::to_string(w);
    int64_t admitting = co.global_batch;  // the least global batch that divides over them all
    for (int64_t w : undivided_worlds) admitting = std::lcm(admitting, w);
    notes.push_back("left out " + counts + " GPUs: the global batch of " + std::to_string(co.global_batch) +
                    " sequences does not divide over them (--global-batch " + std::to_string(admitting) +
                    " admits them)");
  }
  if (rows.empty())
    throw InputError("no GPU kind and count up to --max-gpus " + std::to_string(co.max_gpus) + " fits " + model.name +
                     (notes.empty() ? std::string() : " (" + notes.front() + ")"));
  mark_pareto_front(rows);
  std::sort(rows.begin(), rows.end(), [](const CompareRow& a, const CompareRow& b) { return a.cost_usd < b.cost_usd; });
  const auto cheapest = cheapest_within(rows, co.deadline_hours * 3600.0);
  const auto fastest = fastest_within(rows, co.budget_usd);
  if (co.deadline_hours > 0 && !cheapest) {
    const auto quickest = fastest_within(rows, 0);
    throw InputError("--deadline-hours " + fmt("%g", co.deadline_hours) + ": no plan finishes in time; the fastest, " +
                     rows[*quickest].hardware + " x" + std::to_string(rows[*quickest].gpus()) + ", takes " +
                     hours_text(rows[*quickest].wall_s) + " h");
  }
  if (co.budget_usd > 0 && !fastest) {
    const auto cheapest_any = cheapest_within(rows, 0);
    throw InputError("--budget-usd " + fmt("%g", co.budget_usd) + ": no plan costs that little; the cheapest, " +
                     rows[*cheapest_any].hardware + " x" + std::to_string(rows[*cheapest_any].gpus()) + ", costs $" +
                     fmt("%.0f", rows[*cheapest_any].cost_usd));
  }
  // The manifest's plan: the cheapest within the deadline, else the fastest within the budget,
  // else the cheapest.
  std::optional<size_t> chosen = co.deadline_hours > 0 ? cheapest : co.budget_usd > 0 ? fastest : cheapest;
  std::string manifest_text;
  if (!co.k8s_manifest.empty()) {
    const CompareRow& r = rows[*chosen];
    ManifestRequest mr = co.manifest;
    mr.cpu_threads_per_rank = o.cpu_threads_per_rank;
    mr.gpu_product = gpu_product_label(r.gpu_name);
    mr.hardware = r.hardware;
    // The plan's own global batch: --global-batch, or with 0 the micro-batch x GAS x ranks it chose.
    mr.steps = static_cast<int64_t>(
        std::ceil(o.train_tokens / (static_cast<double>(r.plan.config.global_batch()) * r.plan.config.seq_len)));
    size_pod(r.plan, r.pod_cores_per_gpu, mr);
    const HardwareProfile hw = resolve_hardware(r.hardware, dir);
    ReportContext ctx{&model, &hw, 0};
    nlohmann::json pj;
    pj["model"] = model_to_json(model);
    pj["plans"] = nlohmann::json::array({plan_to_json(r.plan, ctx)});
    mr.plan_json = pj.dump(2);
    manifest_text = k8s_manifest_yaml(model, r.plan, mr);
  }
  if (!co.k8s_manifest.empty()) write_file_atomic(co.k8s_manifest, manifest_text);
  if (!co.svg.empty())
    write_file_atomic(co.svg, compare_svg(rows, model.name + ": " + fmt("%g", o.train_tokens) + " tokens, cost against time"));

  auto plan_text = [](const Prediction& p) {
    return family_name(p.config) + ", micro " + std::to_string(p.config.micro_batch) + " x GAS " + std::to_string(p.config.gas);
  };
  if (o.json) {
    nlohmann::json j;
    j["model"] = model.name;
    j["train_tokens"] = o.train_tokens;
    j["engine"] = co.engine;
    j["global_batch"] = co.global_batch;
    j["rows"] = nlohmann::json::array();
    for (const CompareRow& r : rows) {
      ReportContext ctx{&model, nullptr, 0};
      j["rows"].push_back({{"hardware", r.hardware},
                           {"provider", r.provider},
                           {"usd_per_gpu_hour", r.usd_per_gpu_hour},
                           {"kubernetes", r.kubernetes},
                           {"price_includes_host", r.includes_host},
                           {"gpus_per_node", r.gpus_per_node},
                           {"nodes", r.nodes},
                           {"gpus", r.gpus()},
                           {"plan", plan_text(r.plan)},
                           {"config", plan_to_json(r.plan, ctx)["config"]},
                           {"tokens_per_s", r.plan.throughput.tokens_per_s},
                           {"wall_s", r.wall_s},
                           {"gpu_hours", r.gpu_hours},
                           {"cost_usd", r.cost_usd},
                           {"interval_95_frac", r.interval_frac},
                           {"basis", r.calibrated ? "calibrated" : "transferred"},
                           {"pareto", r.on_front},
                           {"flags", r.flags}});
    }
    if (cheapest) j["cheapest_within_deadline"] = *cheapest;
    if (fastest) j["fastest_within_budget"] = *fastest;
    if (!co.k8s_manifest.empty()) j["k8s_manifest"] = {{"file", co.k8s_manifest}, {"row", *chosen}};
    j["deadline_hours"] = co.deadline_hours;
    j["budget_usd"] = co.budget_usd;
    j["notes"] = notes;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << model.name << ": " << fmt("%g", o.train_tokens) << " tokens, global batch "
            << (co.global_batch > 0 ? std::to_string(co.global_batch) + " sequences of "
                                    : std::string("free (GAS 1..32 at each count), sequences of "))
            << o.seq << ", engine " << co.engine << "; best plan per GPU kind and count (as recommend ranks)\n";
  std::vector<std::vector<std::string>> table;
  table.push_back({"", "hardware", "provider", "$/GPU-h", "GPUs", "plan", "tokens/s", "wall h", "GPU-h", "cost $", "±95%", "basis"});
  for (const CompareRow& r : rows) {
    table.push_back({r.on_front ? "*" : "", r.hardware, r.provider, fmt("%.2f", r.usd_per_gpu_hour),
                     r.nodes > 1 ? std::to_string(r.nodes) + "x" + std::to_string(r.gpus_per_node) : std::to_string(r.gpus()),
                     plan_text(r.plan), fmt("%.0f", r.plan.throughput.tokens_per_s), hours_text(r.wall_s),
                     fmt("%.1f", r.gpu_hours), fmt("%.0f", r.cost_usd),
                     r.interval_frac > 0 ? fmt("%.0f", 100 * r.interval_frac) + "%" : "?",
                     r.calibrated ? "calibrated" : "transferred"});
  }
  std::vector<size_t> widths(table.front().size(), 0);
  for (const auto& row : table)
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  for (const auto& row : table) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      const bool left_align = i == 1 || i == 2 || i == 5 || i == 11;
      std::string cell = row[i];
      const std::string pad(widths[i] - cell.size(), ' ');
      line += (left_align ? cell + pad : pad + cell) + (i + 1 < row.size() ? "  " : "");
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::cout << line << "\n";
  }
  std::cout << "* on the Pareto front of cost against wall-clock (no other row is both cheaper and faster)\n";
  std::cout << "±95%: the step time's interval; calibrated: fitted on that GPU; transferred: datasheet figures with "
               "the H200's engine behaviour, interval from published throughputs (calibrate report --published)\n";
  std::map<std::string, std::vector<std::string>> flagged;
  for (const CompareRow& r : rows)
    for (const std::string& f : r.flags) {
      auto& v = flagged[f];
      if (std::find(v.begin(), v.end(), r.hardware) == v.end()) v.push_back(r.hardware);
    }
  for (const auto& [f, ks] : flagged) {
    if (f.find(" is pod-limited: ") != std::string::npos) {
      std::cout << "! " << f << "\n";
      continue;
    }
    std::string list;
    for (const auto& k : ks) list += (list.empty() ? "" : ", ") + k;
    std::cout << "! " << f << ": " << list << "\n";
  }
  auto describe = [&](const CompareRow& r) {
    return r.hardware + " x" + std::to_string(r.gpus()) + " (" + r.provider + "): " + hours_text(r.wall_s) + " h, $" +
           fmt("%.0f", r.cost_usd) + ", " + plan_text(r.plan);
  };
  if (cheapest) std::cout << (co.deadline_hours > 0 ? "cheapest within " + fmt("%g", co.deadline_hours) + " h: " : "cheapest: ") << describe(rows[*cheapest]) << "\n";
  if (fastest) std::cout << (co.budget_usd > 0 ? "fastest within $" + fmt("%g", co.budget_usd) + ": " : "fastest: ") << describe(rows[*fastest]) << "\n";
  for (const std::string& n : notes) std::cout << "note: " << n << "\n";
  if (!co.svg.empty()) std::cout << "plot written to " << co.svg << "\n";
  if (!co.k8s_manifest.empty())
    std::cout << "Kubernetes manifest (ConfigMap + PyTorchJob) for " << describe(rows[*chosen]) << " written to "
              << co.k8s_manifest << "\n";
  return 0;
}

}  // namespace stepcast
