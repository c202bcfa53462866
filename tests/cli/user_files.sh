#!/usr/bin/env bash
# Nothing a user points at is lost (docs/checkpoints.md, "What fsdp.cpp will never delete"), tried
# with the real programs as a user would:
#  1. fsdp-data train-tokenizer into a directory holding a user's files (with and without a
#     trailing slash) is refused, the files intact; into a new or empty directory it writes.
#  2. A new run into a directory holding another run is refused (exit 2) naming it, every file of
#     the old run intact; --resume latest continues the old run.
#  3. The pruner leaves a user's copies (step-*-best, step-*.bak) and keeps the real newest
#     checkpoint (checkpoint.keep = 1); --resume latest takes it.
#  4. --resume of an older checkpoint of the same run is refused (the later steps would stay newest);
#     --resume latest on a run at train.steps says it is done and exits 0.
#  5. fsdp-ckpt export refuses an existing output (file, directory) unless --overwrite, and
#     --max-file-size with a file --output. Given a run's checkpoints directory (what fsdp-ckpt
#     import --output and checkpoint.dir name), export and inspect take its latest checkpoint and
#     say which; a directory with none is refused naming it.
#  6. A second job on a directory in use is refused, naming the first's pid.
#  7. --output-dir with a backslash and a quote is the directory named so; a non-UTF-8 --set value
#     is refused naming its key.
#  8. fsdp-run on a directory holding another run is refused, not restarted; with --resume latest it
#     continues it, and on a finished run it is done (exit 0).
#  9. A Llama directory holding a tensor the model has no place for: named, as transformers does.
# Usage: user_files.sh BUILD_DIR MPIRUN
set -uo pipefail
build=$1 mpirun=$2
train=$build/apps/fsdp-train data=$build/apps/fsdp-data ckpt=$build/apps/fsdp-ckpt run=$build/apps/fsdp-run
work=$(mktemp -d)
trap 'pkill -KILL -f "fsdp-train $work" 2>/dev/null; rm -rf "$work"' EXIT
ranks=("$mpirun" --oversubscribe --bind-to none -np 2)
# USER_FILES_KEEP_GOING=1: report every failure and go on (to see which checks an older build fails).
failed=0
fail() {
  echo "FAIL: $*"; [ -f "$work/log" ] && sed 's/^/    /' "$work/log" | tail -${USER_FILES_LOG_LINES:-20}
  [ -n "${USER_FILES_KEEP_GOING:-}" ] || exit 1
  failed=1
}
ok() { echo "ok   $*"; }
# fingerprint DIR: every file's path and checksum, to show a directory is untouched.
fingerprint() { (cd "$1" && find . -type f ! -name run.lock -print0 | sort -z | xargs -0 -r md5sum); }

# ---- 1. train-tokenizer ----
mkdir -p "$work/myrun/checkpoints"
echo "weights" > "$work/myrun/checkpoints/weights.bin"
echo "my notes" > "$work/myrun/notes.txt"
printf 'the quick brown fox jumps over the lazy dog\n%.0s' $(seq 1 50) > "$work/corpus.txt"
before=$(fingerprint "$work/myrun")
for dir in "$work/myrun" "$work/myrun/"; do
  if "$data" train-tokenizer --output-dir "$dir" --vocab-size 300 "$work/corpus.txt" > "$work/log" 2>&1; then
    fail "train-tokenizer --output-dir $dir (holding a user's files) succeeded"
  fi
  grep -q "exists" "$work/log" || fail "train-tokenizer's refusal does not say why"
  refusal=$(head -1 "$work/log")
  [ "$(fingerprint "$work/myrun")" = "$before" ] || fail "train-tokenizer --output-dir $dir changed the user's files"
  [ ! -e "$work/myrun.partial" ] && [ ! -e "$work/myrun/.partial" ] || fail "train-tokenizer left a .partial behind"
done
mkdir "$work/empty"
"$data" train-tokenizer --output-dir "$work/empty/" --vocab-size 300 "$work/corpus.txt" > "$work/log" 2>&1 ||
  fail "train-tokenizer into an empty directory failed"
[ -f "$work/empty/tokenizer.json" ] && [ ! -e "$work/empty.partial" ] || fail "train-tokenizer did not write into the empty directory"
ok "train-tokenizer: a directory with a user's files refused: $refusal"

