#!/usr/bin/env bash
# The chunked head and loss (models/linear_cross_entropy.h) of two builds side by side, where the
# head weighs: a Llama with Llama 3's vocabulary (128,256, untied; 4 layers, width 512, 8 heads over
# 2 key/value heads, SwiGLU 1536: 143 M parameters, 131 M of them embedding and head; the model of
# bench/chunked_loss_memory.sh), 2 ranks, 12 steps of 2 x 256 tokens per rank, chunks of 256 tokens,
# in fp32 and in bf16 compute. Through bench/ab_builds.sh (interleaved runs, median step after the
# first 5); each table's JSON is copied to out/bench/head_loss_ab-{fp32,bf16}.json.
#   bash bench/head_loss_ab.sh BEFORE_FSDP_TRAIN AFTER_FSDP_TRAIN [ROUNDS=2] [DTYPES="fp32 bf16"]
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n 2,8p "$0" >&2
  exit 2
fi
before=$1 after=$2 rounds=${3:-2} dtypes=${4:-"fp32 bf16"}
root_dir=$(cd "$(dirname "$0")/.." && pwd)
cd "$root_dir"
mkdir -p out/bench
config=$(mktemp --suffix=.toml)
trap 'rm -f "$config"' EXIT
cat > "$config" <<'TOML'
name = "head-loss-ab"
[model]
name = "llama-small"
vocab = 128256
dim = 512
layers = 4
heads = 8
kv_heads = 2
ffn_hidden = 1536
context = 512
[data]
source = "fortunes"
[train]
steps = 12
global_batch = 4
seq_len = 256
threads = 1
loss_chunk_tokens = 256
[eval]
batches = 1
[optimizer]
warmup_steps = 0
TOML
for dtype in $dtypes; do
  case $dtype in
    fp32) set_dtype='fsdp.param_dtype="float32"' ;;
    bf16) set_dtype='fsdp.param_dtype="bfloat16"' ;;
    *) echo "head_loss_ab: dtype '$dtype' is not fp32 or bf16" >&2; exit 2 ;;
  esac
  echo "== $dtype"
  bash bench/ab_builds.sh "$before" "$after" 2 "$rounds" "$config" --set "$set_dtype"
  cp out/bench/ab_builds.json "out/bench/head_loss_ab-$dtype.json"
done
