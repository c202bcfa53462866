#!/usr/bin/env python3
"""A property test of what fsdp.cpp does to a run directory: a random sequence of new runs,
resumes, kills, user copies beside the checkpoints, exports and second jobs on one directory, with
the real programs (gpt-test, 2 ranks). After every operation:
  - every file the user made (copies of checkpoints, notes, an exported model) is intact;
  - the directory's run is the first run's (run.json's id never changes);
  - a resume continues from the newest published checkpoint of that run (checked at each resume:
    the step it says it resumed from equals the newest one on disk).

    user_files_property.py BUILD_DIR MPIRUN [--seed N] [--operations N]
Exit 1 at the first broken property, printing the operations so far (the seed replays them).
"""
import argparse
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

CONFIG = """name = "property"
seed = 3
[model]
name = "gpt-test"
[train]
steps = {steps}
global_batch = 4
seq_len = 16
log_every = 1
report_every = 0
[eval]
every = 0
sample_tokens = 0
[checkpoint]
every = 2
keep = 2
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("mpirun")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("FSDP_PROPERTY_SEED", "1")))
    parser.add_argument("--operations", type=int, default=14)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="fsdp-property-")
    run_dir = os.path.join(work, "run")
    checkpoints = os.path.join(run_dir, "checkpoints")
    train = os.path.join(args.build, "apps", "fsdp-train")
    ckpt = os.path.join(args.build, "apps", "fsdp-ckpt")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", FSDP_RUN_LOCK_WAIT_S="1")
    launcher = [args.mpirun, "--oversubscribe", "--bind-to", "none", "-x", "FSDP_RUN_LOCK_WAIT_S", "-np", "2"]
    user_files = {}  # path -> md5 of what the user made
    history = []
    state = {"run_id": None, "steps": 0}

    def fail(why, output=""):
        print(f"FAIL (seed {args.seed}) after: {' -> '.join(history)}\n  {why}")
        for line in output.splitlines()[-15:]:
            print("    " + line)
        shutil.rmtree(work, ignore_errors=True)
        sys.exit(1)

    def md5(path):
        digest = hashlib.md5()
        for root, _, files in sorted(os.walk(path)) if os.path.isdir(path) else [(os.path.dirname(path), [], [os.path.basename(path)])]:
            for name in sorted(files):
                with open(os.path.join(root, name), "rb") as f:
                    digest.update(name.encode() + f.read())
        return digest.hexdigest()

    def config(steps):
        path = os.path.join(work, f"run-{steps}.toml")
        with open(path, "w") as f:  # output_dir before the first table
            f.write(f'output_dir = "{run_dir}"\n' + CONFIG.format(steps=steps))
        return path

    def published():
        """This run's published checkpoints on disk: step -> path."""
        out = {}
        for path in glob.glob(os.path.join(checkpoints, "step-*")):
            name = os.path.basename(path)
            if not re.fullmatch(r"step-\d{1,18}", name) or not os.path.isfile(os.path.join(path, "manifest.json")):
                continue
            with open(os.path.join(path, "manifest.json")) as f:
                owner = json.load(f).get("run_id", "")
            if owner in ("", state["run_id"]):
                out[int(name[5:])] = path
        return out

    def run(command, timeout=180):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, errors="replace")
        return done.returncode, done.stdout + done.stderr

    def check():
        for path, digest in user_files.items():
            if not os.path.exists(path) or md5(path) != digest:
                fail(f"the user's {path} was changed or removed")
        record = os.path.join(run_dir, "run.json")
        if os.path.exists(record):
            with open(record) as f:
                run_id = json.load(f)["run_id"]
            if state["run_id"] is None:
                state["run_id"] = run_id
            elif run_id != state["run_id"]:
                fail(f"run.json's id changed from {state['run_id']} to {run_id}")

    def op_new_run():
        steps = state["steps"] or 4
        occupied = state["run_id"] is not None or bool(published()) or os.path.exists(os.path.join(run_dir, "metrics.jsonl"))
        code, out = run(launcher + [train, config(steps), "--progress", "lines"])
        if not occupied:
            if code != 0:
                fail(f"the first run failed (exit {code})", out)
            state["steps"] = steps
        elif code != 2 or "holds another run" not in out:
            fail(f"a new run into the run's directory was not refused (exit {code})", out)

    def op_resume():
        if state["run_id"] is None:
            return
        newest = max(published(), default=None)
        steps = state["steps"] + rng.choice([0, 2, 3])
        code, out = run(launcher + [train, config(steps), "--progress", "lines", "--resume", "latest"])
        if newest is not None and newest == steps and code == 0 and "is done" in out:
            return
        if code != 0:
            fail(f"--resume latest failed (exit {code})", out)
        said = re.search(r"resumed from (\S+) at step (\d+)", out)
        if newest is None:
            if said:
                fail("resumed though the run has no checkpoint", out)
        elif not said or int(said.group(2)) != newest:
            fail(f"--resume latest did not take the newest checkpoint, step {newest}", out)
        state["steps"] = steps

    def op_user_copy():
        steps = sorted(published())
        if not steps:
            path = os.path.join(run_dir, "notes.txt")
            os.makedirs(run_dir, exist_ok=True)
            with open(path, "a") as f:
                f.write("a note\n")
        else:
            step = rng.choice(steps)
            suffix = rng.choice(["-best", ".bak", ".partial.mine", "-copy"])
            path = os.path.join(checkpoints, f"step-{step:08d}{suffix}")
            if os.path.exists(path):
                return
            shutil.copytree(published()[step], path)
        user_files[path] = md5(path)

    def op_kill():
        if state["run_id"] is None:
            return
        steps = state["steps"] + 400  # killed long before its end
        log = os.path.join(work, "kill.log")
        with open(log, "w") as out:
            job = subprocess.Popen(launcher + [train, config(steps), "--progress", "lines", "--resume", "latest"], env=env,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        time.sleep(rng.uniform(1.5, 4.0))
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        subprocess.run(["pkill", "-KILL", "-f", f"{train} {work}"], env=env)
        time.sleep(0.3)
        state["steps"] = max([state["steps"]] + list(published()))

    def op_export():
        steps = sorted(published())
        if not steps:
            return
        target = os.path.join(work, "model.safetensors")
        existed = os.path.exists(target)
        code, out = run([ckpt, "export", published()[steps[-1]], "--output", target])
        if existed:
            if code == 0 or "exists" not in out:
                fail("export over the user's model was not refused", out)
        elif code != 0:
            fail(f"export failed (exit {code})", out)
        else:
            user_files[target] = md5(target)  # from now on it is the user's

    def op_second_job():
        if state["run_id"] is None or not published():
            return
        steps = state["steps"] + 40
        log = os.path.join(work, "first.log")
        # The first job pauses 60 s inside its first save (the checkpoint test hook): it holds the
        # directory while the second one starts.
        first_env = dict(env, FSDP_TEST_PAUSE_IN_SAVE_MS="60000")
        with open(log, "w") as out:
            first = subprocess.Popen(launcher[:-2] + ["-x", "FSDP_TEST_PAUSE_IN_SAVE_MS"] + launcher[-2:] +
                                     [train, config(steps), "--progress", "lines", "--resume", "latest"],
                                     env=first_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(600):
            if "pausing" in open(log, errors="replace").read() or first.poll() is not None:
                break
            time.sleep(0.1)
        code, out = run(launcher + [train, config(steps), "--progress", "lines", "--resume", "latest"])
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        subprocess.run(["pkill", "-KILL", "-f", f"{train} {work}"], env=env)
        time.sleep(0.3)
        state["steps"] = max([state["steps"]] + list(published()))
        if "pausing" not in open(log, errors="replace").read():
            fail("the first job never reached its save", open(log, errors="replace").read())
        if code != 2 or "in use by another job" not in out:
            fail(f"a second job on the directory in use was not refused (exit {code})", out)

    operations = {"new run": op_new_run, "resume": op_resume, "user copy": op_user_copy, "kill": op_kill,
                  "export": op_export, "second job": op_second_job}
    names = list(operations)
    weights = [2, 4, 3, 2, 1, 1]
    plan = ["new run"] + rng.choices(names, weights, k=args.operations - 1)
    try:
        for name in plan:
            history.append(name)
            operations[name]()
            check()
    finally:
        subprocess.run(["pkill", "-KILL", "-f", f"{train} {work}"], env=env)
    print(f"ok   {len(plan)} operations (seed {args.seed}): {' -> '.join(plan)}; the user's {len(user_files)} "
          f"file(s) intact, every resume from the run's newest checkpoint")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
