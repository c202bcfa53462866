#!/usr/bin/env bash
# Bad input to fsdp-train (2 ranks), fsdp-data and fsdp-plan: each case must exit non-zero, print
# the expected message exactly once, and leave no output directory behind.
# Usage: bad_input.sh FSDP_TRAIN FSDP_DATA MPIRUN FSDP_PLAN
set -uo pipefail
train=$1 data=$2 mpirun=$3 plan=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

# expect_failure NAME EXPECTED_TEXT COMMAND...
expect_failure() {
  local name=$1 expected=$2
  shift 2
  local output status count
  output=$(timeout 120 "$@" 2>&1)
  status=$?
  count=$(grep -cF -- "$expected" <<<"$output")
  if [ "$status" -eq 0 ] || [ "$status" -eq 124 ] || [ "$count" -ne 1 ] || [ -e "$work/out" ]; then
    echo "FAIL $name: exit $status, '$expected' printed $count times, output dir exists: $([ -e "$work/out" ] && echo yes || echo no)"
    echo "$output" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok   $name: $(grep -F -- "$expected" <<<"$output" | head -1)"
  fi
  rm -rf "$work/out"
}

config() {  # config NAME BODY: a config writing to $work/out
  printf 'name = "bad"\noutput_dir = "%s/out"\n%s\n' "$work" "$2" >"$work/$1.toml"
  echo "$work/$1.toml"
}

ranks=("$mpirun" --oversubscribe --bind-to none -np 2)
good_model=$'[model]\nname = "gpt-test"\n[train]\nsteps = 2\nglobal_batch = 4\nseq_len = 16'

expect_failure unknown-key "unknown key 'train.stepz'" \
  "${ranks[@]}" "$train" "$(config unknown-key $'[model]\nname = "gpt-test"\n[train]\nstepz = 3')"
expect_failure wrong-type "train.steps must be an integer, got a string" \
  "${ranks[@]}" "$train" "$(config wrong-type $'[model]\nname = "gpt-test"\n[train]\nsteps = "ten"')"
expect_failure unknown-model "unknown model 'gpt-9'" \
  "${ranks[@]}" "$train" "$(config unknown-model $'[model]\nname = "gpt-9"')"
expect_failure batch-not-divisible "train.global_batch 5 is not divisible by ranks x micro-batches (2 x 1)" \
  "${ranks[@]}" "$train" "$(config batch $'[model]\nname = "gpt-test"\n[train]\nglobal_batch = 5')"
expect_failure missing-data "directory '/nonexistent/fortunes' not found" \
  "${ranks[@]}" "$train" "$(config missing-data "$good_model"$'\n[data]\ndir = "/nonexistent/fortunes"')"
expect_failure missing-token-file "token file '/nonexistent/train.tok': cannot open" \
  "${ranks[@]}" "$train" "$(config missing-tokens "$good_model"$'\n[data]\nsource = "token_files"\ntrain_tokens = "/nonexistent/train.tok"\nvalidation_tokens = "/nonexistent/v.tok"')"
# Sharded corpora (fsdp-data corpus): a glob that matches nothing, an empty shard, shards of two
# tokenizers; each named.
token_file() {  # token_file PATH VOCAB COUNT: a token file as fsdp-data writes it (token_file.h)
  python3 -c 'import struct, sys
path, vocab, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
size = 2 if vocab <= 65536 else 4
with open(path, "wb") as f:
    f.write(b"FSDPTOK\0" + struct.pack("<IIIIQ", 1, size, vocab, 0, count) + bytes(size * count))' "$@"
}
mkdir -p "$work/shards-empty" "$work/shards-mixed"
token_file "$work/shards-empty/shard-00000.tok" 256 1000
token_file "$work/shards-empty/shard-00001.tok" 256 0
token_file "$work/shards-mixed/shard-00000.tok" 256 1000
token_file "$work/shards-mixed/shard-00001.tok" 50257 1000
shards_config() {  # shards_config NAME TRAIN_SPEC
  config "$1" "$good_model"$'\n[data]\nsource = "token_files"\ntrain_tokens = "'"$2"$'"\nvalidation_tokens = "'"$work/shards-empty/shard-00000.tok"'"'
}
expect_failure shards-glob-matches-nothing "token shards: '$work/none/shard-*.tok' matches no file" \
  "${ranks[@]}" "$train" "$(shards_config glob "$work/none/shard-*.tok")"
