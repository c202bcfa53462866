#include "evaluation.h"
#include "fsdp/shard/host_heap.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "fsdp/train/contrastive_loss.h"
#include "loss.h"

namespace fsdp::train {

int64_t evaluation_items(const TrainConfig& config, int64_t available, bool language) {
  int64_t count = language ? std::min(available, config.eval.batches * config.global_batch) : available;
  if (!language && config.eval.max_items > 0) count = std::min(count, config.eval.max_items);
  return count;
}

namespace {

struct ChatScores {
  double totals[4] = {0.0, 0.0, 0.0, 0.0};  // as run_evaluation's
};

// An image-text model on one chunk of test images (weights: 1 real, 0 padding): the answers' token loss, teacher
// forced, and each image's answer generated greedily (no sampling), right when it spells the
// label's answer exactly (chosen among bytes and end-of-text). Every rank runs the same forwards: generation stops when
// every rank's rows have ended their answers (one all-reduce of a count per token), or at the longest answer.
ChatScores score_answers(const ModelInUse& m, const data::Batch& batch, const std::vector<float>& weights) {
  ChatScores scores;
  const int64_t rows = batch.targets.numel();
  const at::Tensor images = batch.inputs.to(m.device);
  const at::Tensor real = at::tensor(weights).gt(0);  // [rows] bool
  const data::ImageChatWriter::Rows chats = m.chat->examples(batch.targets);
  const at::Tensor targets = at::where(real.view({rows, 1}), chats.targets, at::full_like(chats.targets, -100));
  scores.totals[0] =
      m.model.image_text_loss(images, chats.ids.to(m.device), targets.to(m.device), chats.ids.numel()).item<double>();
  scores.totals[2] = targets.ne(-100).sum().item<double>();

  // Every forward runs over the whole chat, [rows, prompt + longest answer], the answer's places
  // filled as they are generated (end-of-text until then): the causal mask keeps a position's
  // logits from seeing the places after it, and one shape for every token keeps libtorch's
  // shape-keyed caches (oneDNN's primitives) from growing with each length: a context grown a
  // token at a time left 70 MiB of them live after LLaVA's evaluation of 128 images (2026-12-06).
  const int64_t prompt = m.chat->prompt_length(), longest = m.chat->longest_answer_tokens();
  const int64_t end_of_text = m.chat->end_of_text();
  at::Tensor ids = at::full({rows, prompt + longest}, end_of_text, at::TensorOptions().dtype(at::kLong));
  ids.narrow(1, 0, prompt).copy_(m.chat->prompts(rows));
  ids = ids.to(m.device);
  at::Tensor ended = at::logical_not(real).to(m.device);  // padding rows count as ended
  int64_t answered = 0;                                   // answer tokens generated
  while (answered < longest) {
    // The chats' own vocabulary only, bytes and end-of-text: never the image token, which would
    // ask for a second image.
    const at::Tensor last = m.model.image_text_logits(images, ids).select(1, prompt + answered - 1);  // [rows, vocab]
    const at::Tensor choice = at::cat({last.narrow(1, 0, 256), last.narrow(1, end_of_text, 1)}, 1).argmax(-1);
    const at::Tensor next = at::where(choice.eq(256), at::full_like(choice, end_of_text), choice);  // [rows]
    ids.select(1, prompt + answered).copy_(next);
    ++answered;
    ended = ended.logical_or(next.eq(end_of_text));
    at::Tensor open = at::logical_not(ended).sum().to(at::kCPU, at::kDouble).reshape({1});
    if (m.world->size() > 1) m.world->all_reduce(open, comm::ReduceOp::Sum)->wait();
    if (open.item<double>() == 0.0) break;
  }
  const at::Tensor generated = ids.narrow(1, prompt, answered).cpu().contiguous();
  const at::Tensor labels = batch.targets.to(at::kCPU, at::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    if (weights[static_cast<size_t>(r)] <= 0.0f) continue;
    const int64_t* row = generated[r].data_ptr<int64_t>();
    const std::vector<int64_t> answer(row, row + generated.size(1));
    scores.totals[1] += m.chat->class_of(answer) == labels[r].item<int64_t>() ? 1.0 : 0.0;
    scores.totals[3] += 1.0;
  }
  return scores;
}

}  // namespace

EvalResult run_evaluation(const ModelInUse& m, const data::Dataset& validation, int64_t step) {
  torch::NoGradGuard no_grad;
  m.model.module->eval();
  const int rank = m.world->rank(), n = m.world->size();
  const int64_t available = validation.size();
  const int64_t count = evaluation_items(m.config, available, m.language);
  const int64_t chunk = std::max<int64_t>(1, m.config.global_batch / n / m.config.micro_batches);
  std::vector<int64_t> mine;  // evenly spaced over the validation set, dealt round-robin
  for (int64_t i = rank; i < count; i += n) mine.push_back(i * available / count);
  const int64_t per_rank = (count + n - 1) / n;
  const int64_t chunks = (per_rank + chunk - 1) / chunk;
  double totals[4] = {0.0, 0.0, 0.0, 0.0};  // loss sum, correct, the loss's weight, the accuracy's weight
  // Chunk after chunk, glibc strands freed blocks between longer-lived ones and the heap grows with
  // the live bytes flat; 8 MiB of growth, then a trim (a ViT's evaluation of 10,000 images: +90 MiB
  // resident without it, +8 MiB with, for about 10 trims; shard::HeapGrowthGuard).
  shard::HeapGrowthGuard heap_growth(8LL << 20);
  for (int64_t k = 0; k < chunks; ++k) {
    std::vector<int64_t> part;
    std::vector<float> weights;
    for (int64_t j = k * chunk; j < (k + 1) * chunk && j < per_rank; ++j) {
      const bool real = j < static_cast<int64_t>(mine.size());
      part.push_back(real ? mine[j] : 0);
      weights.push_back(real ? 1.0f : 0.0f);
    }
    if (m.device.is_cpu()) heap_growth.check();
    data::Batch batch = validation.get(part);
    // Losses are reduced on the model's device: only three numbers per chunk reach the host,
    // not the [b, seq, vocab] logits.
    at::Tensor targets = batch.targets.to(m.device);
    at::Tensor w = at::tensor(weights).to(m.device);
    const at::Tensor positions =
        batch.positions.defined() ? batch.positions.to(m.device) : at::Tensor();  // packed rows
    if (m.chat != nullptr) {
      const ChatScores scores = score_answers(m, batch, weights);
      for (int i = 0; i < 4; ++i) totals[i] += scores.totals[i];
      continue;
    }
    if (m.language && m.model.has_loss_sum() && m.config.loss_chunk_tokens > 0) {
      // The chunked head: padding rows' targets set to -100, so they count nothing.
      const int64_t rows = static_cast<int64_t>(part.size());
      const at::Tensor kept = w.gt(0).view({rows, 1}).expand_as(targets.view({rows, -1})).reshape(targets.sizes());
      targets = at::where(kept, targets, at::full_like(targets, -100));
      totals[0] +=
          m.model.loss_sum(batch.inputs.to(m.device), targets, m.config.loss_chunk_tokens, positions).item<double>();
      totals[2] += targets.ne(-100).sum().item<double>();
      continue;
    }
    at::Tensor logits =
        m.model.is_contrastive()
            ? zero_shot_logits(m.model.contrastive(batch.inputs.to(m.device), m.class_prompts.to(m.device)))
            : m.model.forward(batch.inputs.to(m.device), positions);
    at::Tensor losses = loss_of(logits, targets, torch::kNone);  // [b * seq] or [b]
    if (m.language) {
      // Token-weighted: the mean over every counted target (not -100) of the evaluated samples.
      const int64_t rows = static_cast<int64_t>(part.size());
      losses = losses.view({rows, -1});
      at::Tensor counted = targets.ne(-100).view({rows, -1}).to(at::kFloat).sum(1);
      totals[0] += (losses.sum(1) * w).sum().item<double>();
      totals[2] += (counted * w).sum().item<double>();
    } else {
      totals[0] += (losses * w).sum().item<double>();
      totals[1] += (logits.argmax(1).eq(targets).to(at::kFloat) * w).sum().item<double>();
      totals[2] += std::accumulate(weights.begin(), weights.end(), 0.0);  // padding samples weigh 0
    }
  }
  if (m.chat == nullptr) totals[3] = totals[2];
  m.model.module->train();
  at::Tensor sums = at::tensor({totals[0], totals[1], totals[2], totals[3]}, at::kDouble);
  if (n > 1) m.world->all_reduce(sums, comm::ReduceOp::Sum)->wait();
  EvalResult result;
  result.step = step;
  result.loss = sums[0].item<double>() / sums[2].item<double>();
  if (m.language) {
    result.perplexity = std::exp(result.loss);
  } else {
    result.accuracy = sums[1].item<double>() / sums[3].item<double>();
  }
  return result;
}

std::string evaluation_line(const EvalResult& result, int64_t items, bool language, AccuracyKind kind) {
  char line[160];
  if (language) {
    std::snprintf(line, sizeof(line), "eval  step %lld | validation loss %.4f | perplexity %.2f | %lld windows",
                  static_cast<long long>(result.step), result.loss, result.perplexity, static_cast<long long>(items));
  } else {
    std::snprintf(line, sizeof(line), "eval  step %lld | test loss %.4f | %s accuracy %.2f%% | %lld images",
                  static_cast<long long>(result.step), result.loss,
                  kind == AccuracyKind::ZeroShot  ? "zero-shot"
                  : kind == AccuracyKind::Answers ? "answer"
                                                  : "test",
                  100.0 * result.accuracy, static_cast<long long>(items));
  }
  return line;
}

nlohmann::json evaluation_record(const EvalResult& result, bool language, AccuracyKind kind) {
  nlohmann::json record = {{"eval_step", result.step}, {"validation_loss", result.loss}};
  if (kind == AccuracyKind::ZeroShot) record["zero_shot"] = true;
  if (kind == AccuracyKind::Answers) record["generated_answers"] = true;
  if (language) record["perplexity"] = result.perplexity;
  if (!language) record["test_accuracy"] = result.accuracy;
  return record;
}

std::string generate_sample(const ModelInUse& m, const data::Tokenizer& tokenizer, const data::ChatFormat* chat) {
  torch::NoGradGuard no_grad;
  m.model.module->eval();
  const auto& e = m.config.eval;
  const bool leader = m.world->rank() == 0;
  std::vector<int32_t> prompt;
  int32_t stop = -1;
  std::string shown_prompt = e.prompt;
  if (chat != nullptr) {
    // A user turn in the chat format the model was fine-tuned on; the answer ends with its turn.
    const std::string request = e.prompt.empty() ? "Tell me a fortune." : e.prompt;
    prompt = data::render_prompt({{"user", request}}, *chat, tokenizer);
    stop = data::end_of_turn(*chat, tokenizer);
    shown_prompt = "user: " + request + "\nassistant: ";
  } else {
    prompt = tokenizer.encode(e.prompt);
    if (prompt.empty()) {
      // Start where a document would: after the end-of-document marker.
      const int32_t end = tokenizer.end_of_text();
      prompt = end >= 0 ? std::vector<int32_t>{end} : tokenizer.encode("%\n");
    }
  }
  std::vector<int64_t> context(prompt.begin(), prompt.end());
  std::vector<int32_t> generated;
  auto generator = at::detail::createCPUGenerator(m.config.seed + 1);
  for (int64_t i = 0; i < e.sample_tokens; ++i) {
    const int64_t t = std::min<int64_t>(static_cast<int64_t>(context.size()), m.config.seq_len);
    at::Tensor ids = at::tensor(std::vector<int64_t>(context.end() - t, context.end()), at::kLong).unsqueeze(0);
    at::Tensor logits =
        m.model.forward(ids.to(m.device)).select(1, t - 1).squeeze(0).to(at::kFloat).cpu() / e.temperature;  // [vocab]
    at::Tensor next = at::zeros({1}, at::kLong);
    if (leader) {
      const int64_t k = std::min<int64_t>(e.top_k, logits.size(0));
      auto top = logits.topk(k);
      at::Tensor probabilities = at::softmax(std::get<0>(top), 0);
      at::Tensor choice = at::multinomial(probabilities, 1, false, generator);
      next[0] = std::get<1>(top)[choice.item<int64_t>()].item<int64_t>();
    }
    if (m.world->size() > 1) m.world->broadcast(next, 0)->wait();
    const int64_t token = next.item<int64_t>();
    if (token == stop) break;  // the same on every rank (broadcast)
    context.push_back(token);
    generated.push_back(static_cast<int32_t>(token));
  }
  m.model.module->train();
  return shown_prompt + tokenizer.decode(generated);
}

}  // namespace fsdp::train
