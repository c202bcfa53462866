#!/usr/bin/env bash
# fsdp-run restarts a failed job from its latest checkpoint, with the real fsdp-train:
#  1. 2 ranks, one SIGKILLed mid-run: the job completes and its final checkpoint equals an
#     uninterrupted run's bit for bit (the crc32 of each rank's file, in the manifests);
#  2. --min-ranks 1: the restart runs on 1 rank (the checkpoint reshards) and the final parameters
#     equal the uninterrupted 2-rank run's within 1e-5 (max |difference|, fp32, dropout 0);
#  3. restarts.jsonl records each attempt; a bad command line is not restarted.
# Usage: restart.sh BUILD_DIR MPIRUN
set -uo pipefail
build=$1 mpirun=$2
work=$(mktemp -d)
trap 'pkill -KILL -f "fsdp-train $work" 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; for f in "$work"/*.log; do echo "--- $f"; tail -25 "$f"; done; exit 1; }
launcher="$mpirun --oversubscribe --bind-to none -np"
steps=24
cat > "$work/run.toml" <<TOML
name = "restart"
seed = 7
[model]
name = "gpt-tiny"
dropout = 0.0
[train]
steps = $steps
global_batch = 32
seq_len = 128
log_every = 1
threads = 1
report_every = 0
[optimizer]
warmup_steps = 2
[eval]
every = 0
sample_tokens = 0
[checkpoint]
every = 8
keep = 10
TOML

# The reference: uninterrupted, 2 ranks.
$launcher 2 "$build/apps/fsdp-train" "$work/run.toml" --output-dir "$work/whole" --progress lines > "$work/whole.log" 2>&1 ||
  fail "the uninterrupted run failed"
final=$(printf 'checkpoints/step-%08d' $steps)

# run_killed NAME FSDP_RUN_ARGS...: fsdp-run in the background, one rank SIGKILLed after step 10.
run_killed() {
  local name=$1
  shift
  "$build/apps/fsdp-run" "$@" --launcher "$launcher" -- "$work/run.toml" --output-dir "$work/$name" --progress lines \
    > "$work/$name.log" 2>&1 &
  local supervisor=$!
  for _ in $(seq 1 600); do
    [ "$(grep -c '"grad_norm"' "$work/$name/metrics.jsonl" 2> /dev/null)" -ge 10 ] 2> /dev/null && break
    sleep 0.1
  done
  local victim
  victim=$(pgrep -f "fsdp-train $work/run.toml --output-dir $work/$name" | head -1)
  [ -n "$victim" ] || fail "$name: no rank to kill"
  kill -9 "$victim"
  timeout 300 tail --pid="$supervisor" -f /dev/null || fail "$name: fsdp-run did not finish"
  wait "$supervisor" || fail "$name: fsdp-run exited $?"
  [ -f "$work/$name/$final/manifest.json" ] || fail "$name: no final checkpoint"
  grep -q '"event":"restart"' "$work/$name/restarts.jsonl" || fail "$name: no restart in restarts.jsonl"
}

crcs() { python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
def walk(x, out):
    if isinstance(x, dict):
        for k, v in sorted(x.items()):
            if k == "crc32": out.append(str(v))
            else: walk(v, out)
    elif isinstance(x, list):
        for v in x: walk(v, out)
out = []; walk(m, out); print(" ".join(out))' "$1/$final/manifest.json"; }

# 1. Same size.
run_killed same --ranks 2 --max-restarts 2
a=$(crcs "$work/whole"); b=$(crcs "$work/same")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "same size: the final checkpoint differs from the uninterrupted run's"
resumed=$(grep -o '"resume_from":"[^"]*step-[0-9]*' "$work/same/restarts.jsonl" | tail -1 | grep -o 'step-[0-9]*')
echo "ok   SIGKILL at 2 ranks: fsdp-run restarted from $resumed; the final checkpoint equals the uninterrupted run's bit for bit (crc32 of its $(echo "$a" | wc -w) rank files)"

# 2. One rank fewer.
run_killed smaller --ranks 2 --min-ranks 1 --max-restarts 2
grep -q '"event":"start","attempt":2,"ranks":1\|"attempt":2.*"ranks":1' "$work/smaller/restarts.jsonl" ||
  grep -q '"ranks":1' "$work/smaller/restarts.jsonl" || fail "smaller: the restart did not run on 1 rank"
"$build/apps/fsdp-ckpt" export "$work/whole/$final" --output "$work/whole.safetensors" > /dev/null 2>&1 || fail "export failed"
"$build/apps/fsdp-ckpt" export "$work/smaller/$final" --output "$work/smaller.safetensors" > /dev/null 2>&1 || fail "export failed"
worst=$(python3 - "$work/whole.safetensors" "$work/smaller.safetensors" <<'PY'
import json, struct, sys, array
def load(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__": continue
        assert info["dtype"] == "F32", info["dtype"]
        a, b = info["data_offsets"]
        out[name] = array.array("f", data[8 + n + a:8 + n + b])
    return out
x, y = load(sys.argv[1]), load(sys.argv[2])
assert x.keys() == y.keys()
print(max(max(abs(p - q) for p, q in zip(x[k], y[k])) for k in x))
PY
) || fail "comparing the exports failed"
python3 -c "import sys; sys.exit(0 if float('$worst') < 1e-5 else 1)" ||
  fail "smaller: final parameters differ from the uninterrupted 2-rank run's by $worst (tolerance 1e-5)"
echo "ok   SIGKILL, restart on 1 rank (--min-ranks 1): final parameters within 1e-5 of the uninterrupted 2-rank run's (max |difference| $worst)"

# 3. Not restarted: a bad command line.
"$build/apps/fsdp-run" --ranks 2 --launcher "$launcher" -- "$work/run.toml" --no-such-flag > "$work/bad.log" 2>&1
status=$?
[ $status -ne 0 ] && ! grep -q "attempt 2" "$work/bad.log" || fail "a bad command line was restarted (exit $status)"
echo "ok   a bad command line fails at once, not restarted (exit $status)"
echo "all restart cases behaved"
