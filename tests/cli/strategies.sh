#!/usr/bin/env bash
# fsdp-train end to end under every sharding strategy a user may pick, each against a one-rank run
# of the same config: full_shard, shard_grad_op and no_shard at N = 2, hybrid_shard at 2 x 2
# (N = 4), also through the staged test backend; and at N = 16 (oversubscribed) full_shard, shard_grad_op and hybrid 4 x 4, with a
# checkpoint written at N = 16 resumed at N = 3. Every step's loss and gradient norm must equal the
# one-rank run's within 1e-5 (fp32; the ranks sum in another order, as in tests/dist/parity_test.cpp),
# and every run must finish all its steps. Hybrid sharding issues its replica all-reduces when a
# reduce-scatter completes, so this also catches a divergence check that mistakes a legal
# interleaving of two communicators for ranks running different code (it stopped every hybrid run
# at step 1 before 2026-12-02).
# Many ranks: it prints each run's start-up (launch to the first step's line) and its largest
# rank's peak resident memory, and fails if a rank at N = 16 holds more than at N = 2 (+ 16 MiB for
# the collectives' per-peer buffers): nothing per rank may grow with N.
# Usage: strategies.sh FSDP_TRAIN MPIRUN [LARGEST_N]   (LARGEST_N: 16 by default; 4 leaves out N = 16)
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
global_batch = 48
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

# run NAME RANKS [--set ...]: fsdp-train under mpirun; metrics in $work/NAME/metrics.jsonl, each
# output line stamped with the time it was printed (for the start-up figure).
run() {
  local name=$1 ranks=$2
  shift 2
  log="$work/$name.log"
  local launched=$EPOCHREALTIME
  timeout 300 "$mpirun" --oversubscribe --bind-to none -np "$ranks" "$train" "$work/base.toml" \
      --set "output_dir=\"$work/$name\"" "$@" --progress lines 2>&1 |
    while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$log"
  [ "${PIPESTATUS[0]}" = 0 ] || fail "$name at N = $ranks did not finish"
  python3 - "$log" "$work/$name/metrics.jsonl" "$name" "$ranks" "$launched" <<'PY' || fail "$name: no step line or metrics"
import json, sys
log, metrics, name, ranks, launched = sys.argv[1:]
stamped = [(float(l.split(" ", 1)[0]) - float(launched), l.split(" ", 1)[1]) for l in open(log)]
first = next(t for t, text in stamped if text.startswith("step "))
end = stamped[-1][0]
peak = max(max(r["peak_resident_bytes_per_rank"]) for r in map(json.loads, open(metrics)) if "peak_resident_bytes_per_rank" in r)
print(f"ran  {name} at N = {ranks}: {end:.1f} s, start-up (launch to step 1) {first:.1f} s, largest rank peak {peak / 2**20:.1f} MiB")
open(metrics + ".peak", "w").write(str(peak))
PY
}

# compare NAME [FIRST]: every step's loss and gradient norm (from step FIRST, 1 by default) against
# the one-rank run's.
compare() {
  python3 - "$work/alone/metrics.jsonl" "$work/$1/metrics.jsonl" "$1" "$steps" "${2:-1}" <<'PY' || fail "$1 differs from the one-rank run"
import json, sys
first = int(sys.argv[5])
def steps(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "step" in r and "loss" in r and r["step"] >= first:
            out[r["step"]] = (r["loss"], r["grad_norm"])
    return out
reference, run, name, expected = steps(sys.argv[1]), steps(sys.argv[2]), sys.argv[3], int(sys.argv[4]) - first + 1
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
# The staged test backend under the trainer (comm/staged_process_group.h; what gpu-check.sh runs
# at N = 2 on one GPU): host copies around MPI, results written at wait().
FSDP_DEVICE_COMM=staged run hybrid_2x2_staged 4 --set 'fsdp.strategy="hybrid_shard"' --set fsdp.shard_group_size=2
grep -q "collectives: staged" "$log" || fail "hybrid_2x2_staged: the header does not name the staged backend"
compare hybrid_2x2_staged
if [ "$largest" -ge 16 ]; then
  run full_shard_16 16 --set 'fsdp.strategy="full_shard"' --set checkpoint.every=3
  compare full_shard_16
  run shard_grad_op_16 16 --set 'fsdp.strategy="shard_grad_op"'
  compare shard_grad_op_16
  run hybrid_4x4 16 --set 'fsdp.strategy="hybrid_shard"' --set fsdp.shard_group_size=4
  grep -q "hybrid_shard (4 replicas x 4 shards)" "$log" || fail "hybrid_4x4: the header does not say 4 replicas x 4 shards"
  compare hybrid_4x4
  # The N = 16 checkpoint of step 3, resumed at N = 3: steps 4-6 as the one-rank run's.
  run resumed_16_to_3 3 --set 'fsdp.strategy="full_shard"' --resume "$work/full_shard_16/checkpoints/step-00000003"
  compare resumed_16_to_3 4
  python3 - "$work/full_shard/metrics.jsonl.peak" "$work/full_shard_16/metrics.jsonl.peak" <<'PY' || fail "per-rank memory grows with N"
import sys
n2, n16 = (float(open(p).read()) for p in sys.argv[1:])
allowance = 16 * 2**20
print(f"ok   largest rank's peak resident memory: {n16 / 2**20:.1f} MiB at N = 16, {n2 / 2**20:.1f} MiB at N = 2 (allowed: N = 2's + 16 MiB)")
if n16 > n2 + allowance:
    sys.exit(f"a rank at N = 16 holds {(n16 - n2) / 2**20:.1f} MiB more than at N = 2")
PY
fi
