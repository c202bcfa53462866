#!/usr/bin/env bash
# fsdp-train end to end under every sharding strategy a user may pick, each against a one-rank run
# of the same config: full_shard, shard_grad_op and no_shard at N = 2, hybrid_shard at 2 x 2
# (N = 4) and 4 x 4 (N = 16, oversubscribed). Every step's loss and gradient norm must equal the
# one-rank run's within 1e-5 (fp32; the ranks sum in another order, as in tests/dist/parity_test.cpp),
# and every run must finish all its steps. Hybrid sharding issues its replica all-reduces when a
# reduce-scatter completes, so this also catches a divergence check that mistakes a legal
# interleaving of two communicators for ranks running different code (it stopped every hybrid run
# at step 1 before 2026-12-02).
# Usage: strategies.sh FSDP_TRAIN MPIRUN [LARGEST_N]   (LARGEST_N: 16 by default; 4 leaves out 4 x 4)
set -uo pipefail
train=$1 mpirun=$2 largest=${3:-16}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [ -n "${log:-}" ] && [ -f "$log" ] && sed 's/^/    /' "$log" | tail -30; exit 1; }

steps=6
cat >"$work/base.toml" <<TOML
name = "strategies"
[model]
name = "gpt-test"
[data]
source = "fortunes"
[train]
steps = $steps
global_batch = 32
seq_len = 32
threads = 1
log_every = 1
[optimizer]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 2
[eval]
every = 0
batches = 1
sample_tokens = 0
TOML

# run NAME RANKS [--set ...]: fsdp-train under mpirun; metrics in $work/NAME/metrics.jsonl.
run() {
  local name=$1 ranks=$2
  shift 2
  log="$work/$name.log"
  local start=$SECONDS
  if ! timeout 300 "$mpirun" --oversubscribe --bind-to none -np "$ranks" "$train" "$work/base.toml" \
      --set "output_dir=\"$work/$name\"" "$@" --progress lines >"$log" 2>&1; then
    fail "$name at N = $ranks did not finish"
  fi
  echo "ran  $name at N = $ranks in $((SECONDS - start)) s"
}

# compare NAME: every step's loss and gradient norm against the one-rank run's.
compare() {
  python3 - "$work/alone/metrics.jsonl" "$work/$1/metrics.jsonl" "$1" "$steps" <<'PY' || fail "$1 differs from the one-rank run"
import json, sys
def steps(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "step" in r and "loss" in r:
            out[r["step"]] = (r["loss"], r["grad_norm"])
    return out
reference, run, name, expected = steps(sys.argv[1]), steps(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if sorted(run) != sorted(reference) or len(run) != expected:
    sys.exit(f"{name}: steps {sorted(run)}, the one-rank run has {sorted(reference)} (expected {expected})")
worst = 0.0
for step, (loss, norm) in sorted(reference.items()):
    got_loss, got_norm = run[step]
    worst = max(worst, abs(got_loss - loss), abs(got_norm - norm))
    if abs(got_loss - loss) > 1e-5 or abs(got_norm - norm) > 1e-5:
        sys.exit(f"{name}: step {step}: loss {got_loss!r}, grad norm {got_norm!r}; one rank: {loss!r}, {norm!r} (tolerance 1e-5)")
print(f"ok   {name}: {len(run)} steps, losses and gradient norms within {worst:.1e} of one rank (tolerance 1e-5)")
PY
}

run alone 1
run full_shard 2 --set 'fsdp.strategy="full_shard"'
compare full_shard
run shard_grad_op 2 --set 'fsdp.strategy="shard_grad_op"'
compare shard_grad_op
run no_shard 2 --set 'fsdp.strategy="no_shard"'
compare no_shard
run hybrid_2x2 4 --set 'fsdp.strategy="hybrid_shard"' --set fsdp.shard_group_size=2
grep -q "hybrid_shard (2 replicas x 2 shards)" "$log" || fail "hybrid_2x2: the header does not say 2 replicas x 2 shards"
compare hybrid_2x2
if [ "$largest" -ge 16 ]; then
  run hybrid_4x4 16 --set 'fsdp.strategy="hybrid_shard"' --set fsdp.shard_group_size=4
  grep -q "hybrid_shard (4 replicas x 4 shards)" "$log" || fail "hybrid_4x4: the header does not say 4 replicas x 4 shards"
  compare hybrid_4x4
fi
