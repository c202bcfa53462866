#!/usr/bin/env bash
# The mission's questions answered by fsdp-plan (docs/benchmarks.md records the output):
#  1. fine-tuning Llama 3 70B on one node of 8 GPUs with 80 GB: which combinations of strategy,
#     precision, activation checkpointing and CPU offload fit (micro-batch 1 x 4096 tokens);
#  2. pretraining Llama 3 8B on 64 GPUs (8 nodes x 8): full_shard against hybrid_shard inside a
#     node, memory and step time (micro-batch 2 x 8192 tokens).
# Assumptions stated in the tables: GPUs run fused attention (libtorch 2.x SDPA: no [heads, t, t]
# probabilities kept); 2 GiB per rank for the CUDA context and NCCL; 400 TFLOP/s of
# bf16 per GPU (about 40% of an H100's dense peak); 150 GB/s per GPU inside a node (NVLink), 50 GB/s
# across nodes (400 Gb/s InfiniBand per GPU). Change them with the flags below.
#   bash bench/plan_tables.sh
set -euo pipefail
root_dir=$(cd "$(dirname "$0")/.." && pwd)
plan="$root_dir/build/apps/fsdp-plan"
[ -x "$plan" ] || { echo "plan_tables.sh: build first (bash scripts/setup.sh)" >&2; exit 1; }

echo "== Llama 3 70B, 8 x 80 GB, micro-batch 1 x 4096 tokens, AdamW, 2 GiB overhead per GPU"
for strategy in full_shard shard_grad_op; do
  for dtype in float32 bfloat16; do
    for ac in "" --activation-checkpointing; do
      for offload in "" --cpu-offload; do
        "$plan" --model llama3-70b --ranks 8 --ranks-per-node 8 --memory 80GB --overhead 2GiB --seq 4096 \
          --strategy "$strategy" --param-dtype "$dtype" $ac $offload --compact
      done
    done
  done
done
echo
echo "== Llama 3 70B, 8 x 80 GB, bf16, checkpointing, CPU offload: the full plan"
"$plan" --model llama3-70b --ranks 8 --ranks-per-node 8 --memory 80GB --overhead 2GiB --seq 4096 \
  --param-dtype bfloat16 --activation-checkpointing --cpu-offload --tflops 400 --bandwidth 150
echo
echo "== Llama 3 8B, 64 GPUs (8 per node) of 80 GB, micro-batch 2 x 8192 tokens, bf16 (no_shard: fp32)"
for strategy in full_shard hybrid_shard no_shard; do
  dtype=bfloat16
  [ "$strategy" != no_shard ] || dtype=float32  # replicated parameters stay fp32 (as the runtime does)
  for ac in "" --activation-checkpointing; do
    "$plan" --model llama3-8b --ranks 64 --ranks-per-node 8 --memory 80GB --overhead 2GiB --seq 8192 \
      --micro-batch 2 --strategy "$strategy" --param-dtype "$dtype" $ac --compact
  done
done
echo
for strategy in full_shard hybrid_shard; do
  echo "== Llama 3 8B, 64 GPUs, bf16, checkpointing, $strategy: step time at 400 TFLOP/s, 150 GB/s in a node, 50 across"
  "$plan" --model llama3-8b --ranks 64 --ranks-per-node 8 --memory 80GB --overhead 2GiB --seq 8192 \
    --micro-batch 2 --strategy "$strategy" --param-dtype bfloat16 --activation-checkpointing \
    --tflops 400 --bandwidth 150 --inter-node-bandwidth 50
done
