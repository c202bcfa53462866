#!/usr/bin/env python3
"""Runs the shell commands of the guides (docs/*.md, examples/README.md) as written, made cheap.

    python3 tests/docs/run_guide_commands.py [GUIDE ...] [--budget SECONDS] [--list]

README.md's commands have their own check (run_readme_commands.py, whose `commands` this shares).
Each guide's ```sh blocks run in order from the repository root under bash, so a later command
finds what an earlier one of the same guide made. What is changed, and only that:
  - every path under runs/ becomes runs/guide-check/GUIDE/...: a guide's runs see each other and
    never a user's own runs/ (this check deletes only runs/guide-check, its own, at its start);
  - training (scripts/train.sh, scripts/finetune.sh, fsdp-train, fsdp-run) is cut short, as
    run_readme_commands.py does (2 steps, or up to the last --profile-steps; short evaluations),
    written to the config's own directory under runs/guide-check/GUIDE when the command names
    none (scripts/finetune.sh: FSDP_RUNS_DIR);
  - a checkpoint a guide names by its step (runs/.../checkpoints/step-00000600) is, where that
    step was not reached in the short run, the newest checkpoint there.
Commands that need what this machine lacks (a GPU, Slurm, a second host, a downloaded model) or
that take long by design (benchmarks, builds of other projects, packages) are listed as not run,
by name, with the reason; so are those left when the --budget (seconds, 0: none) is spent.
Exit status 1 if a command fails; its output is shown.
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_readme_commands import NOT_RUN as README_NOT_RUN, ROOT, SHORT, commands  # noqa: E402

CHECK = "runs/guide-check"
NOT_RUN = README_NOT_RUN + [
    (r"\bsrun\b|\bsbatch\b|\bsalloc\b", "needs Slurm"),
    (r"\bip netns\b|\bssh\b|--host(file)?\b|\s-H\s", "needs a second host"),
    (r"cuda|nvidia-smi|nsys\b|FSDP_CUDA", "needs a GPU"),
    (r"~/models|\$HOME/models|FSDP_MODEL_DIR=", "needs a model directory you downloaded"),
    (r"\bcmake\b|build-examples/|\bmake\b", "builds a project (the consumer test builds examples/ against an install)"),
    (r"\bapt(-get)?\b|\bpip\b|\bdpkg\b", "installs packages"),
    (r"\.ci/run", "the CI run itself"),
    (r"bench/|run_bench|_bench\b", "a benchmark: long by design, run by hand (docs/benchmarks.md)"),
    (r"scripts/setup\.sh", "the set-up every check already ran"),
    (r"\bpython3?\b.*tests/|tests/.*\.(py|sh)\b|\bctest\b", "a test: CI runs it as such"),
    (r"\bsudo\b|\bsysctl\b", "changes the host's settings"),
]
NOT_TRAINING = re.compile(r"--help\b|--list-models\b|--list-keys\b|--print-config\b")
TRAINING = re.compile(r"scripts/train\.sh|apps/fsdp-train\b|apps/fsdp-run\b")
OPERATOR = re.compile(r"\s(\|\||&&|\||;|>>|>|2>&1|2>)\s?")


def private_runs(command, guide):
    """runs/X -> runs/guide-check/GUIDE/X, wherever a path starts with runs/; a file a command
    writes by redirection into the current directory (> log.txt) goes there too."""
    command = re.sub(r"(?<![\w./-])runs/", f"{CHECK}/{guide}/", command)
    return re.sub(r"(\s\d?>>?\s*)([\w.-]+)(?=\s|$)", rf"\g<1>{CHECK}/{guide}/\g<2>", command)


def cut_short(command, guide):
    """Training commands get SHORT (before any redirection or pipe) and an output directory of the
    guide's own when they name none."""
    if (not TRAINING.search(command) and "scripts/finetune.sh" not in command) or NOT_TRAINING.search(command):
        return command
    match = OPERATOR.search(command)
    head, tail = (command[:match.start()], command[match.start():]) if match else (command, "")
    head = re.sub(r"\s+#.*$", "", head)
    extra = list(SHORT)
    profiled = re.search(r"--profile-steps\s+\d+:(\d+)", head)
    if profiled:  # the steps a trace was asked for must be run
        extra += ["--set", f"train.steps={max(2, int(profiled.group(1)))}"]
    if TRAINING.search(head) and "--output-dir" not in head:
        config = re.search(r"(\S+\.toml)\b", head)
        name = os.path.splitext(os.path.basename(config.group(1)))[0] if config else "gpt-fortunes-tiny"
        extra += ["--output-dir", f"{CHECK}/{guide}/{name}"]
    prefix = ""
    if "scripts/finetune.sh" in head:  # its runs/ is the guide's, as every other path under runs/
        prefix = f"FSDP_RUNS_DIR={CHECK}/{guide} " + ("FSDP_PRETRAIN_STEPS=4 " if "FSDP_PRETRAIN_STEPS" not in head else "")
    return prefix + head.rstrip() + " " + " ".join(extra) + tail


def reached_checkpoints(command):
    """A checkpoint named by a step the short run did not reach: the newest one in its directory."""
    def newest(match):
        path = match.group(0)
        if os.path.exists(os.path.join(ROOT, path)):
            return path
        found = sorted(p for p in glob.glob(os.path.join(ROOT, os.path.dirname(path), "step-*"))
                       if re.search(r"/step-\d+$", p))
        return os.path.relpath(found[-1], ROOT) if found else path
    return re.sub(rf"{CHECK}/[^\s'\"]*/checkpoints/step-\d+", newest, command)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("guides", nargs="*")
    parser.add_argument("--budget", type=float, default=0, help="seconds of commands to run (0: no limit)")
    parser.add_argument("--list", action="store_true", help="print what would run, run nothing")
    args = parser.parse_args()
    guides = args.guides or sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "examples", "README.md")]
    environment = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if not args.list:
        shutil.rmtree(os.path.join(ROOT, CHECK), ignore_errors=True)  # this check's own runs, from before
    started = time.time()
    ran = failed = 0
    not_run = []
    for path in guides:
        guide = os.path.relpath(path, ROOT)
        name = guide.replace("/", "-").removesuffix(".md")
        for command in commands(path):
            reason = next((why for pattern, why in NOT_RUN if re.search(pattern, command)), None)
            if reason is None and args.budget > 0 and time.time() - started > args.budget:
                reason = f"over this check's budget of {args.budget:.0f} s"
            if reason:
                not_run.append((guide, command, reason))
                continue
            shown = cut_short(private_runs(command, name), name)
            if args.list:
                print(f"would run  [{guide}] {shown}")
                continue
            os.makedirs(os.path.join(ROOT, CHECK, name), exist_ok=True)
            shown = reached_checkpoints(shown)
            start = time.time()
            done = subprocess.run(["bash", "-c", shown], cwd=ROOT, env=environment, capture_output=True, timeout=900)
            ran += 1
            output = (done.stdout + done.stderr).decode("utf-8", errors="replace")
            if done.returncode == 0:
                print(f"ok       [{guide}] {shown} ({time.time() - start:.0f} s)")
            else:
                failed += 1
                print(f"FAIL     [{guide}] {shown} (exit {done.returncode}, {time.time() - start:.0f} s)")
                for line in output.splitlines()[-25:]:
                    print("         | " + line)
    for guide, command, reason in not_run:
        print(f"not run  [{guide}] {command}\n         ({reason})")
    print(f"run_guide_commands: {ran} commands run, {failed} failed, {len(not_run)} not run (listed above)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
