#!/usr/bin/env python3
"""Runs the commands of README.md's ```sh blocks as written, made cheap where they train.

    python3 tests/docs/run_readme_commands.py [--readme README.md] [--list]

Each command (a line, with its backslash continuations; comments dropped) runs from the
repository root under bash, in the README's order, so that a later command finds what an earlier
one made. Training is cut short, never changed otherwise: scripts/train.sh and fsdp-train get
--set train.steps=2 (evaluation at the ends only and short, 8 sampled tokens, output under
runs/readme-check/NNN, one directory a command, made anew each time),
scripts/finetune.sh also FSDP_PRETRAIN_STEPS=4. Commands that are the test run itself
(scripts/test.sh) or take long by design (benchmarks, GPU checks, packages) are listed as not run,
each with the reason. Exit status 1 if any command fails; the failing command's output is shown.
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHECK_RUNS = "runs/readme-check"
SHORT = ["--set", "train.steps=2", "--set", "eval.every=0", "--set", "eval.batches=1", "--set", "eval.max_items=200",
         "--set", "eval.sample_tokens=8", "--set", "train.log_every=1"]
NOT_RUN = [
    (r"scripts/test\.sh", "the test command itself (this check runs inside it)"),
    (r"^bench/|/bench/", "a benchmark: long by design, run by hand (docs/benchmarks.md)"),
    (r"scripts/gpu-", "needs a GPU machine"),
    (r"scripts/(make-deb|test-deb|test-oldest-torch)\.sh", "builds a package or another libtorch: long by design"),
]


def commands(readme):
    """The commands of the ```sh blocks, continuation lines joined."""
    out, block, pending = [], False, ""
    for line in open(readme, encoding="utf-8"):
        stripped = line.rstrip("\n")
        if stripped.startswith("```"):
            block = stripped.strip() in ("```sh", "```bash") if not block else False
            continue
        if not block:
            continue
        if stripped.rstrip().endswith("\\"):
            pending += stripped.rstrip()[:-1] + " "
            continue
        text = (pending + stripped).strip()
        pending = ""
        if text and not text.startswith("#"):
            out.append(text)
    return out


def made_cheap(command, index):
    """The command as it runs here: tokens (comments dropped), with training cut short, each
    training command into a directory of its own (fsdp-train refuses one holding another run)."""
    tokens = shlex.split(command, comments=True)
    env = {}
    while tokens and re.match(r"^[A-Z_][A-Z0-9_]*=", tokens[0]):
        key, value = tokens.pop(0).split("=", 1)
        env[key] = value
    joined = " ".join(tokens)
    if "scripts/train.sh" in joined or "apps/fsdp-train" in joined:
        if "--output-dir" in tokens:
            at = tokens.index("--output-dir") + 1
            tokens[at] = f"{CHECK_RUNS}/{index:03d}-{os.path.basename(tokens[at].rstrip('/'))}"
        else:
            tokens += ["--set", f'output_dir="{CHECK_RUNS}/{index:03d}"']
        tokens += SHORT
    if "scripts/finetune.sh" in joined:
        env.setdefault("FSDP_PRETRAIN_STEPS", "4")
        tokens += SHORT
    return env, tokens


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    parser.add_argument("--list", action="store_true", help="print what would run, run nothing")
    args = parser.parse_args()
    environment = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    ran = failed = 0
    if not args.list:
        shutil.rmtree(os.path.join(ROOT, CHECK_RUNS), ignore_errors=True)  # this check's own runs, from before
    for index, command in enumerate(commands(args.readme)):
        reason = next((why for pattern, why in NOT_RUN if re.search(pattern, command)), None)
        if reason:
            print(f"not run  {command}\n         ({reason})")
            continue
        env, tokens = made_cheap(command, index)
        shown = " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + shlex.join(tokens)
        if args.list:
            print(f"would run  {shown}")
            continue
        start = time.time()
        done = subprocess.run(["bash", "-c", shlex.join(tokens)], cwd=ROOT, env=dict(environment, **env),
                              capture_output=True, timeout=1200)
        ran += 1
        seconds = time.time() - start
        # What a command prints must be text a terminal can show: a sample cut mid-character once
        # printed raw bytes (decoders now give U+FFFD, as Hugging Face's do).
        not_utf8 = []
        for stream in (done.stdout, done.stderr):
            try:
                stream.decode("utf-8")
            except UnicodeDecodeError as error:
                not_utf8.append(f"printed bytes that are not UTF-8: {error}")
        done.stdout, done.stderr = (s.decode("utf-8", errors="replace") for s in (done.stdout, done.stderr))
        if done.returncode == 0 and not not_utf8:
            print(f"ok       {shown} ({seconds:.0f} s)")
        else:
            failed += 1
            print(f"FAIL     {shown} (exit {done.returncode}, {seconds:.0f} s)")
            for line in not_utf8 + (done.stdout + done.stderr).splitlines()[-25:]:
                print("         | " + line)
    if not args.list:
        print(f"run_readme_commands: {ran} commands run, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