# ---- 2. a new run into a directory holding another run ----
cat > "$work/run.toml" <<TOML
name = "files"
output_dir = "$work/run"
[model]
name = "gpt-test"
[train]
steps = 4
global_batch = 4
seq_len = 16
log_every = 1
report_every = 0
[eval]
every = 0
sample_tokens = 0
[checkpoint]
every = 2
keep = 1
TOML
timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines > "$work/log" 2>&1 || fail "the first run failed"
[ -f "$work/run/run.json" ] || fail "no run.json"
before=$(fingerprint "$work/run")
timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines > "$work/log" 2>&1
status=$?
[ "$status" = 2 ] || fail "a new run into a directory holding another run exited $status, not 2"
grep -q "holds another run" "$work/log" && grep -q -- "--resume latest" "$work/log" || fail "the refusal does not name the run and the way on"
[ "$(fingerprint "$work/run")" = "$before" ] || fail "the refused run changed the old run's files"
ok "a new run into another run's directory refused: $(grep -m1 'holds another run' "$work/log" | cut -c1-200)"

# ---- 3. a user's copies beside the checkpoints, keep = 1 ----
cp -r "$work/run/checkpoints/step-00000004" "$work/run/checkpoints/step-00000004-best"
cp -r "$work/run/checkpoints/step-00000004" "$work/run/checkpoints/step-00000004.bak"
timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines --resume latest --steps 8 > "$work/log" 2>&1 ||
  fail "--resume latest failed"
grep -qF "resumed from $work/run/checkpoints/step-00000004 at step 4" "$work/log" || fail "did not resume the run's own step 4"
[ -d "$work/run/checkpoints/step-00000004-best" ] && [ -d "$work/run/checkpoints/step-00000004.bak" ] ||
  fail "the pruner removed a user's copy"
published=$(cd "$work/run/checkpoints" && ls -d step-[0-9]* | grep -E '^step-[0-9]+$' | xargs)
[ "$published" = "step-00000008" ] || fail "keep = 1 left '$published', not step-00000008"
ok "pruning (keep = 1) left the user's step-00000004-best and .bak, kept step-00000008"

# ---- 4. an older checkpoint of the same run; a run that is done ----

timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines --resume latest --steps 8 > "$work/log" 2>&1
status=$?
[ "$status" = 0 ] && grep -q "is done" "$work/log" || fail "--resume latest on a finished run: exit $status, not 0 with 'is done'"
ok "--resume latest on a finished run: $(grep -m1 'is done' "$work/log" | cut -c1-160)"
timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines --resume latest --steps 6 > "$work/log" 2>&1
status=$?
[ "$status" = 2 ] && grep -q "nothing left to train" "$work/log" || fail "--resume latest past train.steps: exit $status, not 2"
timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines --resume latest --steps 10 \
  --set checkpoint.every=1 --set checkpoint.keep=0 > "$work/log" 2>&1 || fail "continuing to step 10 failed"
timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines --resume "$work/run/checkpoints/step-00000009" --steps 12 \
  > "$work/log" 2>&1
status=$?
[ "$status" = 2 ] && grep -q "newest checkpoint is" "$work/log" || fail "--resume of an older step of the run: exit $status"
ok "--resume of step 9 with step 10 newer refused"

# ---- 5. export ----
echo "user's model" > "$work/model.safetensors"
mkdir "$work/hf" && echo "base weights" > "$work/hf/model.safetensors"
latest=$work/run/checkpoints/step-00000010
"$ckpt" export "$latest" --output "$work/model.safetensors" > "$work/log" 2>&1 && fail "export over an existing file succeeded"
grep -q "exists" "$work/log" || fail "the export's refusal does not say why"
[ "$(cat "$work/model.safetensors")" = "user's model" ] || fail "export changed the existing file"
"$ckpt" export "$latest" --output "$work/hf" --max-file-size 1MB > "$work/log" 2>&1 && fail "export into a directory with files succeeded"
[ "$(ls "$work/hf")" = "model.safetensors" ] || fail "export wrote into the user's directory"
"$ckpt" export "$latest" --output "$work/new.safetensors" --max-file-size 1MB > "$work/log" 2>&1
status=$?
[ "$status" = 2 ] && grep -q "names a file" "$work/log" || fail "--max-file-size with a file --output: exit $status"
mkdir "$work/release.partial" && echo "mine" > "$work/release.partial/notes.txt"
"$ckpt" export "$latest" --hf-dir "$work/release" > "$work/log" 2>&1 && fail "export beside a user's release.partial succeeded"
[ "$(cat "$work/release.partial/notes.txt")" = "mine" ] && [ ! -e "$work/release" ] || fail "export touched the user's release.partial"
mkdir "$work/a-dir" && echo "keep" > "$work/a-dir/keep.txt"
"$ckpt" export "$latest" --output "$work/a-dir" --overwrite > "$work/log" 2>&1 && fail "a file export replaced a directory"
[ "$(cat "$work/a-dir/keep.txt")" = "keep" ] || fail "a file export with --overwrite removed a directory"
"$ckpt" export "$latest" --output "$work/model.safetensors" --overwrite > "$work/log" 2>&1 || fail "export --overwrite failed"
! grep -q "user's model" "$work/model.safetensors" && [ ! -e "$work/model.safetensors.partial" ] ||
  fail "export --overwrite did not replace the file"
