// The HTML page of one or more runs (run_report.h).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "fsdp/report/run_report.h"
#include "svg_chart.h"

namespace fsdp::report {

namespace {

// Distinct, colour-blind-safe (Okabe and Ito): one per run.
const char* kRunColours[] = {"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000"};
const char* colour_of(size_t run) { return kRunColours[run % (sizeof(kRunColours) / sizeof(*kRunColours))]; }

std::string bytes_text(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::abs(bytes) >= 1024.0 && u < 4) bytes /= 1024.0, ++u;
  char text[32];
  std::snprintf(text, sizeof(text), bytes == std::floor(bytes) ? "%.0f %s" : "%.3g %s", bytes, units[u]);
  return text;
}

std::string count_text(double v) {
  char text[32];
  if (std::abs(v) >= 1e6) std::snprintf(text, sizeof(text), "%gM", v / 1e6);
  else if (std::abs(v) >= 1e3) std::snprintf(text, sizeof(text), "%gk", v / 1e3);
  else std::snprintf(text, sizeof(text), "%g", v);
  return text;
}

std::string percent_text(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g%%", 100.0 * v);
  return text;
}

std::string label(const std::vector<RunData>& runs, size_t i, const std::string& what) {
  return runs.size() == 1 ? what : runs[i].name + (what.empty() ? "" : " " + what);
}

std::vector<Marker> markers_of(const RunData& run) {
  std::vector<Marker> markers;
  for (const auto& e : run.events) {
    const char* colour = e.kind == RunEvent::Kind::Skipped      ? "#d62728"
                         : e.kind == RunEvent::Kind::Checkpoint ? "#999999"
                         : e.kind == RunEvent::Kind::Restart    ? "#1f77b4"
                                                                : "#ff7f0e";
    markers.push_back({static_cast<double>(e.step), colour, (run.name + ": " + e.text)});
  }
  return markers;
}

// At most this many points per series: a long run's page stays small and quick to rewrite.
constexpr size_t kMaxPoints = 1500;

template <class Get>
Series series_of(const RunData& run, const std::string& name, const char* colour, Get get, bool dashed = false) {
  Series s{name, colour, {}, dashed};
  const size_t stride = (run.steps.size() + kMaxPoints - 1) / kMaxPoints;
  for (size_t i = 0; i < run.steps.size(); ++i) {
    if (i % stride != 0 && i + 1 != run.steps.size()) continue;  // every stride-th step, and the last
    const double y = get(run.steps[i]);
    if (std::isfinite(y)) s.points.push_back({static_cast<double>(run.steps[i].step), y});
  }
  return s;
}

const char* kStyle = R"(
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px 0; } h2 { font-size: 16px; margin: 24px 0 8px 0; }
.runs span { display: inline-block; margin-right: 16px; } .swatch { display: inline-block; width: 14px; height: 4px; vertical-align: middle; margin-right: 6px; }
.plots { display: flex; flex-wrap: wrap; gap: 12px; }
.plot { border: 1px solid #ddd; background: #fff; }
.chart-title { font-size: 14px; font-weight: 600; fill: #222; } .legend { font-size: 11px; fill: #333; }
.tick { font-size: 10px; fill: #555; } .axis-label { font-size: 11px; fill: #555; }
.grid { stroke: #eee; } .axis { stroke: #888; } .frame { fill: none; stroke: #bbb; }
.marker { stroke-width: 1.2; stroke-dasharray: 3,3; opacity: 0.8; } .no-data { font-size: 12px; fill: #999; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #ddd; padding: 4px 8px; text-align: left; }
.target-missed { background: #fde0d0; } .target-met { background: #e0f3e0; }
pre { background: #f6f6f6; padding: 8px; font-size: 12px; overflow-x: auto; }
.events li.skipped { color: #d62728; } .events li.restart { color: #1f77b4; } .events li.target { color: #c05000; }
.warning { color: #a00; }
)";

}  // namespace

namespace {

// The page's head and the runs' legend, with each run's warnings.
std::string page_start(const std::vector<RunData>& runs) {
  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>fsdp.cpp: ";
  for (size_t i = 0; i < runs.size(); ++i) html += (i ? ", " : "") + escape_xml(runs[i].name);
  html += "</title>\n<style>" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  html += "<h1>fsdp.cpp run report</h1>\n<div class=\"runs\">";
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    html += "<span class=\"run\" data-run=\"" + escape_xml(r.name) +
            "\"><span class=\"swatch\" style=\"background:" + std::string(colour_of(i)) + "\"></span>" +
            escape_xml(r.name) + " (" + escape_xml(r.dir) + "; " + std::to_string(r.world_size) + " rank" +
            (r.world_size == 1 ? "" : "s") + ", " + std::to_string(r.steps.back().step) + " steps)</span>";
  }
  html +=
      "</div>\n<p>Markers on every plot: <span style=\"color:#d62728\">skipped step</span>, "
      "<span style=\"color:#999\">checkpoint</span>, <span style=\"color:#1f77b4\">restart</span>, "
      "<span style=\"color:#ff7f0e\">missed target</span> (hover for details).</p>\n";
  for (const auto& r : runs) {
    for (const auto& w : r.warnings) html += "<p class=\"warning\">" + escape_xml(w) + "</p>\n";
  }
  return html;
}

// Training and validation loss, each run in its colour.
ChartSpec loss_chart(const std::vector<RunData>& runs, const std::vector<Marker>& markers) {
  const bool language = runs.front().language;
  ChartSpec c{"loss", "Loss", language ? "cross-entropy (nats/token)" : "cross-entropy", {}, markers, false, {}};
  for (size_t i = 0; i < runs.size(); ++i) {
    c.series.push_back(
        series_of(runs[i], label(runs, i, "training"), colour_of(i), [](const StepPoint& p) { return p.loss; }));
    Series v{label(runs, i, "validation"), colour_of(i), {}, true};
    for (const auto& e : runs[i].evals) v.points.push_back({static_cast<double>(e.step), e.loss});
    c.series.push_back(v);
  }
  return c;
}

// Each rank's peak memory, and fsdp-plan's prediction as a dashed line.
ChartSpec memory_chart(const std::vector<RunData>& runs, const std::vector<Marker>& markers) {
  ChartSpec c{"memory", "Peak memory per rank", "bytes", {}, markers, true, bytes_text, /*binary_ticks=*/true};
  for (size_t i = 0; i < runs.size(); ++i) {
    const size_t ranks = runs[i].steps.back().peak_memory_per_rank.size();
    for (size_t r = 0; r < ranks; ++r) {
      // One run: a colour per rank. Several: the run's colour for all its ranks.
      c.series.push_back(series_of(
          runs[i], label(runs, i, "rank " + std::to_string(r)), runs.size() == 1 ? colour_of(r) : colour_of(i),
          [r](const StepPoint& p) { return r < p.peak_memory_per_rank.size() ? p.peak_memory_per_rank[r] : NAN; }));
    }
    if (runs[i].predicted_peak_bytes > 0) {
      Series plan{label(runs, i, "fsdp-plan"), runs.size() == 1 ? "#000000" : colour_of(i), {}, true};
      plan.points = {{static_cast<double>(runs[i].steps.front().step), runs[i].predicted_peak_bytes},
                     {static_cast<double>(runs[i].steps.back().step), runs[i].predicted_peak_bytes}};
      c.series.push_back(plan);
    }
  }
  return c;
}

// Communication busy time per step, and the part of it exposed (not hidden behind compute).
ChartSpec communication_chart(const std::vector<RunData>& runs, const std::vector<Marker>& markers) {
  ChartSpec c{"communication", "Communication per step (largest rank)", "seconds", {}, markers, true, {}};
  for (size_t i = 0; i < runs.size(); ++i) {
    c.series.push_back(
        series_of(runs[i], label(runs, i, "busy"), colour_of(i), [](const StepPoint& p) { return p.communication; }));
    Series exposed = series_of(
        runs[i], label(runs, i, "exposed"), colour_of(i),
        [](const StepPoint& p) { return p.exposed >= 0 ? p.exposed : NAN; }, true);
    if (!exposed.points.empty()) c.series.push_back(exposed);
  }
  return c;
}

// Every plot, in the page's order, each with the runs' markers.
std::vector<ChartSpec> charts_of(const std::vector<RunData>& runs) {
  const bool language = runs.front().language;
  std::vector<Marker> markers;
  for (const RunData& run : runs) {
    auto m = markers_of(run);
    markers.insert(markers.end(), m.begin(), m.end());
  }
  std::vector<ChartSpec> charts{loss_chart(runs, markers)};
  auto per_run = [&](const std::string& id, const std::string& title, const std::string& y_label, auto get,
                     std::function<std::string(double)> format, bool from_zero) {
    ChartSpec c{id, title, y_label, {}, markers, from_zero, format};
    for (size_t i = 0; i < runs.size(); ++i)
      c.series.push_back(series_of(runs[i], label(runs, i, ""), colour_of(i), get));
    if (runs.size() == 1) c.series.front().label = title;
    charts.push_back(c);
  };
  per_run(
      "lr", "Learning rate", "lr", [](const StepPoint& p) { return p.lr; }, nullptr, true);
  per_run(
      "throughput", language ? "Tokens per second" : "Images per second", language ? "tokens/s" : "images/s",
      [](const StepPoint& p) { return p.rate; }, count_text, true);
  per_run(
      "mfu", "MFU", "model FLOPs utilisation", [](const StepPoint& p) { return p.mfu; }, percent_text, true);
  charts.push_back(memory_chart(runs, markers));
  charts.push_back(communication_chart(runs, markers));
  per_run(
      "grad_norm", "Gradient norm (before clipping)", "global L2 norm", [](const StepPoint& p) { return p.grad_norm; },
      nullptr, true);
  // float16 runs: the loss scale, halved at each overflow (a skipped-step marker), grown after clean runs.
  const bool any_loss_scale = std::any_of(runs.begin(), runs.end(), [](const RunData& run) {
    return std::any_of(run.steps.begin(), run.steps.end(), [](const StepPoint& p) { return p.loss_scale > 0; });
  });
  if (any_loss_scale) {
    per_run(
        "loss_scale", "Loss scale (float16)", "scale",
        [](const StepPoint& p) { return p.loss_scale > 0 ? p.loss_scale : NAN; }, count_text, true);
  }
  return charts;
}

// Measured against predicted memory, a row per run.
std::string memory_table(const std::vector<RunData>& runs) {
  std::string html =
      "<h2>Memory: measured and planned</h2>\n<table class=\"memory\"><tr><th>run</th><th>fsdp-plan per "
      "rank</th><th>measured peak (largest rank)</th><th>measured / planned</th></tr>\n";
  for (const auto& r : runs) {
    double measured = 0;
    for (const auto& p : r.steps) {
      for (double m : p.peak_memory_per_rank) measured = std::max(measured, m);
    }
    char ratio[32] = "-";
    if (r.predicted_peak_bytes > 0) std::snprintf(ratio, sizeof(ratio), "%.2f", measured / r.predicted_peak_bytes);
    html += "<tr><td>" + escape_xml(r.name) + "</td><td>" +
            (r.predicted_peak_bytes > 0 ? bytes_text(r.predicted_peak_bytes) : "-") + "</td><td>" +
            bytes_text(measured) + "</td><td>" + ratio + "</td></tr>\n";
  }
  return html + "</table>\n";
}

// The runs' [targets], met or missed.
std::string targets_section(const std::vector<RunData>& runs) {
  std::string html = "<h2>Targets</h2>\n";
  bool any_target = false;
  for (const auto& r : runs) any_target = any_target || !r.targets.empty();
  if (!any_target) return html + "<p>None set (a config's [targets] section).</p>\n";
  html += "<table class=\"targets\"><tr><th>run</th><th>target</th><th>limit</th><th>outcome</th></tr>\n";
  for (const auto& r : runs) {
    for (const auto& t : r.targets) {
      char number[32];
      std::snprintf(number, sizeof(number), "%g", t.limit);
      const std::string limit = t.key.find("memory") != std::string::npos ? bytes_text(t.limit) : number;
      html += "<tr class=\"" + std::string(t.missed ? "target-missed" : "target-met") + "\" data-target=\"" +
              escape_xml(t.key) + "\"><td>" + escape_xml(r.name) + "</td><td>" + escape_xml(t.key) + "</td><td>" +
              limit + "</td><td>" +
              (t.missed ? "missed at step " + std::to_string(t.step) + ": " + escape_xml(t.message) : "met so far") +
              "</td></tr>\n";
    }
  }
  return html + "</table>\n";
}

// Skipped steps, checkpoints, restarts and missed targets, then each run's resolved config.
std::string events_and_configs(const std::vector<RunData>& runs) {
  std::string html = "<h2>Events</h2>\n<ul class=\"events\">\n";
  for (const auto& r : runs) {
    for (const auto& e : r.events) {
      const char* kind = e.kind == RunEvent::Kind::Skipped      ? "skipped"
                         : e.kind == RunEvent::Kind::Checkpoint ? "checkpoint"
                         : e.kind == RunEvent::Kind::Restart    ? "restart"
                                                                : "target";
      html += "<li class=\"" + std::string(kind) + "\">" + escape_xml(r.name) + ": " + escape_xml(e.text) + "</li>\n";
    }
  }
  html += "</ul>\n<h2>Configuration</h2>\n";
  for (const auto& r : runs) {
    html += "<details open><summary>" + escape_xml(r.name) + " (resolved config.toml)</summary><pre>" +
            escape_xml(r.config_toml) + "</pre></details>\n";
  }
  return html;
}

}  // namespace

std::string render_html(const std::vector<RunData>& runs) {
  if (runs.empty()) throw std::invalid_argument("render_html: no runs");
  std::string html = page_start(runs);
  html += "<div class=\"plots\">\n";
  for (const auto& c : charts_of(runs)) html += svg_chart(c);
  html += "</div>\n";
  html += memory_table(runs);
  html += targets_section(runs);
  html += events_and_configs(runs);
  html += "</body>\n</html>\n";
  return html;
}

std::vector<std::string> write_report(const std::vector<std::string>& run_dirs, const std::string& output) {
  std::vector<RunData> runs;
  std::vector<std::string> warnings;
  for (const auto& dir : run_dirs) {
    runs.push_back(read_run(dir));
    warnings.insert(warnings.end(), runs.back().warnings.begin(), runs.back().warnings.end());
  }
  // Runs of one config share a name: tell them apart by their directories.
  for (auto& run : runs) {
    int same = 0;
    for (const auto& other : runs) same += other.name == run.name;
    if (same > 1) run.name += " (" + run.dir + ")";
  }
  const std::string html = render_html(runs);
  const std::string temporary = output + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary);
    out << html;
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(temporary, ignored);
      throw std::runtime_error("cannot write report '" + output + "'");
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, output, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    throw std::runtime_error("cannot write report '" + output + "': " + error.message());
  }
  return warnings;
}

}  // namespace fsdp::report
