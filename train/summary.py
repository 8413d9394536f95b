"""``summary.json``: the one-file result of a run that sweep and table scripts read.

Keys (flat; all present, ``null`` where not applicable), as ``build_summary`` writes them:

=========================== ================================================================
final_val_loss              token-weighted validation loss at the last step
final_val_ppl               exp(final_val_loss)
final_val_ppl_paper         the GaLore/APOLLO/FOAM harnesses' figure on the same batches: mean of
                            per-batch mean losses over (n + 1) per rank, averaged over ranks
                            (``train/evaluate.py``); beside the papers' tables, not for readings
final_test_loss             token-weighted loss on the test split at the last step
                            (``trainer.test_tokens`` > 0; null otherwise)
final_test_ppl              exp(final_test_loss)
final_test_ppl_paper        the harnesses' figure on the test batches
test_tokens                 target tokens the test figures are over
steps                       optimizer steps completed
tokens                      non-pad training tokens seen (all ranks)
tokens_per_s                tokens / training time (eval and checkpointing excluded)
tokens_per_s_steady         the same without each segment's first logged interval (kernel builds,
                            compilation, warm-up): the rate a longer run approaches
optimizer_state_bytes       bytes of optimizer state allocated (``foam.state_bytes``) on rank 0
                            (its shard under fsdp)
peak_memory_bytes           peak over training steps only (set-up, eval and saving excluded):
                            CUDA max allocated on GPU; peak process RSS on CPU (rank 0)
peak_memory_reserved_bytes  the same for CUDA max reserved (null on CPU)
peak_memory_by_phase        {phase: {peak_memory_bytes, ...}} for setup, train, eval, checkpoint
                            (``train.metrics.PhasePeaks``)
mfu                         model FLOPs utilisation over the training time, against the device's
                            dense peak for the run's matmuls (``train.metrics.matmul_kind``: bf16,
                            tf32 or fp32); null on CPU or an unknown GPU
mfu_steady                  the same over the steady intervals (as ``tokens_per_s_steady``)
matmul_kind                 bf16, tf32 or fp32: which of the device's peaks ``mfu`` is scored against
peak_flops                  that peak in FLOP/s (null where ``mfu`` is)
wall_time_s                 wall-clock time of the run, summed over resumed segments
step_s_estimated            seconds per optimizer step said before the first step (this segment's;
                            ``train/estimate.py``)
step_s_measured             seconds per step over its first logged interval past step 1 (null
                            when the segment logged none)
git_sha                     commit of the code (suffixed ``-dirty`` with uncommitted changes)
environment                 what the numbers also depend on (``environment()``): torch version,
                            CPU (name, family, model, stepping), the CPU kernels' instruction
                            set, intra-op threads, GPU name; of the segment that finished the run
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
tokenizer                   the tokenizer's name; the project SentencePiece's carries a hash of its
                            training text and sentencepiece version, so it tells corpora apart
params_total                parameters of the model
params_folded               parameters in the attention/MLP matrices (the method's share)
data_skipped                documents the data pipeline skipped as malformed (all ranks)
projections                 projections computed per matrix (GaLore/APOLLO refreshes; null otherwise)
foam_steps                  {group: "cpp" | "triton" | "eager"}: which step each FOAM group's
                            folded matrices ran (``foam.steps_run``; empty for other methods)
eval_history                list of {step, tokens, val_loss, val_ppl, val_tokens, val_loss_paper,
                            val_ppl_paper} (the last three absent in runs from before they were)
=========================== ================================================================

A run that diverges writes ``diverged.json`` instead (``write_diverged``: stopped_at_step, error,
git_sha).
"""

from __future__ import annotations

import json
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

from train.metrics import mfu
from train.schema import Config
from train.state import TrainState

REPO_ROOT = Path(__file__).resolve().parents[1]
SUMMARY_FILE = "summary.json"
DIVERGED_FILE = "diverged.json"  # instead of summary.json when the run diverged (write_diverged)


def uncommitted_changes(repo: Path = REPO_ROOT) -> str:
    """``git status`` of the tracked files that differ from HEAD (empty when the tree is clean)."""
    return subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def git_sha() -> str:
    """HEAD of the repository holding this code (``-dirty`` with uncommitted changes to tracked
    files), or "unknown" outside a git checkout."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = uncommitted_changes()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}-dirty" if dirty else sha


CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = CPUINFO) -> str:
    """The CPU's model name with its family, model and stepping where ``cpuinfo`` (Linux) has
    them, else ``platform.processor()``: a virtual machine's name can be as bare as "AMD EPYC",
    which two CPU generations that round differently share."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        text = ""
    first_cpu = text.split("\n\n", 1)[0]
    fields = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in first_cpu.splitlines())
    )
    name = fields.get("model name") or platform.processor() or "unknown"
    numbers = [
        f"{key} {fields[key]}" for key in ("cpu family", "model", "stepping") if key in fields
    ]
    return f"{name} ({', '.join(numbers)})" if numbers else name