ok "export: an existing file and directory refused, --max-file-size with a file refused, --overwrite replaces"
"$ckpt" export "$work/run/checkpoints" --output "$work/latest.safetensors" > "$work/log" 2>&1 ||
  fail "export of a checkpoints directory failed"
grep -q "taking its latest checkpoint, $work/run/checkpoints/step-00000010" "$work/log" && [ -f "$work/latest.safetensors" ] &&
  cmp -s "$work/latest.safetensors" "$work/model.safetensors" || fail "export of a checkpoints directory did not take step 10"
taken=$(grep -m1 -o 'taking its latest.*' "$work/log")
"$ckpt" inspect "$work/run/checkpoints/" > "$work/log" 2>&1 && grep -q "step-00000010" "$work/log" ||
  fail "inspect of a checkpoints directory did not take step 10"
mkdir "$work/no-checkpoints"
"$ckpt" export "$work/no-checkpoints" --output "$work/none.safetensors" > "$work/log" 2>&1 &&
  fail "export of a directory without checkpoints succeeded"
grep -q "no manifest.json" "$work/log" && [ ! -e "$work/none.safetensors" ] || fail "export of a directory without checkpoints: not named"
ok "export and inspect of a run's checkpoints directory take its latest ($taken); none there: refused"

# ---- 6. a second job on a directory in use ----
FSDP_TEST_PAUSE_IN_SAVE_MS=60000 FSDP_TEST_PAUSE_AT_STEP=12 \
  "${ranks[@]}" -x FSDP_TEST_PAUSE_IN_SAVE_MS -x FSDP_TEST_PAUSE_AT_STEP \
  "$train" "$work/run.toml" --progress lines --resume latest --steps 12 > "$work/first.log" 2>&1 &
first=$!
for _ in $(seq 1 1200); do grep -q "pausing" "$work/first.log" && break; sleep 0.1; done
grep -q "pausing" "$work/first.log" || { cp "$work/first.log" "$work/log"; fail "the first job never reached its save"; }
# (It waits FSDP_RUN_LOCK_WAIT_S for the first to end, as a restart right after a failure needs.)
FSDP_RUN_LOCK_WAIT_S=2 timeout 120 "${ranks[@]}" -x FSDP_RUN_LOCK_WAIT_S "$train" "$work/run.toml" --progress lines \
  --resume latest --steps 12 > "$work/log" 2>&1
status=$?
kill -9 "$first" 2>/dev/null; pkill -KILL -f "fsdp-train $work/run.toml" 2>/dev/null; wait "$first" 2>/dev/null
[ "$status" = 2 ] && grep -q "in use by another job (fsdp-train pid" "$work/log" || fail "a second job on a directory in use: exit $status"
ok "a second job refused: $(grep -o 'in use by another job ([^)]*)' "$work/log" | head -1)"

# ---- 7. odd names ----
odd="$work/odd\\new\"q"
timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines --output-dir "$odd" --steps 1 > "$work/log" 2>&1 ||
  fail "--output-dir with a backslash and a quote failed"
[ -f "$odd/metrics.jsonl" ] || fail "--output-dir '$odd' was not the directory written"
timeout 60 "${ranks[@]}" "$train" "$work/run.toml" --output-dir "$work/latin1" --set "data.dir=$(printf '/tmp/caf\xe9')" > "$work/log" 2>&1 &&
  fail "a non-UTF-8 data.dir was taken"
grep -q "data.dir is not valid UTF-8" "$work/log" || fail "the non-UTF-8 refusal does not name data.dir"
ok "--output-dir with \\ and \" is that directory; a non-UTF-8 value refused: $(grep -m1 'UTF-8' "$work/log" | cut -c1-120)"

