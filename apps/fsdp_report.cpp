// fsdp-report: one self-contained HTML page for one or more runs (their output_dir), overlaid.
//
//   fsdp-report runs/gpt-fortunes-tiny                      # writes runs/gpt-fortunes-tiny/report.html
//   fsdp-report runs/a runs/b --output compare.html         # two runs, each in its own colour
// fsdp-train also rewrites <output_dir>/report.html as it runs (train.report_every).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "fsdp/report/run_report.h"

int main(int argc, char** argv) {
  CLI::App app{
      "fsdp-report: a run at a glance: loss, learning rate, throughput, MFU, memory (measured and planned),\n"
      "communication, gradient norm, events and targets, as one HTML file that works offline."};
  std::vector<std::string> runs;
  std::string output;
  app.add_option("runs", runs, "run directories (each with metrics.jsonl)")->required();
  app.add_option("-o,--output", output,
                 "HTML file to write (default: RUN/report.html for one run, report.html for several)");
  CLI11_PARSE(app, argc, argv);
  if (output.empty()) output = runs.size() == 1 ? runs.front() + "/report.html" : "report.html";
  try {
    for (const auto& warning : fsdp::report::write_report(runs, output))
      std::fprintf(stderr, "fsdp-report: warning: %s\n", warning.c_str());
    std::printf("%s\n", output.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp-report: error: %s\n", e.what());
    return 1;
  }
}
