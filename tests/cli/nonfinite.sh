#!/usr/bin/env bash
# Non-finite gradients with the real fsdp-train on 2 ranks: a learning rate of 1e30 blows the model
# up after its first step, so every later step's gradient norm is NaN. Each such step is skipped
# (recorded in metrics.jsonl), and after train.max_nonfinite_steps of them in a row the run stops:
# one error line naming the step and the count, a non-zero exit on every rank.
# Usage: nonfinite.sh FSDP_TRAIN MPIRUN
set -uo pipefail
train=$1 mpirun=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [ -f "$work/log" ] && sed 's/^/    /' "$work/log" | tail -30; exit 1; }

cat >"$work/run.toml" <<TOML
name = "nonfinite"
output_dir = "$work/run"
[model]
name = "gpt-test"
[train]
steps = 20
global_batch = 4
seq_len = 16
log_every = 1
max_nonfinite_steps = 3
[optimizer]
lr = 1e30
[eval]
every = 0
sample_tokens = 0
TOML

# Each rank writes its own exit status (mpirun reports only one).
timeout 120 "$mpirun" --oversubscribe --bind-to none -np 2 bash -c \
  '"$0" "$@"; echo $? >"'"$work"'/exit.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}"' \
  "$train" "$work/run.toml" --progress lines >"$work/log" 2>&1
for rank in 0 1; do
  [ -f "$work/exit.$rank" ] || fail "rank $rank did not finish"
  [ "$(cat "$work/exit.$rank")" -ne 0 ] || fail "rank $rank exited 0"
done
expected="step 4: gradient norm nan, not finite for 3 steps in a row (the limit), 3 steps skipped in all"
count=$(grep -cF -- "$expected" "$work/log")
[ "$count" -eq 1 ] || fail "expected '$expected' once, got it $count times"
[ "$(grep -c 'error' "$work/log")" -eq 1 ] || fail "expected exactly one error line"
grep -q 'step 2/20 .*| skipped: non-finite (1 in all)' "$work/log" || fail "the progress line of step 2 does not show the skip"
echo "ok   stopped with one line, non-zero exit on both ranks: $(grep -F -- "$expected" "$work/log")"

metrics="$work/run/metrics.jsonl"
[ -f "$metrics" ] || fail "no metrics.jsonl"
steps=$(grep -c '"step":' "$metrics")
skipped=$(grep -c '"skipped":true' "$metrics")
[ "$steps" -eq 4 ] || fail "expected 4 step records, got $steps"
[ "$skipped" -eq 3 ] || fail "expected 3 skipped steps in metrics.jsonl, got $skipped"
grep -q '"skipped":false.*"skipped_steps":0\|"skipped_steps":0.*"skipped":false' "$metrics" || fail "step 1 is not recorded as applied"
tail -1 "$metrics" | grep -q '"skipped_steps":3' || fail "the last record does not count 3 skipped steps"
echo "ok   metrics.jsonl: step 1 applied, steps 2-4 skipped (skipped_steps 1, 2, 3)"