# ---- 8. fsdp-run ----
launcher="$mpirun --oversubscribe --bind-to none -np"
timeout 120 "$run" --ranks 2 --launcher "$launcher" -- "$work/run.toml" --steps 4 --output-dir "$work/supervised" > "$work/log" 2>&1 ||
  fail "fsdp-run's first run failed"
timeout 120 "$run" --ranks 2 --launcher "$launcher" -- "$work/run.toml" --steps 4 --output-dir "$work/supervised" > "$work/log" 2>&1
status=$?
[ "$status" = 2 ] && grep -q "holds another run" "$work/log" && ! grep -q "attempt 2" "$work/log" ||
  fail "fsdp-run on another run's directory: exit $status"
timeout 120 "$run" --ranks 2 --launcher "$launcher" -- "$work/run.toml" --steps 4 --output-dir "$work/supervised" --resume latest \
  > "$work/log" 2>&1 || fail "fsdp-run --resume latest on a finished run failed"
grep -q "is done" "$work/log" || fail "fsdp-run --resume latest on a finished run did not say it is done"
ok "fsdp-run: another run's directory refused (exit 2, no restart); --resume latest on a finished run is done"

# ---- 10. a branch run that ended before a checkpoint of its own resumes from where it branched ----
timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines --output-dir "$work/branch" \
  --resume "$work/run/checkpoints/step-00000010" --steps 11 --set checkpoint.every=0 > "$work/log" 2>&1 ||
  fail "the branch run failed"
[ ! -d "$work/branch/checkpoints" ] || fail "the branch saved a checkpoint (checkpoint.every = 0)"
timeout 120 "${ranks[@]}" "$train" "$work/run.toml" --progress lines --output-dir "$work/branch" --resume latest \
  --steps 12 > "$work/log" 2>&1 || fail "--resume latest on the branch failed"
grep -qF "resumed from $work/run/checkpoints/step-00000010 at step 10" "$work/log" ||
  fail "--resume latest on a branch with no checkpoint of its own did not start again from where it branched"
ok "--resume latest on a branch without a checkpoint of its own: $(grep -m1 'no checkpoint of its own' "$work/log" | cut -c1-150)"

# ---- 9. a model directory with a tensor the model has no place for ----
sed -e 's/name = "gpt-test"/name = "llama-test"/' -e "s|output_dir = .*|output_dir = \"$work/llama\"|" "$work/run.toml" > "$work/llama.toml"
timeout 120 "${ranks[@]}" "$train" "$work/llama.toml" --progress lines --steps 2 > "$work/log" 2>&1 || fail "the llama run failed"
"$ckpt" export "$work/llama/checkpoints/step-00000002" --hf-dir "$work/llama-hf" > "$work/log" 2>&1 || fail "export --hf-dir failed"
python3 - "$work/llama-hf" <<'PY'
import glob, json, struct, sys
path = sorted(glob.glob(sys.argv[1] + "/*.safetensors"))[0]
blob = open(path, "rb").read()
size = struct.unpack("<Q", blob[:8])[0]
header, data = json.loads(blob[8:8 + size]), blob[8 + size:]
header["model.extra.weight"] = {"dtype": "F32", "shape": [2], "data_offsets": [len(data), len(data) + 8]}
text = json.dumps(header).encode()
open(path, "wb").write(struct.pack("<Q", len(text)) + text + data + bytes(8))
index = sys.argv[1] + "/model.safetensors.index.json"
try:
    doc = json.load(open(index))
    doc["weight_map"]["model.extra.weight"] = path.rsplit("/", 1)[1]
    json.dump(doc, open(index, "w"))
except FileNotFoundError:
    pass
PY
printf 'name = "unused"\noutput_dir = "%s"\n[model]\ninit_from = "%s"\n[train]\nsteps = 1\nglobal_batch = 4\nseq_len = 16\n[eval]\nevery = 0\nsample_tokens = 0\n' \
  "$work/unused" "$work/llama-hf" > "$work/unused.toml"
timeout 120 "${ranks[@]}" "$train" "$work/unused.toml" --progress lines > "$work/log" 2>&1 || fail "fine-tuning from the model directory failed"
grep -q "1 tensor(s) the model does not use, not read: model.extra.weight" "$work/log" ||
  fail "a tensor the Llama has no place for was not named"
ok "a model directory's unused tensor is named: $(grep -m1 'does not use' "$work/log" | cut -c1-160)"
exit "$failed"
