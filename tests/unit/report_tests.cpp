// The run report (report/run_report.h) on metrics.jsonl written here, and the trainer's target
// checks (src/train/targets.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fsdp/report/run_report.h"
#include "train/targets.h"

namespace report_tests {

namespace fs = std::filesystem;

class RunDir {
 public:
  explicit RunDir(const std::string& metrics) {
    path_ = fs::temp_directory_path() / ("fsdp_report_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
    std::ofstream(path_ / "metrics.jsonl") << metrics;
    std::ofstream(path_ / "config.toml") << "name = \"x\"\n";
  }
  ~RunDir() { fs::remove_all(path_); }
  std::string path() const { return path_.string(); }

 private:
  fs::path path_;
};

std::string step(int s, double loss) {
  return "{\"step\": " + std::to_string(s) + ", \"loss\": " + std::to_string(loss) +
         ", \"lr\": 0.001, \"grad_norm\": 1.5, \"step_seconds\": 0.1, \"tokens_per_second\": 1000, \"mfu\": 0.2, "
         "\"peak_resident_bytes_per_rank\": [1e8, 1.1e8], \"communication_seconds_per_rank\": [0.01, 0.02], "
         "\"exposed_communication_seconds_per_rank\": [0.001, 0.002], \"skipped\": " +
         (s == 3 ? "true" : "false") + "}\n";
}

TEST(Report, ReadsStepsEventsTargetsAndAResume) {
  std::string metrics =
      "{\"run_start\": 0, \"name\": \"demo\", \"world_size\": 2, \"language\": true, \"resumed_from\": \"\", "
      "\"config\": \"[model]\\nname = 'gpt-test'\\n\", \"predicted_peak_bytes_per_rank\": 1.2e8, "
      "\"targets\": {\"min_tokens_per_second\": 5000, \"max_memory_per_rank\": 1e9}}\n";
  metrics += "{\"eval_step\": 0, \"validation_loss\": 5.5, \"perplexity\": 245}\n";
  for (int s = 1; s <= 4; ++s) metrics += step(s, 5.0 - 0.1 * s);
  metrics += "{\"checkpoint_step\": 2, \"path\": \"x\", \"seconds\": 0.1}\n";
  metrics +=
      "{\"target_missed\": \"min_tokens_per_second\", \"step\": 2, \"value\": 1000, \"limit\": 5000, \"message\": "
      "\"too slow\"}\n";
  metrics +=
      "{\"target_missed\": \"max_memory_per_rank\", \"step\": 4, \"value\": 2e9, \"limit\": 1e9, \"message\": \"too "
      "big\"}\n";
  // Resumed from step 2: steps 3 and 4 are recorded again and replace the first run's; what the
  // first run marked after step 2 (its skipped step 3, its memory miss at step 4) is discarded.
  metrics += "{\"run_start\": 2, \"name\": \"demo\", \"world_size\": 2, \"resumed_from\": \"ckpt/step-00000002\"}\n";
  for (int s = 3; s <= 5; ++s) metrics += step(s, 4.0 - 0.1 * s);
  RunDir dir(metrics);
  const auto run = fsdp::report::read_run(dir.path());
  EXPECT_EQ(run.name, "demo");
  EXPECT_EQ(run.world_size, 2);
  ASSERT_EQ(run.steps.size(), 5u);
  EXPECT_DOUBLE_EQ(run.steps[2].loss, 3.7);  // the resumed run's step 3
  EXPECT_DOUBLE_EQ(run.steps[4].exposed, 0.002);
  EXPECT_DOUBLE_EQ(run.predicted_peak_bytes, 1.2e8);
  ASSERT_EQ(run.targets.size(), 2u);  // by key: max_memory_per_rank, min_tokens_per_second
  EXPECT_EQ(run.targets[0].key, "max_memory_per_rank");
  EXPECT_FALSE(run.targets[0].missed);  // missed at step 4, in the part the resume discarded
  EXPECT_EQ(run.targets[1].key, "min_tokens_per_second");
  EXPECT_TRUE(run.targets[1].missed);
  EXPECT_EQ(run.targets[1].step, 2);
  int skipped = 0, checkpoints = 0, restarts = 0, missed = 0;
  for (const auto& e : run.events) {
    skipped += e.kind == fsdp::report::RunEvent::Kind::Skipped;
    checkpoints += e.kind == fsdp::report::RunEvent::Kind::Checkpoint;
    restarts += e.kind == fsdp::report::RunEvent::Kind::Restart;
    missed += e.kind == fsdp::report::RunEvent::Kind::TargetMissed;
  }
  EXPECT_EQ(skipped, 1);  // step 3 skipped in both runs; the first run's was discarded
  EXPECT_EQ(checkpoints, 1);
  EXPECT_EQ(restarts, 1);
  EXPECT_EQ(missed, 1);
  const std::string html = fsdp::report::render_html({run, run});
  for (const char* plot : {"loss", "lr", "throughput", "mfu", "memory", "communication", "grad_norm"}) {
    EXPECT_NE(html.find(std::string("data-plot=\"") + plot + "\""), std::string::npos) << plot;
  }
  EXPECT_NE(html.find("class=\"target-missed\" data-target=\"min_tokens_per_second\""), std::string::npos);
  EXPECT_NE(html.find("resumed at step 2 from ckpt/step-00000002"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);  // nothing to run, nothing fetched
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));
}

TEST(Report, BadMetricsAreNamedInOneLine) {
  RunDir truncated(step(1, 5.0) + step(2, 4.9) + "{\"step\": 3, \"lo");
  const auto run = fsdp::report::read_run(truncated.path());
  EXPECT_EQ(run.steps.size(), 2u);
  ASSERT_EQ(run.warnings.size(), 1u);
  EXPECT_NE(run.warnings[0].find("line 3 is truncated; left out"), std::string::npos) << run.warnings[0];
  RunDir broken(step(1, 5.0) + "not json\n" + step(2, 4.9));
  try {
    fsdp::report::read_run(broken.path());
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl: line 2 is not a JSON object"), std::string::npos) << e.what();
  }
  EXPECT_THROW(fsdp::report::read_run("/nonexistent/run"), std::runtime_error);
}

TEST(Targets, EachMissIsReportedOnceWhereItHappens) {
  fsdp::train::TargetsConfig t;
  t.min_tokens_per_second = 1000;
  t.max_memory_per_rank = 1 << 20;
  t.max_validation_loss = 2.0;
  t.max_validation_loss_step = 10;
  t.price_per_device_hour = 3.6;  // 1e-3 per device-second
  t.max_cost = 0.5;
  fsdp::train::TargetMonitor monitor(t, /*ranks=*/2, /*language=*/true);
  // Throughput: step 1 is warm-up, judged from the 4th rate on (step 5), on the median.
  for (int s = 1; s <= 4; ++s) EXPECT_TRUE(monitor.after_step(s, 500, 0.1, 1000, s).empty()) << s;
  auto misses = monitor.after_step(5, 500, 0.1, 1000, 5);
  ASSERT_EQ(misses.size(), 1u);
  EXPECT_EQ(misses[0].key, "min_tokens_per_second");
  EXPECT_EQ(misses[0].step, 5);
  EXPECT_NE(misses[0].message.find("below targets.min_tokens_per_second"), std::string::npos);
  EXPECT_TRUE(monitor.after_step(6, 500, 0.1, 1000, 6).empty());  // once
  misses = monitor.after_step(7, 2000, 0.1, 2 << 20, 7);
  ASSERT_EQ(misses.size(), 1u);
  EXPECT_EQ(misses[0].key, "max_memory_per_rank");
  // Cost: 2 ranks x 300 s x 1e-3 per device-second = 0.6 > 0.5.
  misses = monitor.after_step(8, 2000, 0.1, 1000, 300);
  ASSERT_EQ(misses.size(), 1u);
  EXPECT_EQ(misses[0].key, "max_cost");
  // Validation loss by step 10: not judged at step 5, judged (and missed) at the first evaluation from step 10.
  EXPECT_TRUE(monitor.after_evaluation(5, 9.0, false).empty());
  misses = monitor.after_evaluation(12, 2.5, false);
  ASSERT_EQ(misses.size(), 1u);
  EXPECT_EQ(misses[0].key, "max_validation_loss");
  EXPECT_TRUE(monitor.after_evaluation(20, 3.0, true).empty());

  fsdp::train::TargetsConfig late;
  late.max_validation_loss = 2.0;
  late.max_validation_loss_step = 1000;  // past the run's end: judged at its last evaluation
  fsdp::train::TargetMonitor past_end(late, 1, true);
  EXPECT_TRUE(past_end.after_evaluation(10, 3.0, false).empty());
  EXPECT_EQ(past_end.after_evaluation(20, 3.0, true).size(), 1u);

  fsdp::train::TargetsConfig met;
  met.max_validation_loss = 2.0;  // no step: judged at the end
  fsdp::train::TargetMonitor at_end(met, 1, true);
  EXPECT_TRUE(at_end.after_evaluation(10, 3.0, false).empty());
  EXPECT_TRUE(at_end.after_evaluation(20, 1.5, true).empty());
}

}  // namespace report_tests
