#!/usr/bin/env bash
# checkpoint.async against synchronous saves, side by side in one run: GPT-2 124M (MODEL) at N = 2
# on this machine, STEPS steps with a checkpoint every EVERY steps, rounds alternating. Per mode:
# the seconds a save held the steps (metrics.jsonl's checkpoint "seconds": the whole save when
# synchronous; the staging copy, and any wait for the write, when async), the median step time of
# steps with a save being written beside them and of steps with none, and the checkpoint size.
# Prints a table, writes JSON.
# The run's last save is left out of "held": the end of the run waits for it, no step does (so STEPS
# is a multiple of EVERY: a save one step before the last would wait for its write). The first
# async save of a run allocates its staging buffers (first-touch page faults); later ones reuse
# them: "held" is given for both.
#   bash bench/async_checkpoint.sh [OUT.json]     (MODEL=gpt2 STEPS=24 EVERY=6 ROUNDS=2)
set -euo pipefail
root_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out_json=${1:-$root_dir/runs/bench/async_checkpoint.json}
model=${MODEL:-gpt2} steps=${STEPS:-24} every=${EVERY:-6} rounds=${ROUNDS:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$(dirname "$out_json")"
cd "$root_dir"
for round in $(seq 1 "$rounds"); do
  for mode in sync async; do
    async=false
    [ "$mode" = async ] && async=true
    mpirun --oversubscribe --bind-to none -np 2 build/apps/fsdp-train configs/gpt-fortunes-tiny.toml \
      --set "model.name=\"$model\"" --set "output_dir=\"$work/$mode-$round\"" --set train.steps="$steps" \
      --set train.global_batch=4 --set train.seq_len=128 --set eval.every=0 --set eval.sample_tokens=0 \
      --set checkpoint.every="$every" --set checkpoint.keep=2 --set checkpoint.async=$async --set train.report_every=0 \
      --progress lines >"$work/$mode-$round.log" 2>&1 || { tail -20 "$work/$mode-$round.log"; exit 1; }
  done
done
python3 - "$work" "$out_json" "$rounds" "$model" "$steps" "$every" <<'PY'
import datetime, glob, json, os, statistics, sys
work, out, rounds, model, steps, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
table = {}
for mode in ("sync", "async"):
    held, held_first, held_later, beside, alone, in_flight = [], [], [], [], [], []
    size = 0
    for r in range(1, rounds + 1):
        records = [json.loads(line) for line in open(f"{work}/{mode}-{r}/metrics.jsonl")]
        steps_ = [x for x in records if "step_seconds" in x][1:]  # the first step warms up
        beside += [x["step_seconds"] for x in steps_ if x.get("save_in_flight")]
        alone += [x["step_seconds"] for x in steps_ if not x.get("save_in_flight")]
        # The run's last save is left out: the end of the run waits for it, but no step does.
        saves = [x for x in records if "checkpoint_step" in x and x["checkpoint_step"] != steps]
        held += [x["seconds"] for x in saves]
        held_first += [x["seconds"] for x in saves[:1]]
        held_later += [x["seconds"] for x in saves[1:]]
        in_flight += [x["in_flight_seconds"] for x in saves if "in_flight_seconds" in x]
        last = sorted(glob.glob(f"{work}/{mode}-{r}/checkpoints/step-*"))[-1]
        size = sum(os.path.getsize(os.path.join(last, f)) for f in os.listdir(last))
    table[mode] = {"held_seconds": statistics.median(held), "held_seconds_all": held,
                   "held_seconds_first": statistics.median(held_first),
                   "held_seconds_later": statistics.median(held_later) if held_later else None,
                   "step_seconds_with_save_in_flight": statistics.median(beside) if beside else None,
                   "step_seconds_without": statistics.median(alone),
                   "in_flight_seconds": statistics.median(in_flight) if in_flight else None, "checkpoint_bytes": size}
print(f"{model} at N = 2, {steps} steps, a checkpoint every {every}, {rounds} rounds (medians); checkpoint "
      f"{table['sync']['checkpoint_bytes'] / 2**20:.0f} MiB")
print(f"{'mode':6} {'held, all saves':>16} {'first save':>11} {'later saves':>12} {'step, save beside':>18} {'step, none':>11} "
      f"{'save in flight':>15}")
for mode, row in table.items():
    beside = row["step_seconds_with_save_in_flight"]
    flight = row["in_flight_seconds"]
    later = row["held_seconds_later"]
    print(f"{mode:6} {row['held_seconds']:14.3f} s {row['held_seconds_first']:9.3f} s {later if later else float('nan'):10.3f} s "
          f"{beside if beside else float('nan'):16.3f} s {row['step_seconds_without']:9.3f} s {flight if flight else float('nan'):13.2f} s")
held_ratio = table["async"]["held_seconds"] / table["sync"]["held_seconds"]
later = table["async"]["held_seconds_later"]
held_ratio_later = later / table["sync"]["held_seconds"] if later else None
if held_ratio_later:
    print(f"async saves after the first (staging buffers reused) / sync: {held_ratio_later:.3f}x")
beside = table["async"]["step_seconds_with_save_in_flight"]
throughput_ratio = table["async"]["step_seconds_without"] / beside if beside else None
print(f"async / sync time held per save: {held_ratio:.3f}x; throughput of steps beside a write / without: "
      f"{throughput_ratio:.2f}x" if throughput_ratio else "no step ran beside a write")
json.dump({"date": datetime.date.today().isoformat(), "model": model, "steps": steps, "every": every, "rounds": rounds,
           "modes": table, "held_ratio": held_ratio, "held_ratio_later": held_ratio_later, "throughput_ratio": throughput_ratio}, open(out, "w"), indent=1)
print(f"wrote {out}")
PY
