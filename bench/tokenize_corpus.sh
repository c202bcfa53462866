#!/usr/bin/env bash
# fsdp-data corpus against Hugging Face tokenizers' encode_batch, side by side in one run: the same
# corpus (about 10 MiB of Debian's fortunes as JSON lines, the collection repeated), the same
# tokenizer.json (Llama 3's, ../shared/data/tokenizers), 1 and 2 threads (RAYON_NUM_THREADS for
# tokenizers), ROUNDS rounds alternating; medians. fsdp-data's time is its whole pass (reading and
# parsing the JSON lines, tokenizing, writing the shards; not loading tokenizer.json); tokenizers'
# is encode_batch alone (the texts already in a Python list). The ids must be equal: fsdp-data's
# shard is every document's ids followed by <|end_of_text|>, in order, checked against
# encode_batch's. Prints a table, writes JSON.
#   bash bench/tokenize_corpus.sh [OUT.json]      (ROUNDS=3 MIB=10)
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_json=${1:-$root_dir/out/bench/tokenize_corpus.json}
rounds=${ROUNDS:-3} mib=${MIB:-10}
tokenizer_json=$(cd "$root_dir/../shared/data/tokenizers/llama3" && pwd)/tokenizer.json
python=$root_dir/.venv/bin/python
[ -x "$python" ] || { echo "tokenize_corpus.sh: needs the peers' venv (bash scripts/test.sh makes it)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out_json")"
"$python" - "$work/corpus.jsonl" "$mib" <<'PY'
import glob, json, os, sys
out, mib = sys.argv[1], float(sys.argv[2])
documents = []
for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if path.endswith((".dat", ".u8")) or os.path.isdir(path):
        continue
    documents += [d for d in open(path, "rb").read().decode("utf-8", "replace").split("\n%\n") if d.strip()]
total = 0
with open(out, "w") as f:
    while total < mib * 2**20:
        for d in documents:
            f.write(json.dumps({"text": d}) + "\n")
            total += len(d.encode())
            if total >= mib * 2**20:
                break
PY
for round in $(seq 1 "$rounds"); do
  for threads in 1 2; do
    rm -rf "$work/ours"
    "$root_dir/build/apps/fsdp-data" corpus --output-dir "$work/ours" --threads "$threads" --validation-percent 0 \
      --tokenizer hf --tokenizer-json "$tokenizer_json" "$work/corpus.jsonl" 2>/dev/null >"$work/ours-$threads-$round.txt"
    RAYON_NUM_THREADS=$threads "$python" - "$work/corpus.jsonl" "$tokenizer_json" "$work/ours/train" \
      "$work/theirs-$threads-$round.json" <<'PY'
import glob, json, sys, time
import numpy as np
from tokenizers import Tokenizer
corpus, tokenizer_json, shards, out = sys.argv[1:]
texts = [json.loads(line)["text"] for line in open(corpus)]
tokenizer = Tokenizer.from_file(tokenizer_json)
start = time.perf_counter()
encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
seconds = time.perf_counter() - start
end = tokenizer.token_to_id("<|end_of_text|>")
expected = np.concatenate([np.append(np.asarray(e.ids, dtype=np.int64), end) for e in encoded])
ours = np.concatenate([np.fromfile(p, dtype=np.uint32, offset=32).astype(np.int64) for p in sorted(glob.glob(shards + "/*.tok"))])
equal = ours.shape == expected.shape and bool((ours == expected).all())
json.dump({"seconds": seconds, "documents": len(texts), "tokens": int(expected.size), "ids_equal": equal}, open(out, "w"))
if not equal:
    sys.exit(f"tokenize_corpus: fsdp-data's ids differ from encode_batch's ({ours.size} against {expected.size} tokens)")
PY
  done
done
python3 - "$work" "$rounds" "$out_json" <<'PY'
import datetime, json, re, statistics, sys
work, rounds, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = {}
for threads in (1, 2):
    ours = [float(re.search(r"in ([0-9.]+) s on", open(f"{work}/ours-{threads}-{r}.txt").read()).group(1)) for r in range(1, rounds + 1)]
    theirs = [json.load(open(f"{work}/theirs-{threads}-{r}.json")) for r in range(1, rounds + 1)]
    rows[threads] = {"fsdp_data_seconds": statistics.median(ours), "fsdp_data_all": ours,
                     "encode_batch_seconds": statistics.median(t["seconds"] for t in theirs),
                     "encode_batch_all": [t["seconds"] for t in theirs], "documents": theirs[0]["documents"],
                     "tokens": theirs[0]["tokens"], "ids_equal": all(t["ids_equal"] for t in theirs)}
    rows[threads]["speedup"] = rows[threads]["encode_batch_seconds"] / rows[threads]["fsdp_data_seconds"]
first = rows[1]
print(f"{first['documents']} documents, {first['tokens']} tokens (with one <|end_of_text|> each), Llama 3 tokenizer; "
      f"medians of {rounds} rounds")
print(f"{'threads':>7} {'fsdp-data corpus':>17} {'encode_batch':>13} {'speed-up':>9} {'ids equal':>10}")
for threads, row in rows.items():
    print(f"{threads:>7} {row['fsdp_data_seconds']:15.2f} s {row['encode_batch_seconds']:11.2f} s {row['speedup']:8.2f}x "
          f"{str(row['ids_equal']):>10}")
json.dump({"date": datetime.date.today().isoformat(), "rounds": rounds, "rows": rows}, open(out, "w"), indent=1)
print(f"wrote {out}")
PY
