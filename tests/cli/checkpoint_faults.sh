#!/usr/bin/env bash
# Checkpoints under faults, with the real fsdp-train on 2 ranks:
#  1. kill -9 one rank in the middle of a save (a test hook pauses it there): the partial
#     checkpoint is never taken for valid, and --resume latest continues from the previous one;
#  2. SIGTERM to every rank (what a scheduler does when preempting): each saves a checkpoint at the
#     end of the step and exits 0 within a bound; --resume latest continues from it;
#  3. checkpoint.async: kill -9 one rank while its thread writes in the background (training going
#     on): the partial checkpoint is never taken for valid, and --resume latest continues;
#  4. Ctrl-C typed on the terminal of scripts/train.sh's launcher and of fsdp-run: every rank saves
#     and exits (a pseudo-terminal, as a user's keyboard).
# Usage: checkpoint_faults.sh FSDP_TRAIN MPIRUN
set -uo pipefail
train=$1 mpirun=$2
work=$(mktemp -d)
trap 'pkill -KILL -f "^$train $work" 2>/dev/null; rm -rf "$work"' EXIT
ranks=("$mpirun" --oversubscribe --bind-to none -np 2)
fail() { echo "FAIL: $*"; [ -f "$work/log" ] && sed 's/^/    /' "$work/log" | tail -30; exit 1; }

