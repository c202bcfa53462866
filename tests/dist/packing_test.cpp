// data.packing, end to end: a packed fine-tune at N ranks equals a padded fine-tune of the same
// examples in the same order, step for step, trained in one process by plain libtorch.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "byte_level_tokenizer_files.h"
#include "fortune_instructions.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/data/instructions.h"
#include "fsdp/data/packed_instructions.h"
#include "fsdp/data/sampler.h"
#include "fsdp/data/tokenizer.h"
#include "fsdp/models/registry.h"
#include "fsdp/train/config.h"
#include "fsdp/train/sharded_model.h"
#include "fsdp/train/trainer.h"

namespace packing_test {

namespace fs = std::filesystem;
using fsdp::train::TrainConfig;

constexpr int64_t kSeq = 192;
constexpr int64_t kGlobalBatch = 12;  // rows; divisible by 1, 2, 3 and 4 ranks
constexpr int kSteps = 4;
constexpr int64_t kVocab = 257;  // the bytes and <|endoftext|>

TrainConfig packed_config(const fs::path& dir, const std::string& output_dir) {
  std::string text = "name = \"packing-test\"\noutput_dir = \"" + output_dir + "\"\n";
  text += "[model]\nname = \"llama-test\"\ncontext = " + std::to_string(kSeq) + "\n";
  text += "[data]\nsource = \"instructions\"\ntrain_jsonl = \"" + (dir / "train.jsonl").string() + "\"\n";
  text += "validation_jsonl = \"" + (dir / "validation.jsonl").string() + "\"\n";
  text += "tokenizer = \"gpt2\"\nvocab_json = \"" + (dir / "vocab.json").string() + "\"\nmerges_txt = \"" +
          (dir / "merges.txt").string() + "\"\nchat_format = \"plain\"\npacking = true\n";
  text += "[train]\nsteps = " + std::to_string(kSteps) + "\nglobal_batch = " + std::to_string(kGlobalBatch) +
          "\nseq_len = " + std::to_string(kSeq) + "\nthreads = 1\ngrad_clip = 0.0\n";
  // A constant learning rate and no weight decay: the reference is libtorch's AdamW as it comes.
  text += "[optimizer]\nlr = 3e-3\nmin_lr = 3e-3\nwarmup_steps = 0\nweight_decay = 0.0\n";
  text += "[eval]\nevery = " + std::to_string(kSteps) +
          "\nbatches = 1\nsample_tokens = 0\n[checkpoint]\nevery = " + std::to_string(kSteps) + "\n";
  return fsdp::train::parse_train_config(text, "packing_test");
}

struct Trajectory {
  std::vector<double> losses, grad_norms;
  std::map<std::string, at::Tensor> parameters;
  int64_t examples_per_step = 0;  // in the first step
};

// The padded reference: each step trains on the examples of that step's packed rows, one padded
// row each, in one process (no FSDP): loss = the sum over trained tokens / their count.
Trajectory padded_reference(const TrainConfig& config, const fs::path& dir) {
  fsdp::data::Gpt2BpeTokenizer tokenizer((dir / "vocab.json").string(), (dir / "merges.txt").string());
  std::vector<fsdp::data::RenderedExample> rendered;
  for (const auto& example : fsdp::data::read_instruction_jsonl((dir / "train.jsonl").string())) {
    rendered.push_back(fsdp::data::render_chat(example, fsdp::data::ChatFormat::Plain, tokenizer));
  }
  auto padded = std::make_shared<fsdp::data::InstructionDataset>(std::move(rendered), kSeq, tokenizer.end_of_text());
  const fsdp::data::PackedInstructionDataset packed(padded, config.seed);
  const fsdp::data::GlobalBatchSampler sampler(packed.size(), kGlobalBatch, config.seed);

  fsdp::models::ModelConfig model_config = config.model;
  std::get<fsdp::models::LlamaConfig>(model_config).vocab = kVocab;
  torch::manual_seed(config.seed);  // as build_sharded_model draws the initialisation
  fsdp::models::BuiltModel model = fsdp::models::build_model(model_config);
  auto parameters = model.module->parameters();
  torch::optim::AdamW optimizer(parameters, torch::optim::AdamWOptions(config.optimizer.lr)
                                                .betas({config.optimizer.beta1, config.optimizer.beta2})
                                                .eps(config.optimizer.eps)
                                                .weight_decay(0.0));
  Trajectory out;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<int64_t> examples;
    for (int64_t row : sampler.indices(step, 0, 1)) {
      for (int64_t example : packed.row(row)) examples.push_back(example);
    }
    if (step == 0) out.examples_per_step = static_cast<int64_t>(examples.size());
    int64_t count = 0;
    for (int64_t example : examples) count += padded->target_count(example);
    const fsdp::data::Batch batch = padded->get(examples);
    optimizer.zero_grad();
    const at::Tensor logits = model.forward(batch.inputs).to(at::kFloat);
    const at::Tensor loss =
        torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape(-1),
                                             torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) /
        static_cast<double>(count);
    loss.backward();
    double squares = 0.0;
    for (const auto& p : parameters) squares += p.grad().to(at::kDouble).pow(2).sum().item<double>();
    out.losses.push_back(loss.item<double>());
    out.grad_norms.push_back(std::sqrt(squares));
    optimizer.step();
  }
  for (const auto& item : model.module->named_parameters()) out.parameters[item.key()] = item.value().detach().clone();
  return out;
}

