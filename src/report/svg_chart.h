// Private to report/: one line chart as inline SVG (no script, no external file).
//   <svg class="plot" data-plot="ID"> axes, ticks, a legend, one <path class="series"> per series
//   (data-series="label"), and vertical event markers (<line class="marker">) with a tooltip.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::report {

struct Series {
  std::string label;
  std::string color;                              // CSS colour
  std::vector<std::pair<double, double>> points;  // (x, y), x increasing
  bool dashed = false;
};

struct Marker {
  double x = 0;
  std::string color;
  std::string text;  // tooltip
};

struct ChartSpec {
  std::string id, title, y_label;
  std::vector<Series> series;
  std::vector<Marker> markers;
  bool y_from_zero = false;
  std::function<std::string(double)> format_y;  // tick labels (default: %g)
  bool binary_ticks = false;                    // ticks at powers of two (bytes: 64 MiB, 128 MiB, ...)
};

std::string svg_chart(const ChartSpec& chart);
std::string escape_xml(const std::string& text);

}  // namespace fsdp::report