# wait_for FILE TEXT SECONDS
wait_for() {
  for _ in $(seq 1 $(($3 * 10))); do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

cat >"$work/run.toml" <<TOML
name = "faults"
output_dir = "$work/run"
[model]
name = "gpt-test"
[train]
steps = 6
global_batch = 4
seq_len = 16
log_every = 1
[eval]
every = 0
sample_tokens = 0
[checkpoint]
every = 2
TOML

# 1. kill -9 rank 1 while it is inside the save of step 4.
# (Each case empties the log before its job starts in the background: the waits below must not
# find the previous case's lines before the new job's redirection has truncated it.)
: >"$work/log"
FSDP_TEST_PAUSE_IN_SAVE_MS=120000 FSDP_TEST_PAUSE_RANK=1 FSDP_TEST_PAUSE_AT_STEP=4 \
  "${ranks[@]}" -x FSDP_TEST_PAUSE_IN_SAVE_MS -x FSDP_TEST_PAUSE_RANK -x FSDP_TEST_PAUSE_AT_STEP \
  "$train" "$work/run.toml" --progress lines >"$work/log" 2>&1 &
launcher=$!
wait_for "$work/log" "pausing" 120 || fail "the save of step 4 never reached the test hook"
pid=$(grep -o 'pid [0-9]*' "$work/log" | head -1 | cut -d' ' -f2)
kill -9 "$pid"
timeout 60 tail --pid="$launcher" -f /dev/null || fail "the job did not end after one rank was killed"
[ -f "$work/run/checkpoints/step-00000002/manifest.json" ] || fail "checkpoint of step 2 missing"
[ ! -e "$work/run/checkpoints/step-00000004" ] || fail "the interrupted checkpoint of step 4 was published"
[ -d "$work/run/checkpoints/step-00000004.partial" ] || fail "expected the interrupted save's .partial directory"
echo "ok   kill -9 mid-save: step 4 left as .partial, step 2 intact"

timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines --resume latest >"$work/log" 2>&1 ||
  fail "resume after the crash failed"
grep -qF "resumed from $work/run/checkpoints/step-00000002 at step 2" "$work/log" || fail "did not resume from step 2"
grep -qF "done: 6 steps" "$work/log" || fail "the resumed run did not finish"
[ -f "$work/run/checkpoints/step-00000006/manifest.json" ] || fail "final checkpoint missing"
[ ! -e "$work/run/checkpoints/step-00000004.partial" ] || fail "the stale .partial directory was not cleaned up"
echo "ok   --resume latest after the crash: continued from step 2 to 6"

# 2. SIGTERM to both ranks mid-run.
sed -e 's/^steps = 6/steps = 100000/' -e 's/^every = 2/every = 0/' "$work/run.toml" >"$work/long.toml"
rm -rf "$work/run"
: >"$work/log"
"${ranks[@]}" "$train" "$work/long.toml" --progress lines >"$work/log" 2>&1 &
launcher=$!
wait_for "$work/log" "step 3/" 120 || fail "training did not start"
sent=$(date +%s%N)
pkill -TERM -f "^$train $work/long.toml" || fail "no rank process to signal"
timeout 60 tail --pid="$launcher" -f /dev/null || fail "ranks did not exit within 60 s of SIGTERM"
wait "$launcher"
status=$?
elapsed_ms=$((($(date +%s%N) - sent) / 1000000))
[ "$status" -eq 0 ] || fail "exit status $status after SIGTERM (expected 0)"
stopped=$(grep -o 'stopped on request after step [0-9]*' "$work/log" | grep -o '[0-9]*$')
[ -n "$stopped" ] || fail "no 'stopped on request' message"
[ -f "$work/run/checkpoints/$(printf 'step-%08d' "$stopped")/manifest.json" ] || fail "no checkpoint of step $stopped"
echo "ok   SIGTERM: every rank saved step $stopped and exited 0, $elapsed_ms ms after the signal"
timeout 120 "${ranks[@]}" "$train" "$work/long.toml" --progress lines --resume latest --steps $((stopped + 2)) \
  >"$work/log" 2>&1 || fail "resume after SIGTERM failed"
grep -qF "done: $((stopped + 2)) steps" "$work/log" || fail "the resumed run did not finish"
echo "ok   --resume latest after SIGTERM: continued from step $stopped"
# 3. checkpoint.async: kill -9 rank 1 while its background thread writes step 4 (the hook pauses
#    the thread; the ranks train on meanwhile, then wait for it at the next save).
rm -rf "$work/run"
: >"$work/log"
FSDP_TEST_PAUSE_IN_SAVE_MS=120000 FSDP_TEST_PAUSE_RANK=1 FSDP_TEST_PAUSE_AT_STEP=4 \
  "${ranks[@]}" -x FSDP_TEST_PAUSE_IN_SAVE_MS -x FSDP_TEST_PAUSE_RANK -x FSDP_TEST_PAUSE_AT_STEP \
  "$train" "$work/run.toml" --progress lines --set checkpoint.async=true >"$work/log" 2>&1 &
launcher=$!
wait_for "$work/log" "pausing" 120 || fail "the background write of step 4 never reached the test hook"
wait_for "$work/log" "step 5/6" 60 || fail "training did not go on while step 4 was being written"
pid=$(grep -o 'pid [0-9]*' "$work/log" | head -1 | cut -d' ' -f2)
kill -9 "$pid"
timeout 60 tail --pid="$launcher" -f /dev/null || fail "the job did not end after one rank was killed"
[ -f "$work/run/checkpoints/step-00000002/manifest.json" ] || fail "async: checkpoint of step 2 missing"
[ ! -e "$work/run/checkpoints/step-00000004" ] || fail "async: the interrupted checkpoint of step 4 was published"
[ -d "$work/run/checkpoints/step-00000004.partial" ] || fail "async: expected the interrupted write's .partial directory"
timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines --resume latest --set checkpoint.async=true >"$work/log" 2>&1 ||
  fail "async: resume after the crash failed"
grep -qF "resumed from $work/run/checkpoints/step-00000002 at step 2" "$work/log" || fail "async: did not resume from step 2"
[ -f "$work/run/checkpoints/step-00000006/manifest.json" ] || fail "async: final checkpoint missing"
echo "ok   checkpoint.async, kill -9 mid-write: step 4 left as .partial while training went on, step 2 intact, resumed"

# 4. Ctrl-C typed on the terminal (a pseudo-terminal here: the kernel sends SIGINT to its foreground
#    process group, as a user's keyboard does), for the two ways the docs launch a job:
#    scripts/launch-ranks.sh (what scripts/train.sh runs after its set-up) and fsdp-run. mpirun in
#    the foreground would not do: it answers SIGINT with SIGTERM to its ranks 1 s later and SIGKILL
#    1 s after that, killing a rank mid-save; both relay the stop as SIGUSR1 instead.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ctrl_c_check() {  # ctrl_c_check NAME: the run stopped on request, saved, and resumes
  local name=$1 stopped
  stopped=$(grep -o 'stopped on request after step [0-9]*' "$work/log" | grep -o '[0-9]*$')
  [ -n "$stopped" ] || fail "$name: no 'stopped on request' after Ctrl-C (a rank killed mid-save?)"
  [ -f "$work/run/checkpoints/$(printf 'step-%08d' "$stopped")/manifest.json" ] || fail "$name: no checkpoint of step $stopped"
  echo "ok   Ctrl-C on $name's terminal: every rank saved step $stopped and exited 0"
}
rm -rf "$work/run"
python3 "$here/ctrl_c.py" "$work/log" "step 3/" bash -c 'source "$1"; shift; launch_ranks 2 "$@"' _ \
  "$here/../../scripts/launch-ranks.sh" "$train" "$work/long.toml" --progress lines
status=$?
# 130: stopped on request (the ranks saved and exited 0), so that a script does not go on (export).
[ "$status" = 130 ] || fail "scripts/launch-ranks.sh: exit $status after Ctrl-C, not 130"
ctrl_c_check "scripts/launch-ranks.sh (scripts/train.sh)"
run=$(dirname "$train")/fsdp-run
if [ -x "$run" ]; then
  rm -rf "$work/run"
  python3 "$here/ctrl_c.py" "$work/log" "step 3/" "$run" --ranks 2 --launcher "$mpirun --oversubscribe --bind-to none -np" \
    -- "$work/long.toml" --progress lines
  status=$?
  [ "$status" = 130 ] || fail "fsdp-run: exit $status after Ctrl-C, not 130 (128 + SIGINT: saved and stopped)"
  ctrl_c_check fsdp-run
  ! grep -q "attempt 2" "$work/log" || fail "fsdp-run started another attempt after Ctrl-C"
fi
echo "all checkpoint fault cases behaved"
