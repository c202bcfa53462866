#!/usr/bin/env python3
"""The run report in a real browser (Debian's headless Chromium, driven by selenium).

1. The main job's config (configs/gpt-fortunes-tiny.toml, 2 ranks), shortened to 30 steps, with
   targets: one it cannot meet (min_tokens_per_second = 1e9), one it misses by step 20
   (max_validation_loss = 0.5) and one it meets (max_memory_per_rank = 64GiB). fsdp-train writes
   report.html as it goes (every 10 steps) and at the end.
2. Chromium opens it: every plot has at least one drawn series, the console shows no errors, the
   screenshot is not blank, and the two missed targets are marked (the targets table and markers
   on the time axis), the met one is not.
3. targets.stop = true: the run stops at the first miss with a checkpoint, exit status 3.
4. Bad input to fsdp-report: a directory without metrics, a truncated last line (a warning, the
   page still written), and an unknown target key (fsdp-train's config error): one line each.

--screenshot PATH keeps the screenshot; --only-screenshot REPORT PNG takes one of any report (the
main job's for docs/report.png: bash scripts/train.sh, then this with runs/gpt-fortunes-tiny/report.html).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

failures = []
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(command, expect=0, timeout=600):
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if expect is not None and result.returncode != expect:
        print(result.stdout[-3000:], result.stderr[-3000:])
        raise SystemExit(f"exit {result.returncode} (expected {expect}): {' '.join(command)}")
    return result


def train(args, out, extra, expect=0):
    command = [args.mpiexec, "--oversubscribe", "--bind-to", "none", "-np", "2", os.path.join(args.build_dir, "apps", "fsdp-train"),
               os.path.join(ROOT, "configs", "gpt-fortunes-tiny.toml"), "--progress", "lines", "--set", f'output_dir="{out}"']
    for s in extra:
        command += ["--set", s]
    return run(command, expect)


def open_in_chromium(path, screenshot):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,900"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
    try:
        driver.get("file://" + os.path.abspath(path))
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1300, min(max(height, 900), 6000))
        plots = driver.find_elements(By.CSS_SELECTOR, "svg.plot")
        drawn = {p.get_attribute("data-plot"): sum(1 for s in p.find_elements(By.CSS_SELECTOR, "path.series")
                                                    if len(s.get_attribute("d") or "") > 10)
                 for p in plots}
        missed = [r.get_attribute("data-target") for r in driver.find_elements(By.CSS_SELECTOR, "tr.target-missed")]
        met = [r.get_attribute("data-target") for r in driver.find_elements(By.CSS_SELECTOR, "tr.target-met")]
        markers = [m.get_attribute("textContent") for m in driver.find_elements(By.CSS_SELECTOR, "line.marker")]
        logs = driver.get_log("browser")
        driver.save_screenshot(screenshot)
        return drawn, missed, met, markers, logs
    finally:
        driver.quit()


def screenshot_is_not_blank(path):
    from PIL import Image

    image = Image.open(path).convert("RGB")
    small = image.resize((image.width // 4, image.height // 4))
    raw = small.tobytes()
    pixels = [raw[i:i + 3] for i in range(0, len(raw), 3)]
    colours = len(set(pixels))
    inked = sum(1 for p in pixels if p[0] + p[1] + p[2] < 600) / len(pixels)
    return colours, inked


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-dir")
    parser.add_argument("--only-screenshot", nargs=2, metavar=("REPORT", "PNG"), help="screenshot a report, nothing else")
    parser.add_argument("--mpiexec", default="mpirun")
    parser.add_argument("--screenshot", default=None, help="keep the screenshot here")
    args = parser.parse_args()
    if args.only_screenshot:
        drawn, _, _, _, logs = open_in_chromium(args.only_screenshot[0], args.only_screenshot[1])
        print(f"{args.only_screenshot[1]}: plots {drawn}, {len(logs)} console messages")
        return 0
    if not args.build_dir:
        parser.error("--build-dir is required")
    with tempfile.TemporaryDirectory(prefix="fsdp_report_") as work:
        out = os.path.join(work, "run")
        targets = ["train.steps=30", "eval.every=10", "checkpoint.every=10", "train.report_every=10", "eval.sample_tokens=0",
                   "targets.min_tokens_per_second=1e9", "targets.max_validation_loss=0.5",
                   "targets.max_validation_loss_step=20", 'targets.max_memory_per_rank="64GiB"']
        log = train(args, out, targets).stdout
        lines = [l for l in log.splitlines() if "target missed" in l]
        check(len(lines) == 2, f"two targets missed, one line each: {lines}")
        report = os.path.join(out, "report.html")
        check(os.path.exists(report), "fsdp-train wrote report.html")
        screenshot = args.screenshot or os.path.join(work, "report.png")
        drawn, missed, met, markers, logs = open_in_chromium(report, screenshot)
        expected_plots = {"loss", "lr", "throughput", "mfu", "memory", "communication", "grad_norm"}
        check(set(drawn) == expected_plots, f"the page has the plots {sorted(drawn)}")
        check(all(n >= 1 for n in drawn.values()), f"every plot has its series drawn: {drawn}")
        check(drawn.get("loss", 0) >= 2 and drawn.get("memory", 0) >= 3,
              "loss has training and validation; memory has both ranks and fsdp-plan's prediction")
        errors = [e for e in logs if e.get("level") in ("SEVERE", "ERROR")]
        check(not errors, f"no console errors ({len(logs)} messages: {[e.get('message') for e in logs][:3]})")
        colours, inked = screenshot_is_not_blank(screenshot)
        check(colours > 20 and inked > 0.01, f"the screenshot is not blank ({colours} colours, {100 * inked:.1f}% inked)")
        check(sorted(missed) == ["max_validation_loss", "min_tokens_per_second"] and met == ["max_memory_per_rank"],
              f"missed targets marked in the table: missed {missed}, met {met}")
        check(sum("target missed" in m for m in markers) >= 2 * len(expected_plots),
              f"missed targets marked on every time axis ({sum('target missed' in m for m in markers)} markers)")
        check(any("checkpoint at step 10" in m for m in markers), "checkpoints marked on the time axis")
        records = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
        check(sum("target_missed" in r for r in records) == 2, "metrics.jsonl records each miss once")

        # targets.stop: the first miss ends the run, with a checkpoint.
        stopped = os.path.join(work, "stopped")
        result = train(args, stopped, targets[:5] + ["targets.min_tokens_per_second=1e9", "targets.stop=true"], expect=3)
        checkpoints = os.listdir(os.path.join(stopped, "checkpoints"))
        check("stopped: target missed at step 5" in result.stderr and checkpoints == ["step-00000005"],
              f"targets.stop ends the run at the first miss (step 5) with a checkpoint {checkpoints}, exit 3")

        # Bad input.
        report_tool = os.path.join(args.build_dir, "apps", "fsdp-report")
        empty = os.path.join(work, "empty")
        os.makedirs(empty)
        result = run([report_tool, empty], expect=1)
        check(result.stderr.count("\n") == 1 and "has no readable metrics.jsonl" in result.stderr,
              f"no metrics: one line: {result.stderr.strip()}")
        with open(os.path.join(out, "metrics.jsonl"), "a") as f:
            f.write('{"step": 31, "loss": 2.')
        result = run([report_tool, out, "-o", os.path.join(work, "again.html")], expect=0)
        check(result.stderr.count("\n") == 1 and "is truncated; left out" in result.stderr and os.path.exists(os.path.join(work, "again.html")),
              f"truncated last line: one warning, page written: {result.stderr.strip()}")
        result = train(args, os.path.join(work, "bad"), ["targets.min_tokens_per_sec=5"], expect=1)
        check("unknown key 'targets.min_tokens_per_sec'" in result.stderr, "unknown target key: fsdp-train names it")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
