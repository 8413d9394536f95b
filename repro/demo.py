"""`make demo`: pre-train a small LLaMA with FOAM-2 on the embedded offline corpus, on CPU.

Runs the real trainer (`train/pretrain.py`, the same entry point as the GPU runs) for well under
a minute on two cores and prints the validation perplexity, the picture of its curves
(`scripts/plot_runs.py`) and the exported transformers checkpoint. No download: the corpus ships
with Python and the project's SentencePiece tokenizer is trained on it in under a second.

The run reads its training data once: the embedded corpus holds about 98K training tokens with
this tokenizer, and the run packs 360 x 256 = 92K of them into full rows (no padding), so the
validation loss measures what the model learnt, not what it memorised. Extra arguments are passed
on as Hydra overrides, e.g. `scripts/demo.py optim=adamw trainer.max_steps=20`; a
`hydra.run.dir=...` among them moves the run (and the summary the demo reads) there.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_DIR = REPO / "runs" / "demo"
OVERRIDES = [
    "+model=llama_1m",  # 1.3M parameters, 60 % of them in the attention/MLP matrices FOAM folds
    "+optim=foam2",  # the paper's FOAM-2: lr 1e-2, alpha 0.25
    "data=embedded",
    "data.tokenizer=spm",  # the project tokenizer, sized to the model's 2048-entry vocabulary
    "data.spm_vocab_size=2048",
    "data.seq_len=128",
    "data.pack=true",  # every token of a document is used, none is padding
    "trainer=cpu_debug",
    "trainer.max_steps=360",  # x 2 x 128 tokens: one pass over the training split
    "trainer.global_batch_size=2",
    "trainer.micro_batch_size=2",
    "trainer.eval_every=90",
    "trainer.log_every=10",
    "trainer.save_every=0",
    "trainer.resume=none",
    "logger=none",
    f"hydra.run.dir={RUN_DIR}",
]


def shown(path: Path) -> str:
    """A path as the user would type it from the repository."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def run_dir_of(overrides: list[str]) -> Path:
    """Where the run writes: the last ``hydra.run.dir=`` given (Hydra's rule), relative to the
    repository, the trainer's working directory."""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith("hydra.run.dir=")]
    return REPO / given[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="OVERRIDE",
        help="Hydra overrides for train/pretrain.py after the demo's own, e.g. optim=adamw",
    )
    overrides = [*OVERRIDES, *parser.parse_args().overrides]  # a --flag ends here, not in Hydra
    run_dir = run_dir_of(overrides)
    (run_dir / "summary.json").unlink(missing_ok=True)  # never an earlier run's result
    start = time.perf_counter()
    cmd = [sys.executable, str(REPO / "train" / "pretrain.py"), *overrides]
    print("$", " ".join(cmd[1:]), flush=True)
    code = subprocess.call(cmd, cwd=REPO)
    if code:
        return code
    summary = json.loads((run_dir / "summary.json").read_text())
    curves = run_dir / "curves.png"
    plot = [
        sys.executable,
        str(REPO / "scripts" / "plot_runs.py"),
        str(run_dir),
        "--out",
        str(curves),
    ]
    subprocess.run(plot, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    curve = ", ".join(f"{e['step']}: {e['val_ppl']:.1f}" for e in summary["eval_history"])
    print(f"\nvalidation perplexity by step: {curve}")
    print(
        f"final validation perplexity {summary['final_val_ppl']:.2f} "
        f"(loss {summary['final_val_loss']:.4f}) after {summary['steps']} steps / "
        f"{summary['tokens']:,} tokens of {summary['model']} with {summary['optim']}; "
        f"wall time {time.perf_counter() - start:.0f} s; run directory {shown(run_dir)}"
    )
    print(f"curves: {shown(curves)}; transformers checkpoint: {shown(run_dir / 'hf')}")
    return 0
