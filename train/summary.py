"""``summary.json``: the one-file result of a run that sweep and table scripts read.

Keys (flat; all present, ``null`` where not applicable):

=========================== ================================================================
final_val_loss              token-weighted validation loss at the last step
final_val_ppl               exp(final_val_loss)
steps                       optimizer steps completed
tokens                      non-pad training tokens seen (all ranks)
tokens_per_s                tokens / training time (eval and checkpointing excluded)
optimizer_state_bytes       bytes of optimizer state allocated (``foam.state_bytes``), per replica
peak_memory_bytes           peak over training steps only (set-up, eval and saving excluded):
                            CUDA max allocated on GPU; peak process RSS on CPU (rank 0)
peak_memory_reserved_bytes  the same for CUDA max reserved (null on CPU)
peak_memory_by_phase        {phase: {peak_memory_bytes, ...}} for setup, train, eval, checkpoint
                            (``train.metrics.PhasePeaks``)
mfu                         model FLOPs utilisation of the last logged window (null on CPU/unknown GPU)
wall_time_s                 wall-clock time of the run, summed over resumed segments
git_sha                     commit of the code (suffixed ``-dirty`` with uncommitted changes)
model                       model config name (e.g. llama_350m)
optim                       optim config name (e.g. foam2)
optim_name                  registry name passed to foam.build_optimizer (e.g. foam)
lr, alpha, level            the method's peak lr, alpha and FOAM level (null when it has none)
hparams                     every keyword passed to foam.build_optimizer (a dict)
seed                        trainer.seed
precision                   trainer.precision
world_size                  number of ranks
global_batch_size           sequences per optimizer step
micro_batch_size            sequences per rank per forward
seq_len                     data.seq_len
params_total                parameters of the model
params_folded               parameters in the attention/MLP matrices (the method's share)
data_skipped                documents the data pipeline skipped as malformed (all ranks)
projections                 projections computed per matrix (GaLore/APOLLO refreshes; null otherwise)
eval_history                list of {step, tokens, val_loss, val_ppl}
=========================== ================================================================
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def git_sha() -> str:
    """HEAD of the repository holding this code, or "unknown" outside a git checkout."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


def write_summary(run_dir: Path, summary: dict[str, Any]) -> Path:
    path = Path(run_dir) / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(path)
    return path
