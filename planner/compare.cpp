#include "planner/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/errors.h"

namespace stepcast {

RunCost run_cost(double train_tokens, double tokens_per_s, int gpus, double usd_per_gpu_hour) {
  RunCost c;
  if (tokens_per_s <= 0) return c;
  c.wall_s = train_tokens / tokens_per_s;
  c.gpu_hours = c.wall_s / 3600.0 * gpus;
  c.cost_usd = c.gpu_hours * usd_per_gpu_hour;
  return c;
}

void mark_pareto_front(std::vector<CompareRow>& rows) {
  for (CompareRow& r : rows) {
    r.on_front = true;
    for (const CompareRow& o : rows) {
      const bool no_worse = o.cost_usd <= r.cost_usd && o.wall_s <= r.wall_s;
      const bool better = o.cost_usd < r.cost_usd || o.wall_s < r.wall_s;
      if (no_worse && better) {
        r.on_front = false;
        break;
      }
    }
  }
}

std::optional<size_t> cheapest_within(const std::vector<CompareRow>& rows, double deadline_s) {
  std::optional<size_t> best;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (deadline_s > 0 && rows[i].wall_s > deadline_s) continue;
    if (!best || rows[i].cost_usd < rows[*best].cost_usd ||
        (rows[i].cost_usd == rows[*best].cost_usd && rows[i].wall_s < rows[*best].wall_s))
      best = i;
  }
  return best;
}

std::optional<size_t> fastest_within(const std::vector<CompareRow>& rows, double budget_usd) {
  std::optional<size_t> best;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (budget_usd > 0 && rows[i].cost_usd > budget_usd) continue;
    if (!best || rows[i].wall_s < rows[*best].wall_s ||
        (rows[i].wall_s == rows[*best].wall_s && rows[i].cost_usd < rows[*best].cost_usd))
      best = i;
  }
  return best;
}

std::vector<std::pair<int, int>> gpu_layouts(int gpus_per_node_max, int max_gpus) {
  std::vector<std::pair<int, int>> out;
  for (int g = 1; g <= gpus_per_node_max && g <= max_gpus; g *= 2) out.emplace_back(g, 1);
  if (out.empty() || out.back().first != gpus_per_node_max) {
    if (gpus_per_node_max <= max_gpus) out.emplace_back(gpus_per_node_max, 1);
  }
  for (int n = 2; static_cast<int64_t>(n) * gpus_per_node_max <= max_gpus; n *= 2)
    out.emplace_back(gpus_per_node_max, n);
  return out;
}

std::map<std::string, double> parse_price_overrides(const std::vector<std::string>& items) {
  std::map<std::string, double> out;
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      throw InputError("--price \"" + item + "\" is not KIND=USD (e.g. --price h100-sxm=2.99)");
    const std::string kind = item.substr(0, eq);
    const std::string value = item.substr(eq + 1);
    char* end = nullptr;
    const double usd = std::strtod(value.c_str(), &end);
    if (end == value.c_str() || *end != '\0' || !std::isfinite(usd) || usd <= 0 || usd > 1e3)
      throw InputError("--price \"" + item + "\": the price \"" + value +
                       "\" is not a number of USD per GPU-hour in (0, 1000]");
    out[kind] = usd;
  }
  return out;
}

namespace {

std::string xml_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '&') o += "&amp;";
    else if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else o += c;
  }
  return o;
}

}  // namespace

