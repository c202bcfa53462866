#!/usr/bin/env bash
# A corpus in shards, end to end: fsdp-data corpus tokenizes JSON lines of the fortunes on 2
# threads into shards of 20,000 tokens; fsdp-train (2 ranks) trains on the shard directory and on
# one token file holding the same tokens (the shards concatenated): every step's loss and gradient
# norm must be bitwise equal (windows drawn across shard boundaries read the same tokens). A run
# resumed from the sharded run's step-3 checkpoint must continue with its losses, also bitwise.
# Shards made with an hf tokenizer refuse a run left with the byte one, naming it; the hint works.
# Usage: sharded_corpus.sh FSDP_TRAIN FSDP_DATA MPIRUN
set -uo pipefail
train=$1 data=$2 mpirun=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; [ -n "${log:-}" ] && [ -f "$log" ] && sed 's/^/    /' "$log" | tail -30; exit 1; }

python3 - "$work/corpus.jsonl" <<'PY' || fail "cannot write the corpus"
import glob, json, os, sys
with open(sys.argv[1], "w") as out:
    for path in sorted(glob.glob("/usr/share/games/fortunes/*"))[:6]:
        if path.endswith((".dat", ".u8")) or os.path.isdir(path):
            continue
        for text in open(path, "rb").read().decode("utf-8", "replace").split("\n%\n"):
            if text.strip():
                out.write(json.dumps({"text": text}) + "\n")
PY
log="$work/corpus.log"
"$data" corpus --output-dir "$work/corpus" --threads 2 --shard-tokens 20000 --validation-percent 5 "$work/corpus.jsonl" \
  >"$log" 2>&1 || fail "fsdp-data corpus failed"
shards=$(ls "$work/corpus/train" | wc -l)
[ "$shards" -ge 3 ] || fail "expected several train shards, got $shards"
echo "ok   fsdp-data corpus: $(grep -m1 "^/" "$log")"
# The same tokens as one file each (the shards concatenated under one header).
python3 - "$work/corpus" "$work/single" <<'PY' || fail "cannot concatenate the shards"
import glob, os, struct, sys
corpus, single = sys.argv[1:]
os.makedirs(single)
for split in ("train", "validation"):
    header, bodies = None, []
    for path in sorted(glob.glob(f"{corpus}/{split}/shard-*.tok")):
        data = open(path, "rb").read()
        header, bodies = data[:32], bodies + [data[32:]]
    count = sum(len(b) for b in bodies) // struct.unpack("<I", header[12:16])[0]
    with open(f"{single}/{split}.tok", "wb") as f:
        f.write(header[:24] + struct.pack("<Q", count) + b"".join(bodies))
PY

cat >"$work/base.toml" <<TOML
name = "sharded-corpus"
[model]
name = "gpt-test"
[data]
source = "token_files"
[train]
steps = 6
global_batch = 8
seq_len = 64
threads = 1
log_every = 1
[optimizer]
lr = 3e-3
warmup_steps = 2
[eval]
every = 0
batches = 1
sample_tokens = 0
[checkpoint]
every = 3
TOML
run() {  # run NAME TRAIN VALIDATION [flags]
  local name=$1 train_tokens=$2 validation_tokens=$3
  shift 3
  log="$work/$name.log"
  timeout 300 "$mpirun" --oversubscribe --bind-to none -np 2 "$train" "$work/base.toml" --progress lines \
    --set "output_dir=\"$work/$name\"" --set "data.train_tokens=\"$train_tokens\"" \
    --set "data.validation_tokens=\"$validation_tokens\"" "$@" >"$log" 2>&1 || fail "$name did not finish"
}
run sharded "$work/corpus/train" "$work/corpus/validation"
grep -q "($shards shards)" "$log" || fail "the header does not say $shards shards"
run single "$work/single/train.tok" "$work/single/validation.tok"
run resumed "$work/corpus/train/shard-*.tok" "$work/corpus/validation" --resume "$work/sharded/checkpoints/step-00000003"
python3 - "$work" <<'PY' || fail "the runs differ"
import json, sys
work = sys.argv[1]
def steps(name):
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in map(json.loads, open(f"{work}/{name}/metrics.jsonl")) if "loss" in r and "step" in r}
sharded, single, resumed = steps("sharded"), steps("single"), steps("resumed")
if sorted(sharded) != list(range(1, 7)) or sharded != single:
    sys.exit(f"sharded {sharded}\nsingle  {single}")
if sorted(resumed) != [4, 5, 6] or any(resumed[s] != sharded[s] for s in resumed):
    sys.exit(f"resumed {resumed}\nsharded {sharded}")
print(f"ok   6 steps on the shards equal one token file's bitwise (loss {sharded[1][0]:.4f} -> {sharded[6][0]:.4f}); "
      "resumed at step 3 from a glob of the shards, steps 4-6 equal")
PY

# Shards made with a Hugging Face tokenizer say so in their header: a run left with the byte
# tokenizer (data.tokenizer's default, as docs/training.md's recipe once left it) is refused,
# naming the tokenizer; with the settings fsdp-data corpus prints, it trains.
log="$work/tokenizer.log"
"$data" train-tokenizer --output-dir "$work/tok" --vocab-size 400 "$work/corpus.jsonl" >"$log" 2>&1 || fail "train-tokenizer failed"
log="$work/hf-corpus.log"
"$data" corpus --output-dir "$work/hf-corpus" --tokenizer hf --tokenizer-json "$work/tok/tokenizer.json" --threads 2 \
  --shard-tokens 20000 --validation-percent 5 "$work/corpus.jsonl" >"$log" 2>&1 || fail "fsdp-data corpus with the hf tokenizer failed"
hint=$(grep -o "train on it with: .*" "$log" | sed 's/^train on it with: //')
grep -qF -- "--set data.tokenizer='\"hf\"' --set data.tokenizer_json='\"$work/tok/tokenizer.json\"'" <<<"$hint" ||
  fail "fsdp-data corpus's hint leaves out the tokenizer: $hint"
log="$work/wrong-tokenizer.log"
if timeout 300 "$mpirun" --oversubscribe --bind-to none -np 2 "$train" "$work/base.toml" --progress lines \
  --set "output_dir=\"$work/wrong-tokenizer\"" --set "data.train_tokens=\"$work/hf-corpus/train\"" \
  --set "data.validation_tokens=\"$work/hf-corpus/validation\"" >"$log" 2>&1; then
  fail "a run with the byte tokenizer on shards made with an hf one was not refused"
fi
grep -q "were made with the hf tokenizer" "$log" || fail "the refusal does not name the shards' tokenizer"
echo "ok   shards of an hf tokenizer with data.tokenizer left as byte: $(grep -m1 'were made with' "$log" | cut -c1-200)"
log="$work/right-tokenizer.log"
eval "set -- $hint"
timeout 300 "$mpirun" --oversubscribe --bind-to none -np 2 "$train" "$work/base.toml" --progress lines \
  --set "output_dir=\"$work/right-tokenizer\"" --set train.steps=2 "$@" >"$log" 2>&1 ||
  fail "training with the settings fsdp-data corpus printed failed"
echo "ok   with the settings fsdp-data corpus printed, it trains: $(grep -m1 'data: ' "$log" | cut -c1-160)"
