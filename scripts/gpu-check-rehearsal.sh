#!/usr/bin/env bash
# Rehearses scripts/gpu-check.sh's plumbing on the CPU, before a device call is spent on it: the
# script's own stage, train, torch_fsdp2, staged_parity, snapshot and finish functions (read from it, not
# copied) run the staged backend's parity on CPU tensors, then a tiny
# Llama with fsdp-train (profiled), transformers' tiny Llama under FSDP2 compiled per block (gloo,
# profiled), fsdp-train again with train.fused_ops = false, then the report and the trace
# comparison. Needs build/ and .venv/ (scripts/setup.sh with scripts/requirements-peers.txt).
#   bash scripts/gpu-check-rehearsal.sh [OUT_DIR]      # about 15 s; default OUT_DIR out/gpu-check-rehearsal
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT_DIR=${1:-out/gpu-check-rehearsal}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)  # absolute: finish() writes the traces' archive from another directory
WORK=$(mktemp -d)
CHECKPOINTS="$WORK/checkpoints"
trap 'rm -rf "$WORK"' EXIT
BUILD=build STEPS=6 GPUS=1 FRACTION=0
DEADLINE=$((SECONDS + 400)); STATUS="$WORK/stages.tsv"; : > "$STATUS"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PATH="$ROOT/.venv/bin:$PATH"
# The script's functions, as written.
eval "$(sed -n '/^snapshot() {/,/^}/p' scripts/gpu-check.sh)"
eval "$(sed -n '/^finish() {/,/^}/p' scripts/gpu-check.sh)"
eval "$(sed -n '/^stage() {/,/^}/p' scripts/gpu-check.sh)"
eval "$(sed -n '/^train() {/,/^}/p' scripts/gpu-check.sh)"
eval "$(sed -n '/^torch_fsdp2() {/,/^}/p' scripts/gpu-check.sh)"
eval "$(sed -n '/^staged_parity() {/,/^}/p' scripts/gpu-check.sh)"
PORT=29533
# tiny token files of vocab 256, as the script writes them
python3 - "$WORK/data" << 'PY'
import os, struct, sys, random
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
for split, count in (("train", 1 << 16), ("validation", 1 << 12)):
    rng = random.Random(1); tokens = [rng.randrange(256) for _ in range(count)]
    with open(f"{out}/{split}-256.tok", "wb") as f:
        f.write(b"FSDPTOK\0" + struct.pack("<IIIIQ", 1, 4, 256, 0, count)); f.write(struct.pack(f"<{count}I", *tokens))
PY
# train() with train.device=cuda replaced by cpu for the rehearsal: appended --set wins
TINY=(--layers 2 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 256 --tie)
# the staged backend's parity stage with CPU tensors standing in for the GPU's
export -f staged_parity; export BUILD STAGED_DEVICE=cpu
stage staged_parity 150 bash -c staged_parity
train llama1b llama-test 256 2 64 --profile-steps 3:4 --set 'train.device="cpu"' --set 'fsdp.param_dtype="float32"'
torch_fsdp2 hf_llama1b_compiled 2 64 --model hf-llama "${TINY[@]}" --device cpu --profile-steps 3:4 --trace "$WORK/torch_hf_llama1b_compiled.trace.json"
snapshot  # as the script does after the headline pair: the report and comparison in OUT_DIR before the rest
[ -s "$OUT_DIR/trace-comparison.txt" ] && [ -s "$OUT_DIR/report.txt" ] || { echo "gpu-check-rehearsal: the snapshot left no report or comparison in $OUT_DIR"; exit 1; }
train llama1b_composed llama-test 256 2 64 --set 'train.fused_ops=false' --set 'train.device="cpu"'
finish
failed=$(awk -F'\t' '$2 != 0' "$STATUS")
[ -z "$failed" ] || { echo "gpu-check-rehearsal: FAILED stages:"; echo "$failed"; exit 1; }
[ -s "$OUT_DIR/trace-comparison.txt" ] || { echo "gpu-check-rehearsal: no trace comparison"; exit 1; }
echo "gpu-check-rehearsal: every stage passed; the report and trace comparison are in $OUT_DIR"