expect_failure shards-empty-shard "token shard '$work/shards-empty/shard-00001.tok' holds no tokens" \
  "${ranks[@]}" "$train" "$(shards_config empty "$work/shards-empty")"
expect_failure shards-two-tokenizers "'$work/shards-mixed/shard-00001.tok' vocabulary 50257 in 2-byte tokens (a corpus is one tokenizer's)" \
  "${ranks[@]}" "$train" "$(shards_config mixed "$work/shards-mixed")"
printf '{"text": "fine"}\n{"text": 7}\n' >"$work/corpus.jsonl"
expect_failure data-corpus-bad-line "corpus.jsonl:2: expected a JSON line {\"text\": ...}" \
  "$data" corpus --output-dir "$work/out" --threads 2 "$work/corpus.jsonl"
expect_failure bad-override "train.steps must be an integer, got a number" \
  "${ranks[@]}" "$train" "$(config override "$good_model")" --set train.steps=2.5
expect_failure fp16-with-bf16-reduction "fsdp.reduce_dtype 'bfloat16' with fsdp.param_dtype 'float16'" \
  "${ranks[@]}" "$train" "$(config fp16-bf16 "$good_model")" --set 'fsdp.param_dtype="float16"' --set 'fsdp.reduce_dtype="bfloat16"'
expect_failure fp16-reduction-without-fp16 "fsdp.reduce_dtype 'float16' needs fsdp.param_dtype 'float16'" \
  "${ranks[@]}" "$train" "$(config fp16-reduce "$good_model")" --set 'fsdp.reduce_dtype="float16"'
expect_failure cuda-on-cpu-build "train.device 'cuda' needs a CUDA build of fsdp.cpp" \
  "${ranks[@]}" "$train" "$(config cuda "$good_model")" --set 'train.device="cuda"'
expect_failure missing-config "config file '$work/none.toml' cannot be read" \
  "${ranks[@]}" "$train" "$work/none.toml"
expect_failure data-missing-input "input '$work/none.txt' is neither a file nor a directory" \
  "$data" encode --output "$work/out" "$work/none.txt"
printf 'not a token file at all, not even close.......' >"$work/junk.tok"
expect_failure data-bad-token-file "bad magic" "$data" inspect "$work/junk.tok"
# fsdp-data tokenize: a bad line is named by file and line, and no output (nor its .partial) is left.
printf '{"text": "fine"}\n{"txt": 1}\n' >"$work/lines.jsonl"
expect_failure data-tokenize-bad-line "lines.jsonl:2: expected {\"text\": ...}" \
  "$data" tokenize --input "$work/lines.jsonl" --output "$work/out"
if [ -e "$work/out.partial" ]; then
  echo "FAIL data-tokenize-bad-line: $work/out.partial was left behind"
  failures=$((failures + 1))
fi
expect_failure data-tokenize-hf-needs-file "tokenizer 'hf' needs a tokenizer.json path" \
  "$data" tokenize --tokenizer hf --input "$work/lines.jsonl" --output "$work/out"
# Instruction data and Hugging Face directories (issue 19).
llama_model=$'[model]\nname = "llama-test"\n[train]\nsteps = 2\nglobal_batch = 4\nseq_len = 64'
printf '{"prompt": "a", "completion": "b"}\n{"messages": [{"role": "user", "content": "x"}\n' >"$work/broken.jsonl"
expect_failure instructions-malformed-line "broken.jsonl:2: not valid JSON" \
  "${ranks[@]}" "$train" "$(config broken "$llama_model"$'\n[data]\nsource = "instructions"\ntrain_jsonl = "'"$work/broken.jsonl"'"')"