std::string compare_svg(const std::vector<CompareRow>& rows, const std::string& title) {
  // Both axes logarithmic: costs and times span decades across GPU kinds and counts.
  const double w = 760, h = 520, left = 80, right = 20, top = 40, bottom = 60;
  double cmin = 1e300, cmax = 0, tmin = 1e300, tmax = 0;
  for (const CompareRow& r : rows) {
    if (r.cost_usd <= 0 || r.wall_s <= 0) continue;
    cmin = std::min(cmin, r.cost_usd);
    cmax = std::max(cmax, r.cost_usd);
    tmin = std::min(tmin, r.wall_s / 3600.0);
    tmax = std::max(tmax, r.wall_s / 3600.0);
  }
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  o << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o << "<text x=\"" << w / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">" << xml_escape(title) << "</text>\n";
  if (cmax <= 0) {
    o << "</svg>\n";
    return o.str();
  }
  const double lc0 = std::floor(std::log10(cmin)), lc1 = std::max(lc0 + 1, std::ceil(std::log10(cmax)));
  const double lt0 = std::floor(std::log10(tmin)), lt1 = std::max(lt0 + 1, std::ceil(std::log10(tmax)));
  auto X = [&](double usd) { return left + (std::log10(usd) - lc0) / (lc1 - lc0) * (w - left - right); };
  auto Y = [&](double hours) { return h - bottom - (std::log10(hours) - lt0) / (lt1 - lt0) * (h - top - bottom); };
  o << "<line x1=\"" << left << "\" y1=\"" << h - bottom << "\" x2=\"" << w - right << "\" y2=\"" << h - bottom << "\" stroke=\"black\"/>\n";
  o << "<line x1=\"" << left << "\" y1=\"" << top << "\" x2=\"" << left << "\" y2=\"" << h - bottom << "\" stroke=\"black\"/>\n";
  for (double e = lc0; e <= lc1; e += 1) {
    char b[32];
    std::snprintf(b, sizeof b, "$%g", std::pow(10.0, e));
    o << "<text x=\"" << X(std::pow(10.0, e)) << "\" y=\"" << h - bottom + 16 << "\" text-anchor=\"middle\">" << b << "</text>\n";
  }
  for (double e = lt0; e <= lt1; e += 1) {
    char b[32];
    std::snprintf(b, sizeof b, "%g h", std::pow(10.0, e));
    o << "<text x=\"" << left - 6 << "\" y=\"" << Y(std::pow(10.0, e)) + 4 << "\" text-anchor=\"end\">" << b << "</text>\n";
  }
  o << "<text x=\"" << (left + w - right) / 2 << "\" y=\"" << h - 20 << "\" text-anchor=\"middle\">cost of the whole run (USD, log)</text>\n";
  o << "<text x=\"20\" y=\"" << (top + h - bottom) / 2 << "\" text-anchor=\"middle\" transform=\"rotate(-90 20 "
    << (top + h - bottom) / 2 << ")\">wall-clock (hours, log)</text>\n";
  std::vector<const CompareRow*> front;
  for (const CompareRow& r : rows)
    if (r.on_front && r.cost_usd > 0) front.push_back(&r);
  std::sort(front.begin(), front.end(), [](const CompareRow* a, const CompareRow* b) { return a->cost_usd < b->cost_usd; });
  if (front.size() > 1) {
    o << "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"1.5\" points=\"";
    for (const CompareRow* r : front) o << X(r->cost_usd) << "," << Y(r->wall_s / 3600.0) << " ";
    o << "\"/>\n";
  }
  for (const CompareRow& r : rows) {
    if (r.cost_usd <= 0 || r.wall_s <= 0) continue;
    const double x = X(r.cost_usd), y = Y(r.wall_s / 3600.0);
    o << "<circle cx=\"" << x << "\" cy=\"" << y << "\" r=\"" << (r.on_front ? 5 : 3) << "\" fill=\""
      << (r.calibrated ? "#1f77b4" : "none") << "\" stroke=\"" << (r.on_front ? "#d62728" : "#1f77b4") << "\"/>\n";
    if (r.on_front)
      o << "<text x=\"" << x + 7 << "\" y=\"" << y - 5 << "\">" << xml_escape(r.hardware) << " x" << r.gpus() << "</text>\n";
  }
  o << "<text x=\"" << w - right << "\" y=\"" << top << "\" text-anchor=\"end\">filled: calibrated profile; hollow: "
       "transferred; red: Pareto front</text>\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace stepcast
