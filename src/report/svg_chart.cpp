#include "svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace fsdp::report {

namespace {

constexpr double kWidth = 580, kHeight = 270, kLeft = 72, kRight = 16, kTop = 46, kBottom = 36;

std::string number(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", v);
  return text;
}

// Tick spacing of 1, 2 or 5 times a power of ten giving about `count` ticks over [lo, hi].
double tick_step(double lo, double hi, int count) {
  const double raw = (hi - lo) / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10.0 * power;
}

std::string default_format(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", v);
  return text;
}

}  // namespace

std::string escape_xml(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string svg_chart(const ChartSpec& chart) {
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo, y_lo = x_lo, y_hi = -x_lo;
  for (const auto& s : chart.series) {
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
    }
  }
  std::string svg = "<svg class=\"plot\" data-plot=\"" + escape_xml(chart.id) +
                    "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + number(kWidth) + "\" height=\"" +
                    number(kHeight) + "\" viewBox=\"0 0 " + number(kWidth) + " " + number(kHeight) +
                    "\" role=\"img\">\n";
  svg += "<title>" + escape_xml(chart.title) + "</title>\n";
  svg += "<text x=\"" + number(kLeft) + "\" y=\"16\" class=\"chart-title\">" + escape_xml(chart.title) + "</text>\n";
  // Legend: one swatch per series, in a row under the title.
  double legend_x = kLeft;
  for (const auto& s : chart.series) {
    svg += "<line x1=\"" + number(legend_x) + "\" y1=\"30\" x2=\"" + number(legend_x + 18) + "\" y2=\"30\" stroke=\"" +
           s.color + "\" stroke-width=\"2.5\"" + (s.dashed ? " stroke-dasharray=\"5,3\"" : "") + "/>";
    svg += "<text x=\"" + number(legend_x + 22) + "\" y=\"34\" class=\"legend\">" + escape_xml(s.label) + "</text>\n";
    legend_x += 30 + 6.2 * static_cast<double>(s.label.size());
  }
  const double plot_w = kWidth - kLeft - kRight, plot_h = kHeight - kTop - kBottom;
  svg += "<rect x=\"" + number(kLeft) + "\" y=\"" + number(kTop) + "\" width=\"" + number(plot_w) + "\" height=\"" +
         number(plot_h) + "\" class=\"frame\"/>\n";
  if (!std::isfinite(x_lo)) {
    svg += "<text x=\"" + number(kLeft + plot_w / 2) + "\" y=\"" + number(kTop + plot_h / 2) +
           "\" text-anchor=\"middle\" class=\"no-data\">no data recorded</text>\n</svg>\n";
    return svg;
  }
  if (chart.y_from_zero) y_lo = std::min(0.0, y_lo);
  if (y_hi - y_lo < 1e-12 * std::max(1.0, std::abs(y_hi))) {
    const double pad = std::max(std::abs(y_hi) * 0.05, 1e-9);
    y_lo -= pad, y_hi += pad;
  } else {
    const double pad = 0.05 * (y_hi - y_lo);
    y_hi += pad;
    if (!(chart.y_from_zero && y_lo == 0.0)) y_lo -= pad;
  }
  if (x_hi == x_lo) x_lo -= 1, x_hi += 1;
  auto px = [&](double x) { return kLeft + (x - x_lo) / (x_hi - x_lo) * plot_w; };
  auto py = [&](double y) { return kTop + plot_h - (y - y_lo) / (y_hi - y_lo) * plot_h; };
  const auto format = chart.format_y ? chart.format_y : default_format;
  // Grid and ticks.
  const double ys =
      chart.binary_ticks ? std::pow(2.0, std::ceil(std::log2((y_hi - y_lo) / 5))) : tick_step(y_lo, y_hi, 5);
  for (double y = std::ceil(y_lo / ys) * ys; y <= y_hi + 1e-9 * ys; y += ys) {
    svg += "<line x1=\"" + number(kLeft) + "\" y1=\"" + number(py(y)) + "\" x2=\"" + number(kLeft + plot_w) +
           "\" y2=\"" + number(py(y)) + "\" class=\"grid\"/><text x=\"" + number(kLeft - 6) + "\" y=\"" +
           number(py(y) + 4) + "\" text-anchor=\"end\" class=\"tick\">" +
           escape_xml(format(std::abs(y) < ys * 1e-9 ? 0.0 : y)) + "</text>\n";
  }
  const double xs = std::max(1.0, tick_step(x_lo, x_hi, 6));
  for (double x = std::ceil(x_lo / xs) * xs; x <= x_hi + 1e-9; x += xs) {
    svg += "<line x1=\"" + number(px(x)) + "\" y1=\"" + number(kTop + plot_h) + "\" x2=\"" + number(px(x)) +
           "\" y2=\"" + number(kTop + plot_h + 4) + "\" class=\"axis\"/><text x=\"" + number(px(x)) + "\" y=\"" +
           number(kTop + plot_h + 16) + "\" text-anchor=\"middle\" class=\"tick\">" + default_format(x) + "</text>\n";
  }
  svg += "<text x=\"" + number(kLeft + plot_w / 2) + "\" y=\"" + number(kHeight - 4) +
         "\" text-anchor=\"middle\" class=\"axis-label\">step</text>\n";
  svg += "<text x=\"14\" y=\"" + number(kTop + plot_h / 2) +
         "\" text-anchor=\"middle\" class=\"axis-label\" transform=\"rotate(-90 14 " + number(kTop + plot_h / 2) +
         ")\">" + escape_xml(chart.y_label) + "</text>\n";
  // Event markers under the series.
  for (const auto& m : chart.markers) {
    if (m.x < x_lo || m.x > x_hi) continue;
    svg += "<line class=\"marker\" x1=\"" + number(px(m.x)) + "\" y1=\"" + number(kTop) + "\" x2=\"" + number(px(m.x)) +
           "\" y2=\"" + number(kTop + plot_h) + "\" stroke=\"" + m.color + "\"><title>" + escape_xml(m.text) +
           "</title></line>\n";
  }
  for (const auto& s : chart.series) {
    std::string d;
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      d += (d.empty() ? "M" : " L") + number(px(x)) + " " + number(py(y));
    }
    if (d.empty()) continue;
    if (s.points.size() == 1) d += " l0.1 0";  // a single point still shows (round caps)
    svg += "<path class=\"series\" data-series=\"" + escape_xml(s.label) + "\" d=\"" + d + "\" stroke=\"" + s.color +
           "\" fill=\"none\" stroke-width=\"1.8\" stroke-linecap=\"round\"" +
           (s.dashed ? " stroke-dasharray=\"5,3\"" : "") + "/>\n";
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace fsdp::report