printf '{"messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]}\n' >"$work/role.jsonl"
expect_failure instructions-unknown-role "role.jsonl:1: message 2 has unknown role 'robot' (expected system, user or assistant)" \
  "${ranks[@]}" "$train" "$(config role "$llama_model"$'\n[data]\nsource = "instructions"\ntrain_jsonl = "'"$work/role.jsonl"'"')"
expect_failure instructions-llama3-needs-tokens "chat format llama3 needs a tokenizer with <|start_header_id|>" \
  "${ranks[@]}" "$train" "$(config fmt "$llama_model"$'\n[data]\nsource = "instructions"\nchat_format = "llama3"\ntrain_jsonl = "'"$work/role.jsonl"'"')"
# Packing (issue 36): an answer needs an end token; a window shorter than every example; document
# masking needs an end-of-text token; each key only where it applies.
printf '{"prompt": "a question of some length", "completion": "an answer"}\n' >"$work/one.jsonl"
expect_failure packing-needs-end-of-turn "data.packing needs a token that ends each answer" \
  "${ranks[@]}" "$train" "$(config pack-byte "$llama_model"$'\n[data]\nsource = "instructions"\npacking = true\ntrain_jsonl = "'"$work/one.jsonl"'"')"
mkdir -p "$work/bytes-eot"
python3 -c '
import json, sys
printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
symbols, extra = {}, 0
for b in range(256):
    symbols[b] = chr(b) if b in printable else chr(256 + extra)
    extra += b not in printable
vocab = {symbols[b]: b for b in range(256)}
vocab["<|endoftext|>"] = 256
json.dump(vocab, open(sys.argv[1] + "/vocab.json", "w"))
open(sys.argv[1] + "/merges.txt", "w").write("#version: 0.2\n")' "$work/bytes-eot"
bytes_eot=$'\ntokenizer = "gpt2"\nvocab_json = "'"$work/bytes-eot/vocab.json"$'"\nmerges_txt = "'"$work/bytes-eot/merges.txt"'"'
expect_failure packing-window-shorter-than-every-example "train.seq_len 8 is shorter than every example (the shortest renders to 35 tokens" \
  "${ranks[@]}" "$train" "$(config pack-short "$llama_model"$'\n[data]\nsource = "instructions"\npacking = true\ntrain_jsonl = "'"$work/one.jsonl"'"'"$bytes_eot")" \
  --set train.seq_len=8
expect_failure document-masking-needs-end-of-text "data.document_masking splits windows at the end-of-text token, and the byte tokenizer's" \
  "${ranks[@]}" "$train" "$(config doc-mask "$good_model"$'\n[data]\ndocument_masking = true')"
expect_failure packing-only-for-instructions "data.packing packs instruction examples (data.source 'instructions'); data.source is 'fortunes'" \
  "${ranks[@]}" "$train" "$(config pack-fortunes "$good_model"$'\n[data]\npacking = true')"
mkdir -p "$work/mamba" "$work/yarn" "$work/holes"
printf '{"model_type": "mamba", "vocab_size": 32000}\n' >"$work/mamba/config.json"
expect_failure hf-unsupported-family "model_type 'mamba' is not supported (supported: gpt2, llama, " \
  "${ranks[@]}" "$train" "$(config mamba $'[model]\ninit_from = "'"$work/mamba"'"')"
printf '{"model_type": "llama", "vocab_size": 256, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}\n' >"$work/yarn/config.json"
expect_failure hf-unsupported-rope "rope_scaling.rope_type 'yarn' is not supported (supported: default, llama3)" \
  "${ranks[@]}" "$train" "$(config yarn $'[model]\ninit_from = "'"$work/yarn"'"')"
