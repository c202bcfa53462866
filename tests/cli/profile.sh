#!/usr/bin/env bash
# fsdp-train --profile-steps on 2 ranks: each rank writes a Chrome trace of exactly the steps asked
# for (ProfilerStep#2 and #3 of 5), holding libtorch's operators and the runtime's marks for each
# unit's gathers and reductions; a bad range is refused before anything runs.
# Usage: profile.sh FSDP_TRAIN MPIRUN PYTHON
set -uo pipefail
train=$1 mpirun=$2 python=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [ -f "$work/log" ] && sed 's/^/    /' "$work/log" | tail -30; exit 1; }

cat >"$work/run.toml" <<TOML
name = "profile"
output_dir = "$work/run"
[model]
name = "gpt-test"
[train]
steps = 5
global_batch = 4
seq_len = 16
log_every = 1
[eval]
every = 0
sample_tokens = 0
TOML

timeout 180 "$mpirun" --oversubscribe --bind-to none -np 2 "$train" "$work/run.toml" --progress lines \
  --profile-steps 2:3 >"$work/log" 2>&1 || fail "fsdp-train --profile-steps 2:3 failed"
grep -qi "error" "$work/log" && fail "the profiled run logged an error"
grep -q "profile of steps 2-3 written: $work/run/profile/trace-rank0.json" "$work/log" || fail "no message naming the trace"
for rank in 0 1; do
  trace="$work/run/profile/trace-rank$rank.json"
  [ -f "$trace" ] || fail "rank $rank wrote no trace ($trace)"
  [ -e "$trace.partial" ] && fail "rank $rank left $trace.partial"
  "$python" - "$trace" <<'PY' || fail "trace of rank $rank: see above"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
names = {e.get("name", "") for e in events}
steps = sorted(n for n in names if n.startswith("ProfilerStep#"))
assert steps == ["ProfilerStep#2", "ProfilerStep#3"], f"profiled steps {steps}, expected #2 and #3"
for wanted in ("fsdp::gather h.0", "fsdp::prefetch h.1", "fsdp::reduce_grad h.0", "fsdp::wait_reduce <root>"):
    assert wanted in names, f"no '{wanted}' event among {len(names)} names"
assert any(n.startswith("aten::") for n in names), "no libtorch operator in the trace"
print(f"{sys.argv[1]}: {len(events)} events, {steps}")
PY
done

# Refused by name, before training: a range past the run, and one that is not a range.
timeout 60 "$train" "$work/run.toml" --profile-steps 4:9 >"$work/log" 2>&1 && fail "--profile-steps 4:9 of 5 steps was accepted"
grep -q -- "--profile-steps 4:9: the run has 5 steps" "$work/log" || fail "the error does not say the run has 5 steps"
timeout 60 "$train" "$work/run.toml" --profile-steps 3:2 >"$work/log" 2>&1 && fail "--profile-steps 3:2 was accepted"
grep -q -- "--profile-steps '3:2': expected A:B" "$work/log" || fail "the error does not explain A:B"
echo "PASS: traces of steps 2-3 on both ranks; bad ranges refused"