def environment() -> dict[str, Any]:
    """What a run's numbers depend on beyond its code and config: two runs of one commit agree to
    the last bit only with the same torch build, kernels (the instruction set torch's CPU kernels
    were dispatched for: AVX2 and AVX512 round differently), CPU and thread count. One run repeats
    bit for bit on one machine and not on another (``results/repro/PROTOCOL.md``, v4 "Repeat note,
    traced")."""
    return {
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def build_summary(
    cfg: Config,
    state: TrainState,
    *,
    final_eval: dict[str, Any],
    final_test: dict[str, Any] | None,
    optim_choice: str,
    hparams: dict[str, Any],
    optimizer_state_bytes: int,
    peak_memory: dict[str, int],
    throughput: dict[str, Any],
    params_total: int,
    params_folded: int,
    data_skipped: int,
    projections: int | None,
    foam_steps: dict[str, str],
    tokenizer: str,
    step_s_estimated: float,
    step_s_measured: float | None,
) -> dict[str, Any]:
    """The summary of a finished run (the schema above); ``throughput`` is ``throughput()``'s."""
    return {
        "final_val_loss": final_eval["val_loss"],
        "final_val_ppl": final_eval["val_ppl"],
        "final_val_ppl_paper": final_eval.get("val_ppl_paper"),
        "final_test_loss": (final_test or {}).get("test_loss"),
        "final_test_ppl": (final_test or {}).get("test_ppl"),
        "final_test_ppl_paper": (final_test or {}).get("test_ppl_paper"),
        "test_tokens": (final_test or {}).get("test_tokens"),
        "steps": state.step,
        "tokens": state.tokens,
        "optimizer_state_bytes": optimizer_state_bytes,
        **{"peak_memory_reserved_bytes": None, **peak_memory},
        **throughput,
        "wall_time_s": state.wall_time(),
        "step_s_estimated": step_s_estimated,
        "step_s_measured": step_s_measured,
        "git_sha": git_sha(),
        "environment": environment(),
        "model": cfg.model.name,
        "optim": optim_choice,
        "optim_name": cfg.optim["name"],
        "lr": hparams.get("lr"),
        "alpha": hparams.get("alpha"),
        "level": hparams.get("level"),
        "hparams": hparams,
        "seed": cfg.trainer.seed,
        "precision": cfg.trainer.precision,
        "world_size": state.world_size,
        "global_batch_size": cfg.trainer.global_batch_size,
        "micro_batch_size": cfg.trainer.micro_batch_size,
        "seq_len": cfg.data.seq_len,
        "tokenizer": tokenizer,
        "params_total": params_total,
        "params_folded": params_folded,
        "data_skipped": data_skipped,
        "projections": projections,
        "foam_steps": foam_steps,
        "eval_history": state.eval_history,
    }


def throughput(
    state: TrainState, *, flops_per_token: int, matmul_kind: str, peak_flops: float | None
) -> dict[str, Any]:
    """``tokens_per_s`` and ``mfu`` over the whole training time and over the steady intervals,
    with the peak MFU is scored against (``peak_flops`` per device, for ``matmul_kind``)."""

    def rates(tokens: int, slots: int, seconds: float) -> tuple[float | None, float | None]:
        if not seconds:
            return None, None
        per_device = slots / seconds / state.world_size
        return tokens / seconds, mfu(flops_per_token, per_device, peak_flops)

    tokens_per_s, overall_mfu = rates(state.tokens, state.token_slots, state.train_time_s)
    steady_tokens_per_s, steady_mfu = rates(
        state.steady_tokens, state.steady_token_slots, state.steady_time_s
    )
    return {
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_steady": steady_tokens_per_s,
        "mfu": overall_mfu,
        "mfu_steady": steady_mfu,
        "matmul_kind": matmul_kind,
        "peak_flops": peak_flops,
    }


def throughput_line(summary: dict[str, Any]) -> str:
    """``throughput()``'s figures in one log line: overall, then steady."""

    def fmt(tokens_per_s: float | None, utilisation: float | None) -> str:
        if tokens_per_s is None:
            return "n/a"
        return f"{tokens_per_s:.0f} tokens/s" + (
            "" if utilisation is None else f", MFU {utilisation:.1%}"
        )

    overall = fmt(summary["tokens_per_s"], summary["mfu"])
    steady = fmt(summary["tokens_per_s_steady"], summary["mfu_steady"])
    return f"overall {overall}; steady (after the first interval) {steady}"


def write_summary(run_dir: Path, summary: dict[str, Any]) -> Path:
    return _write_json(Path(run_dir) / SUMMARY_FILE, summary)


def write_diverged(run_dir: Path, step: int, error: str) -> Path:
    """``DIVERGED_FILE``: the run stopped on a non-finite loss or gradient norm. Drivers count it
    as finished and infinitely bad: resumed, it would only diverge again from its last checkpoint,
    and under torchrun its exit status 3 reaches them as torchrun's 1."""
    return _write_json(
        Path(run_dir) / DIVERGED_FILE,
        {"stopped_at_step": step, "error": error, "git_sha": git_sha()},
    )


def finished_records(root: Path) -> list[Path]:
    """Every run under ``root`` that is done: its ``SUMMARY_FILE`` or its ``DIVERGED_FILE``."""
    return sorted([*Path(root).rglob(SUMMARY_FILE), *Path(root).rglob(DIVERGED_FILE)])


def _write_json(path: Path, record: dict[str, Any]) -> Path:
    """Written whole or not at all: a reader never sees half a file."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(path)
    return path