# A weight set missing a tensor: the index names the file, the file lacks the tensor.
sed 's/"yarn", "factor": 4.0/"default"/' "$work/yarn/config.json" >"$work/holes/config.json"
printf '{"metadata": {}, "weight_map": {}}\n' >"$work/holes/model.safetensors.index.json"
expect_failure hf-missing-tensor "have no tensor 'model.embed_tokens.weight'" \
  "${ranks[@]}" "$train" "$(config holes $'[model]\ninit_from = "'"$work/holes"$'"\n[train]\nsteps = 2\nglobal_batch = 4\nseq_len = 16')"
expect_failure data-instructions-no-fortunes "directory '/nonexistent' not found" \
  "$data" instructions --dir /nonexistent --output "$work/out"
expect_failure plan-unknown-model "unknown model 'llama-99b'" "$plan" --model llama-99b --ranks 8
expect_failure plan-group-size "12 ranks are not divisible by the shard group size 8" \
  "$plan" --model llama3-8b --ranks 12 --strategy hybrid_shard --shard-group-size 8
expect_failure plan-memory-unit "memory '80': give a unit" "$plan" --model llama3-8b --ranks 8 --memory 80
expect_failure plan-memory-bad-unit "unknown unit 'G'" "$plan" --model llama3-8b --ranks 8 --memory 80G
expect_failure nf4-without-layers-to-adapt "[lora] applies to the gpt, llama, " \
  "${ranks[@]}" "$train" "$(config nf4-vit $'[model]\nname = "vit-test"\n[lora]\nbase_dtype = "nf4"')"
expect_failure plan-lora-base-dtype "lora base dtype 'int4' (expected bfloat16, float32 or nf4)" \
  "$plan" --model llama3-8b --ranks 8 --lora-rank 16 --lora-base-dtype int4
expect_failure plan-no-model "give --model NAME or a config file" "$plan" --ranks 8
# CLIP: images of another size than the model's, micro-batches (the loss is over the global batch),
# and fsdp-plan with a tower as one unit (it models block units).
clip_model=$'[model]\nname = "clip-test"\n[data]\nsource = "fashion_mnist"\n[train]\nsteps = 2\nglobal_batch = 8'
expect_failure clip-image-size "gives images of 1 x 28 x 28 (channels x height x width); the clip model 'clip-test' takes 1 x 35 x 35" \
  "${ranks[@]}" "$train" "$(config clip-size "$clip_model")" --set model.image_size=35
expect_failure clip-micro-batches "train.micro_batches 2 with the clip model 'clip-test'" \
  "${ranks[@]}" "$train" "$(config clip-micro "$clip_model")" --set train.micro_batches=2
expect_failure plan-clip-tower "fsdp.wrap = \"tower\" (each image or text tower one unit) is not modelled" \
  "$plan" "$(config clip-tower "$clip_model"$'\n[fsdp]\nwrap = "tower"')" --ranks 2
# LLaVA: a tower block it has not to read, a context too short for its chats, the image token
# outside the vocabulary. (fsdp-plan models LLaVA since 2026-12-06; what it refuses is LoRA on CLIP.)
llava_model=$'[model]\nname = "llava-test"\n[data]\nsource = "fashion_mnist"\n[train]\nsteps = 2\nglobal_batch = 8'
expect_failure llava-feature-layer "vision_feature_layer 5 is outside the image tower's 3 hidden states" \
  "${ranks[@]}" "$train" "$(config llava-layer "$llava_model")" --set model.vision_feature_layer=5
expect_failure llava-context "the chats are 78 tokens (16 image tokens, the question and the longest answer); model.context is 64" \
  "${ranks[@]}" "$train" "$(config llava-context "$llava_model")" --set model.context=64
expect_failure llava-image-token "image_token 300 is outside the language model's vocabulary [0, 258)" \
  "${ranks[@]}" "$train" "$(config llava-token "$llava_model")" --set model.image_token=300
expect_failure plan-clip-lora "fsdp-plan does not model LoRA on a clip model yet" \
  "$plan" "$(config clip-lora "$clip_model"$'\n[lora]\nrank = 4\ntargets = "q_proj v_proj fc1"')" --ranks 2

if [ "$failures" -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all bad-input cases behaved"