// Every parameter after training, from the run's last checkpoint, gathered whole, by name.
std::map<std::string, at::Tensor> final_parameters(const TrainConfig& config,
                                                   const fsdp::comm::ProcessGroupPtr& group) {
  auto sharded = fsdp::train::build_sharded_model(config, kVocab, group);
  fsdp::checkpoint::load_checkpoint(fsdp::checkpoint::find_latest_checkpoint(fsdp::train::checkpoints_dir(config)),
                                    *sharded.state, nullptr);
  std::map<std::string, at::Tensor> parameters;
  for (const auto& flat : sharded.state->flat_params()) {
    const auto tensors = flat->gather_full_params();
    for (size_t i = 0; i < tensors.size(); ++i) parameters[flat->layout().entries[i].name] = tensors[i].clone();
  }
  return parameters;
}

// Losses, gradient norms and every final parameter within 1e-5 (fp32: the packed row's attention
// and matmuls sum in another order than the padded rows'; nothing else differs). The check can
// see what it guards against: the same packed rows without positions and masking (each example
// attending to its neighbours) move the first loss by far more (models/model_tests.cpp shows it
// per example; here the first step's examples are checked to share rows).
TEST(Packing, APackedFinetuneEqualsAPaddedOneStepForStep) {
  auto world = fsdp::comm::init_world();
  const int n = world->size();
  const fs::path dir = fs::temp_directory_path() / ("fsdp_packing_test_" + std::to_string(n));
  if (world->rank() == 0) {
    fs::remove_all(dir);
    const std::string all = fsdp::testing::write_fortune_instructions(dir);
    std::ifstream in(all);
    std::ofstream train(dir / "train.jsonl"), validation(dir / "validation.jsonl");
    std::string line;
    for (int i = 0; std::getline(in, line); ++i) (i % 10 == 9 ? validation : train) << line << "\n";
    fsdp::testing::write_byte_level_gpt2_tokenizer(dir.string());
  }
  world->barrier()->wait();

  const TrainConfig config = packed_config(dir, (dir / "sharded").string());
  const Trajectory reference = padded_reference(config, dir);
  EXPECT_GE(reference.examples_per_step, 2 * kGlobalBatch)
      << "rows of " << kSeq << " tokens should hold several examples";

  const auto summary = fsdp::train::train(config, world, {false, true});
  ASSERT_EQ(summary.losses.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_NEAR(summary.losses[i], reference.losses[i], 1e-5) << "step " << i + 1;
    EXPECT_NEAR(summary.grad_norms[i], reference.grad_norms[i], 1e-5) << "step " << i + 1;
  }
  EXPECT_LT(summary.losses.back(), summary.losses.front()) << "the packed fine-tune should lower the loss";
  ASSERT_FALSE(summary.evals.empty());
  EXPECT_TRUE(std::isfinite(summary.evals.back().loss));

  const auto mine = final_parameters(config, world);
  ASSERT_EQ(mine.size(), reference.parameters.size());
  double worst = 0.0;
  for (const auto& [name, tensor] : reference.parameters) {
    ASSERT_TRUE(mine.count(name)) << name;
    worst = std::max(worst, (mine.at(name) - tensor).abs().max().item<double>());
  }
  EXPECT_LE(worst, 1e-5) << "final parameters";
  world->barrier()->wait();
  if (world->rank() == 0) fs::remove_all(dir);
}

}  // namespace packing_test
