// fsdp_hf_logits MODEL IDS OUT [ADAPTER]: the logits of a model loaded the way fsdp-train loads
// model.init_from (config.json, then each rank reading its slice of the safetensors), with a PEFT
// adapter the way lora.init_adapter loads it, or of a checkpoint fsdp-train saved (a LoRA run's:
// base and adapters), at whatever rank count mpirun gives, for token ids read from IDS (a
// safetensors file with "ids" [b, t] int64, and "positions" [b, t] int64 for packed rows).
// Rank 0 writes OUT with "logits" [b, t, vocab] fp32. tests/hf/check_hf_models.py compares them
// with transformers' own forward. A CLIP model reads "images" [b, c, s, s] fp32 beside the ids
// [b', t] and writes "logits" = logits_per_image [b, b'] (tests/hf/check_clip.py); a LLaVA model
// reads "images" [b, c, s, s] beside the ids [b, t] (each row with its image tokens) and writes
// "logits" [b, t, vocab] (tests/hf/check_llava.py).
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "fsdp/checkpoint/hf_weights.h"
#include "fsdp/checkpoint/peft_adapter.h"
#include "fsdp/checkpoint/safetensors.h"
#include "fsdp/checkpoint/sharded_checkpoint.h"
#include "fsdp/comm/agreement.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/train/config.h"
#include "fsdp/train/trainer.h"

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: fsdp_hf_logits MODEL_DIR IDS.safetensors OUT.safetensors [PEFT_ADAPTER_DIR]\n");
    return 2;
  }
  const std::string model_dir = argv[1], ids_path = argv[2], out_path = argv[3];
  const std::string adapter_dir = argc == 5 ? argv[4] : "";
  auto world = fsdp::comm::init_world();
  try {
    fsdp::train::TrainConfig config;
    const bool checkpoint = fsdp::checkpoint::is_checkpoint_dir(model_dir);
    fsdp::comm::on_every_rank(world, "reading the model's config", [&] {
      if (checkpoint) {
        config = fsdp::train::parse_train_config(fsdp::checkpoint::read_checkpoint_info(model_dir).config_toml,
                                                 model_dir + "/manifest.json");
      } else {
        std::string text = "[model]\ninit_from = \"" + model_dir + "\"\n";
        if (!adapter_dir.empty()) text += "[lora]\ninit_adapter = \"" + adapter_dir + "\"\n";
        config = fsdp::train::parse_train_config(text, model_dir + "/config.json");
      }
    });
    auto sharded = fsdp::train::build_sharded_model(config, fsdp::models::vocab_size(config.model), world);
    if (checkpoint) {
      fsdp::checkpoint::load_checkpoint(model_dir, *sharded.state, nullptr);
    } else {
      fsdp::checkpoint::import_weights(*sharded.state, sharded.config, model_dir);
      if (!adapter_dir.empty()) fsdp::checkpoint::import_peft_adapter(*sharded.state, sharded.config, adapter_dir);
    }
    torch::NoGradGuard no_grad;
    sharded.model.module->eval();
    fsdp::checkpoint::SafetensorsFile inputs(ids_path);
    const at::Tensor ids = inputs.read("ids").to(at::kLong);
    if (sharded.model.is_contrastive()) {
      const fsdp::models::ContrastiveOutput out = sharded.model.contrastive(inputs.read("images").to(at::kFloat), ids);
      const at::Tensor logits_per_image =
          (out.scale * out.image_embeds.matmul(out.text_embeds.t())).to(at::kFloat).contiguous();
      if (world->rank() == 0) fsdp::checkpoint::write_safetensors(out_path, {{"logits", logits_per_image}});
      world->barrier()->wait();
      return 0;
    }
    if (sharded.model.reads_image_and_text()) {
      const at::Tensor logits =
          sharded.model.image_text_logits(inputs.read("images").to(at::kFloat), ids).to(at::kFloat).contiguous();
      if (world->rank() == 0) fsdp::checkpoint::write_safetensors(out_path, {{"logits", logits}});
      world->barrier()->wait();
      return 0;
    }
    // Packed rows (data.packing): "positions" [b, t], restarting at 0 where each example starts.
    const at::Tensor positions = inputs.contains("positions") ? inputs.read("positions").to(at::kLong) : at::Tensor();
    const at::Tensor logits = sharded.model.forward(ids, positions).to(at::kFloat).contiguous();
    if (world->rank() == 0) fsdp::checkpoint::write_safetensors(out_path, {{"logits", logits}});
    world->barrier()->wait();
    return 0;
  } catch (const fsdp::comm::AgreedStop& e) {
    if (e.should_report()) std::fprintf(stderr, "fsdp_hf_logits: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fsdp_hf_logits: error: %s\n", e.what());
    if (world->size() > 1) world->abort(e.what());
    return 1;
  }
}
