"""The step-time estimate against the measured step: the demo's run and llama_2m's (the CPU study's
step), each within 2x of the steady time per step (``train/estimate.py``).

    python scripts/bench_estimate.py            # both cases, a markdown table
    python scripts/bench_estimate.py --cases demo

Each case runs the real trainer until it logs the measured time per step beside its estimate
(the first interval after step 1), then stops it with Ctrl-C (the run saves and exits 75 into a
temporary directory). Steps are timed under whatever else the machine runs: a loaded machine
slows the trial of the estimate and the run alike.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from repro.demo import OVERRIDES as DEMO_OVERRIDES

REPO = Path(__file__).resolve().parents[1]
CASES = {
    "demo": [o for o in DEMO_OVERRIDES if not o.startswith("hydra.run.dir=")],
    "llama_2m": [  # the CPU study's step (scripts/reproduce_cpu.py) on the embedded corpus
        "+model=llama_2m",
        "+optim=foam2",
        "data=embedded",
        "data.tokenizer=spm",
        "data.spm_vocab_size=4096",
        "data.pack=true",
        "data.seq_len=256",
        "trainer=cpu_debug",
        "trainer.max_steps=1000",
        "trainer.global_batch_size=16",
        "trainer.micro_batch_size=16",
        "trainer.log_every=10",
        "trainer.eval_every=0",
        "trainer.save_every=0",
        "trainer.resume=none",
        "logger=none",
    ],
}
ESTIMATE = re.compile(r"estimated time per optimizer step: (.+?) \((.+?)\), \d+ steps")
COMPARED = re.compile(
    r"time per optimizer step: (.+?) measured over steps (\d+-\d+), (.+?) estimated .*; x([\d.]+)\)"
)


def measure(overrides: list[str]) -> dict[str, str]:
    """Run until the comparison line, stop the run, return what the two lines said (or the end
    of its stderr, when it ended before)."""
    with tempfile.TemporaryDirectory() as run_dir, tempfile.TemporaryFile("w+") as errors:
        cmd = [sys.executable, str(REPO / "train/pretrain.py"), *overrides]
        proc = subprocess.Popen(  # stderr (the progress bar) to a file: a full pipe would block
            [*cmd, f"hydra.run.dir={run_dir}"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
        found: dict[str, str] = {}
        for line in proc.stdout:
            if match := ESTIMATE.search(line):
                found.update(estimate=match[1], how=match[2])
            if match := COMPARED.search(line):
                found.update(measured=match[1], steps=match[2], ratio=match[4])
                proc.send_signal(signal.SIGINT)
                break
        proc.communicate(timeout=600)
        errors.seek(0)
        stderr = errors.read().strip()
    found.setdefault("error", stderr.splitlines()[-1] if stderr else "")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    args = parser.parse_args(argv)
    print(
        "| case | estimated s/step | measured s/step | steps | measured / estimated | within 2x |"
    )
    print("|---|---:|---:|---|---:|---|")
    worst = 0.0
    for case in args.cases:
        found = measure(CASES[case])
        if "ratio" not in found:
            print(f"| {case} | the run ended before it logged its step time: {found['error']} |")
            return 1
        ratio = float(found["ratio"])
        worst = max(worst, ratio, 1 / ratio)
        print(
            f"| {case} | {found['estimate']} | {found['measured']} | {found['steps']} | "
            f"{ratio:.2f} | {'yes' if 0.5 <= ratio <= 2 else 'NO'} |"
        )
    return 0 if worst <= 2 else 1
