"""Pre-train a LLaMA / Qwen / GPT-2 / DeBERTa model on C4 with any optimizer of the project (the paper's protocol).

    torchrun --nproc_per_node 8 train/pretrain.py +model=llama_350m +optim=foam2
    python train/pretrain.py +model=llama_tiny +optim=foam2 trainer=cpu_debug logger=none
    python train/pretrain.py +model=llama_60m +optim=adamw hydra.run.dir=runs/adamw60m   # rerun
        the same command to resume it from its newest checkpoint (trainer.resume=auto)

``train()`` reads top to bottom as the training story; each step it calls lives in a small module
of ``train/`` with its own tests. What a run writes into its run directory: ``config.yaml``
(resolved), ``metrics.jsonl``, ``summary.json`` (schema in ``train/summary.py``),
``checkpoints/step_*`` (contents in ``train/checkpoint.py``), the final model as a transformers
checkpoint in ``hf/`` and, with ``logger=wandb``, ``wandb/``.

Exit status: 0 finished, 1 crash (also, with one line, a collective that a hung or dead rank
left waiting past ``trainer.collective_timeout_s``, and replicas that differ: README "Faults"),
2 config error (a second launch on a live run directory and a resume with no loadable checkpoint
included), 3 divergence, ``train.errors.SAVE_FAILED_EXIT_STATUS`` (74) when a checkpoint could
not be written,
``train.preemption.PREEMPTED_EXIT_STATUS`` when SIGTERM / SIGUSR1 / SIGUSR2 / Ctrl-C stopped the
run after a checkpoint (rerun the same command to resume), and ``ABORTED_EXIT_STATUS`` when a
third Ctrl-C gave up on that checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python train/pretrain.py` anywhere

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError
from torch.optim.lr_scheduler import LambdaLR
from tqdm import tqdm

import foam
import models
from train import distributed as dist
from train import elastic, faults, step_guard
from train.checkpoint import (
    Resumable,
    finish_background_save,
    read_meta,
    restore_first_loadable,
    resume_candidates,
    save_training_state,
)
from train.cli_errors import (
    discard_refused_run_dir,
    exit_config_error,
    run_reporting_config_errors,
    value_error_message,
)
from train.config import (
    build_optimizer,
    check_config,
    optimizer_hparams,
)
from train.data.corpus import describe_source, open_sources_on_ranks
from train.data.fingerprint import check_unchanged, fingerprint
from train.data.loader import TrainLoader, build_train_loader, prove_data
from train.data.tokenizer import Tokenizer, build_tokenizer_on_ranks
from train.data.val_batches import ValBatches, build_val_batches
from train.errors import (
    SAVE_FAILED_EXIT_STATUS,
    CheckpointSaveFailed,
    ConfigError,
    TrainingDiverged,
)
from train.estimate import StepSetup, StepTimeEstimate, estimate_step_time
from train.evaluate import evaluate
from train.export.hf import HF_DIR, export_hf, unsharded_model
from train.loggers import MetricSink
from train.metrics import (
    PhasePeaks,
    bytes_by_dtype,
    format_bytes,
    mfu,
    optimizer_state_tensors,
    peak_flops,
    per_rank_memory_line,
    planned_state_bytes,
)
from train.objective import MaskedTrainLoader, MaskedValBatches, Masking
from train.parallelism import (
    fill_from_rank0,
    parallelize,
)
from train.plan import RunPlan, plan_run
from train.preemption import (
    ABORTED_EXIT_STATUS,
    PREEMPTED_EXIT_STATUS,
    RunPreempted,
    StopAborted,
    StopAndSave,
    install_stop_signals,
    shut_down_keeping_exit_status,
)
from train.replicas import ReplicasDiffer, check_replicas_agree
from train.run_lock import RunLock, release_held
from train.schedule import build_scheduler
from train.schema import Config, TrainerConfig, config_record, register_configs
from train.seeding import seed_everything
from train.state import TrainState
from train.step import LossSum, loss_sum_for, train_step
from train.step_guard import GuardPolicy, StepGuard
from train.step_stats import IntervalStats, StepStats
from train.summary import (
    build_summary,
    throughput,
    throughput_line,
    write_diverged,
    write_summary,
)
from train.update_cosine import track_update_cosine

log = logging.getLogger("train.pretrain")


@dataclass
class Run:
    """What one run is made of, built once by ``build_run``; ``TrainState`` holds what changes."""

    cfg: Config
    """The config, typed and resolved once (``train.config.check_config``)."""
    info: dist.DistInfo
    device: torch.device
    peaks: PhasePeaks
    """Peak memory per phase: setup, train, eval, checkpoint."""
    run_dir: Path
    resume_from: list[Path]
    """The checkpoints the run may go on from, newest first (the first that verifies and loads
    wins; empty: a fresh start), found before the model is built so that no weight is drawn only
    to be overwritten by one."""
    plan: RunPlan
    """Sharded or not, autocast, compiled, the weights' dtype, micro-batches per step: decided
    once, read by everything below."""
    model: torch.nn.Module
    """The bare model (checkpoints, evaluation); ``replica`` is what trains (DDP or the model)."""
    replica: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    tokenizer: Tokenizer
    train_loader: TrainLoader
    val_batches: ValBatches
    test_batches: ValBatches | None
    """The test split's set, scored once at the end (``trainer.test_tokens``; None when 0)."""

    def resumable(self) -> Resumable:
        return Resumable(self.model, self.optimizer, self.scheduler, self.train_loader)

    def flops_per_token(self) -> int:
        return models.flops_per_token(self.cfg.model, self.cfg.data.seq_len)

    def peak_flops(self) -> float | None:
        return peak_flops(self.device, self.plan.matmul_kind)

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16_mixed under DDP or on one rank: fp32 weights under a bf16 autocast (FSDP2 casts
        by itself); pure bf16 and fp32 need none."""
        if self.plan.autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    @functools.cached_property
    def data_fingerprint(self) -> dict:
        """The data this run trains on, kept in each checkpoint (``train/data/fingerprint.py``)."""
        return fingerprint(self.cfg.data)

    @functools.cached_property
    def loss_sum(self) -> LossSum:
        """The training loss, compiled where the decoder layers are (``trainer.compile``)."""
        return loss_sum_for(self.plan.compiled)


def train(cfg: DictConfig) -> dict:
    """One run, start (or resume) to summary; returns the summary."""
    info = dist.env_dist_info()
    state = TrainState(world_size=info.world_size)  # its clock starts now
    config = check_config(cfg, info.world_size)  # typed and resolved once: all below reads it
    faults.check_spec()  # a FOAM_FAULT that does not parse: one line before any step
    run = build_run(config, info)
    resumed = resume(run, state)
    sink = open_sink(run, state, resumed=resumed is not None)
    track_update_cosine(run, state, sink)  # trainer.log_update_cosine: hooks on the optimizer
    try:
        step_time = train_loop(run, state, sink)
        finish_background_save()  # trainer.async_save: the last one still in flight
    except TrainingDiverged as err:
        if info.is_main:
            err = step_guard.repeated(err, run.run_dir, state.step)
            write_diverged(run.run_dir, state.step, str(err))
        raise err from None
    return finish(run, state, sink, step_time)


def open_sink(run: Run, state: TrainState, *, resumed: bool) -> MetricSink:
    """Record the resolved config (``config.yaml``; after the resume, so that a refused one
    rewrites nothing) and open the metric sinks with it."""
    record = config_record(run.cfg)
    if run.info.is_main:
        (run.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(record))
    return MetricSink(
        run.cfg.logger,
        run.run_dir,
        state,
        is_main=run.info.is_main,
        resumed=resumed,
        config=OmegaConf.to_container(record),
    )


def finish(run: Run, state: TrainState, sink: MetricSink, step_time: StepTimeEstimate) -> dict:
    """The end of a run trained to ``max_steps``: the final evaluation (and test), the summary,
    the model exported; returns the summary."""
    final = state.last_eval() or evaluate_and_log(run, state, sink)
    final_test = test_and_log(run, state, sink) if run.test_batches is not None else None
    summary = run_summary(run, state, final, final_test, step_time)
    exported = unsharded_model(run.model, run.cfg.model, sharded=run.plan.sharded)  # collective
    if run.info.is_main:
        write_summary(run.run_dir, summary)
        export_hf(exported, run.tokenizer, run.run_dir / HF_DIR)
        log.info(
            "done: %d steps, %d tokens, val ppl %.2f, %.0f s | %s",
            state.step,
            state.tokens,
            final["val_ppl"],
            summary["wall_time_s"],
            throughput_line(summary),
        )
    sink.close(summary)
    return summary


def resume(run: Run, state: TrainState) -> Path | None:
    """Restore the newest of ``run.resume_from`` that verifies and loads (every rank); returns
    it, or None for a fresh start. ``trainer.resume=auto`` sets a failing one aside and tries the
    next; a resume onto other data than the checkpoint's is refused
    (``trainer.allow_data_change``)."""
    t = run.cfg.trainer

    def same_data(path: Path) -> None:
        if not t.allow_data_change:
            saved = read_meta(path).get("data")
            check_unchanged(saved, run.data_fingerprint, f"the checkpoint {path}")

    path = restore_first_loadable(
        run.resume_from,
        run.resumable(),
        state,
        rank=run.info.rank,
        verify=t.verify_checkpoints,
        set_aside_failures=t.resume == "auto",
        before_load=same_data,
    )
    if path is None:
        return None
    log.info("resumed from %s at step %d (%d tokens)", path, state.step, state.tokens)
    return path


def run_summary(
    run: Run,
    state: TrainState,
    final: dict,
    final_test: dict | None,
    step_time: StepTimeEstimate,
) -> dict:
    """What ``summary.json`` says of a finished run: its config, final numbers, memory, speed and
    which paths the optimizer took."""
    return build_summary(
        run.cfg,
        state,
        final_eval=final,
        final_test=final_test,
        optim_choice=optim_choice(run.cfg),
        hparams=optimizer_hparams(run.cfg.optim),
        optimizer_state_bytes=foam.state_bytes(run.optimizer),
        peak_memory=run.peaks.record(),
        throughput=throughput(
            state,
            flops_per_token=run.flops_per_token(),
            matmul_kind=run.plan.matmul_kind,
            peak_flops=run.peak_flops(),
        ),
        **params_counts(run.model),
        data_skipped=sum(dist.all_gather_object(int(run.train_loader.stats.get("skipped", 0)))),
        projections=foam.projections_computed(run.optimizer),
        foam_steps=foam.steps_run(run.optimizer),
        tokenizer=run.tokenizer.name,
        step_s_estimated=step_time.seconds,
        step_s_measured=step_time.measured,
    )


def build_run(cfg: Config, info: dist.DistInfo) -> Run:
    """Join the other ranks, then build model, optimizer, schedule and data. Rank 0's Hydra run
    directory is everyone's (the others were told not to create one, see distributed.py)."""
    t = cfg.trainer
    device = dist.resolve_device(t.device, info)
    plan = plan_run(t, info.world_size, device)
    dist.init_distributed(
        info,
        device,
        slow_io_timeout=timedelta(seconds=t.slow_io_timeout_s),
        timeout=timedelta(seconds=t.collective_timeout_s),
    )
    peaks = PhasePeaks(device)
    run_dir = Path(dist.broadcast_object(HydraConfig.get().runtime.output_dir))
    resume_from: list[Path] = []
    with dist.failure_stops_every_rank(ConfigError):  # one writer per run directory
        if info.is_main:
            RunLock.acquire(run_dir)  # released at exit
            resume_from = resume_candidates(
                t.resume, run_dir, set_aside_newer=t.resume_set_aside_newer
            )
    resume_from = dist.broadcast_object(resume_from)
    log.info("%s", describe_source(cfg.data))
    log.info(
        "run dir %s | %d rank(s) x %d micro-batch x %d accumulation = %d sequences/step",
        run_dir,
        info.world_size,
        t.micro_batch_size,
        plan.accumulation,
        t.global_batch_size,
    )
    # first: data that cannot train stops the run in seconds
    tokenizer, train_loader, val_batches, test_batches = build_data(cfg, info)
    model, replica, optimizer, scheduler = build_model_and_optimizer(
        cfg, info, device, plan, initialise=not resume_from
    )
    return Run(
        cfg=cfg,
        info=info,
        device=device,
        peaks=peaks,
        run_dir=run_dir,
        resume_from=resume_from,
        plan=plan,
        model=model,
        replica=replica,
        optimizer=optimizer,
        scheduler=scheduler,
        tokenizer=tokenizer,
        train_loader=train_loader,
        val_batches=val_batches,
        test_batches=test_batches,
    )


def build_model_and_optimizer(
    cfg: Config,
    info: dist.DistInfo,
    device: torch.device,
    plan: RunPlan,
    *,
    initialise: bool = True,
) -> tuple[torch.nn.Module, torch.nn.Module, torch.optim.Optimizer, LambdaLR]:
    """Identical seeds give identical replicas or shards of the same model (initialised on the
    CPU, so the same on any device). Pure bf16 (the paper) keeps weights, grads and states in
    bf16; bf16_mixed keeps fp32 weights computed in bf16. Under FSDP2 the optimizer is built on
    the sharded (DTensor) parameters, so a method that cannot update shards is refused here,
    before any compute. ``initialise=False`` (a resumed run) leaves a sharded model's weights
    for the checkpoint to fill, where rank 0 would otherwise build the whole model for nothing;
    an unsharded model is built whole either way."""
    t = cfg.trainer
    seed_everything(t.seed)
    dtype, sharded = plan.param_dtype, plan.sharded
    model = models.build_model(cfg.model, device="meta" if sharded else device, dtype=dtype)
    model.train()
    if t.grad_checkpointing:
        models.enable_gradient_checkpointing(model)
    model.config.use_cache = False
    compiled = plan.compiled
    if compiled:
        log.info(
            "torch.compile of each decoder layer (trainer.compile=%s): the first steps build it",
            "true" if t.compile else "null, on a GPU",
        )
    replica = parallelize(
        model,
        sharded=sharded,
        precision=t.precision,
        device=device,
        world_size=info.world_size,
        optimizer=cfg.optim["name"],
        hparams=optimizer_hparams(cfg.optim),
        compile_layers=compiled,
    )
    if sharded and not initialise:  # the checkpoint about to be loaded holds every weight
        models.allocate_for_loading(model, device=device)
    elif sharded:  # rank 0 alone builds the whole model, the weights a one-rank run starts from
        fill_from_rank0(
            model,
            lambda: models.build_model(cfg.model, dtype=dtype),
            device,
            is_main=info.is_main,
        )
    optimizer = build_optimizer(cfg.optim, model)
    scheduler = build_scheduler(
        optimizer, max_steps=t.max_steps, warmup_ratio=t.warmup_ratio, min_lr_ratio=t.min_lr_ratio
    )
    log_model_and_optimizer(cfg, model, optimizer)
    log.info(
        "memory per rank (%d rank(s), %s): %s",
        info.world_size,
        t.parallelism,
        per_rank_memory_line(model, optimizer),
    )
    return model, replica, optimizer, scheduler


def build_data(
    cfg: Config, info: dist.DistInfo
) -> tuple[Tokenizer, TrainLoader, ValBatches, ValBatches | None]:
    """Each rank reads its own shard of the stream; validation (and test, where asked) is a
    fixed token budget. The source is opened once, here, for the tokenizer and the loaders (the
    hub by rank 0 alone), and proven: usable records before the tokenizer, a full batch and a
    scoreable validation document after it (``train/data/corpus.py``, ``train/data/loader.py``)."""
    t, data = cfg.trainer, cfg.data
    source = open_sources_on_ranks(data, info.is_main)
    tokenizer = build_tokenizer_on_ranks(
        data, cfg.model.vocab_size, source, local_rank=info.local_rank
    )
    ranks = {"rank": info.rank, "world_size": info.world_size, "source": source}
    train_loader = build_train_loader(
        data, tokenizer, micro_batch_size=t.micro_batch_size, seed=t.seed, **ranks
    )
    eval_batch = t.eval_micro_batch_size or t.micro_batch_size
    val_batches = build_val_batches(
        data, tokenizer, micro_batch_size=eval_batch, max_tokens=t.eval_tokens, **ranks
    )
    test_batches = None
    if t.test_tokens:  # every rank opens the same files: a missing split stops them all alike
        test_batches = build_val_batches(
            data,
            tokenizer,
            micro_batch_size=eval_batch,
            max_tokens=t.test_tokens,
            split="test",
            **ranks,
        )
    prove_data(source, tokenizer, train_loader, data)
    masking = Masking.of(cfg.model)
    if masking is not None:  # an encoder: the masked-LM objective (train/objective.py)
        train_loader = MaskedTrainLoader(
            train_loader, masking, seed=t.seed, rank=info.rank, world_size=info.world_size
        )
        val_batches = MaskedValBatches(val_batches, masking)
        if test_batches is not None:
            test_batches = MaskedValBatches(test_batches, masking)
    return tokenizer, train_loader, val_batches, test_batches


def train_loop(run: Run, state: TrainState, sink: MetricSink) -> StepTimeEstimate:
    """Exactly ``max_steps`` optimizer steps (lr is a function of the optimizer step), with
    metrics, evaluations and checkpoints on their schedules; returns the step-time estimate said
    before the first step, with the time measured beside it.

    Each step's numbers stay on the device until the next log, evaluation or save reads them with
    one host sync (which also stops a diverged run; ``train/step_stats.py``). There, too, the
    ranks agree on a stop signal (any rank) or a wall-clock save: a stop ends the loop with a
    checkpoint (``RunPreempted``), at most ``log_every`` steps after the signal arrived."""
    t = run.cfg.trainer
    estimate = estimate_steps(run, state)
    stats, stopper = StepStats(run.device), StopAndSave(t.save_every_minutes, run.device)
    guard = StepGuard(GuardPolicy.of(t), state)
    progress = tqdm(
        total=t.max_steps, initial=state.step, disable=not run.info.is_main, dynamic_ncols=True
    )
    first_interval, stop_signal = True, None
    while state.step < t.max_steps:
        lrs = step_once(run, state, stats, guard)
        progress.update(1)
        due = Due.at(state.step, t)
        if not due.any():
            continue
        interval = stats.read()  # the interval's one host sync
        state.add_interval(
            interval.tokens, interval.token_slots, interval.seconds, steady=not first_interval
        )
        first_interval = False
        if state.step == 1:
            log_first_step_state(run)
        if due.log:
            progress.set_postfix(loss=f"{interval.loss:.4f}", lr=f"{next(iter(lrs.values())):.2e}")
            sink.log(step_record(run, state, interval, lrs))
            estimate.compare(state.step, interval.steps, interval.seconds)
        if due.eval:
            evaluate_and_log(run, state, sink)
        verdict = stopper.poll()  # collective: a stop signal on any rank, a wall-clock save
        if due.save or verdict.save:
            save_checkpoint(run, state, stopper, stopping=verdict.stop_signal is not None)
        stats.restart_clock()  # evaluation, saving and logging are not training time
        if verdict.stop_signal and state.step < t.max_steps:  # at the end, finishing is quicker
            stop_signal = verdict.stop_signal.name
            break
    progress.close()
    run.train_loader.close()  # stop its read-ahead thread
    if stop_signal:
        stop_preempted(state, sink, stop_signal)
    return estimate


def estimate_steps(run: Run, state: TrainState) -> StepTimeEstimate:
    """The time the steps left will take, said before the first (``train/estimate.py``)."""
    return estimate_step_time(
        StepSetup(run.cfg, run.device, run.plan, run.autocast),
        steps=run.cfg.trainer.max_steps - state.step,
        is_main=run.info.is_main,
    )


@dataclass(frozen=True)
class Due:
    """What the step just made is due for: a metrics line, an evaluation, a checkpoint."""

    log: bool
    eval: bool
    save: bool

    @classmethod
    def at(cls, step: int, t: TrainerConfig) -> Due:
        last = step == t.max_steps
        return cls(
            log=step == 1 or last or bool(t.log_every and step % t.log_every == 0),
            eval=last or bool(t.eval_every and step % t.eval_every == 0),
            save=(last and t.save_final) or bool(t.save_every and step % t.save_every == 0),
        )

    def any(self) -> bool:
        return self.log or self.eval or self.save


def step_once(run: Run, state: TrainState, stats: StepStats, guard: StepGuard) -> dict[str, float]:
    """One optimizer step, its numbers left on the device in ``stats``; returns its lrs. The
    guard judges the update before it lands only where its policy asks (``train/step_guard.py``)."""
    run.peaks.enter("train")
    faults.hit("step", step=state.step + 1)  # FOAM_FAULT=step:K@...: a no-op when unset
    result, grad_norm, lrs = train_step(
        run.replica,
        run.optimizer,
        run.scheduler,
        run.train_loader,
        accumulation=run.plan.accumulation,
        device=run.device,
        world_size=run.info.world_size,
        autocast=run.autocast,
        grad_clip=run.cfg.trainer.grad_clip,
        loss_sum=run.loss_sum,
        loss_scale=faults.loss_scale(state.step + 1),
        allows=guard.allows if guard.policy.reads_every_step else None,
    )
    state.step += 1
    stats.add(state.step, result, grad_norm)
    return lrs


def log_first_step_state(run: Run) -> None:
    """After the first step, the optimizer state it allocated beside the planned bytes."""
    if run.info.is_main:
        log.info(
            "optimizer state after the first step, this rank: %s (planned %.2f MiB)",
            format_bytes(bytes_by_dtype(optimizer_state_tensors(run.optimizer))),
            planned_state_bytes(run.optimizer) / 2**20,
        )


def save_checkpoint(
    run: Run, state: TrainState, stopper: StopAndSave, *, stopping: bool = False
) -> None:
    """A checkpoint of the run at this step (every rank), its peak memory as its own phase.

    A save that fails stops the run (``CheckpointSaveFailed``), unless
    ``trainer.continue_after_failed_save`` and the run goes on past it (not a stop's save, not
    the final one): then a warning, and the next save tries again. With ``trainer.async_save``
    the shards are written while training goes on (not a stop's or the final save: the run
    ends after those), and published at the next save or the run's end."""
    t = run.cfg.trainer
    run.peaks.enter("checkpoint")
    stopper.checkpoint_saved()
    check_replicas_agree(run.model, state.step)  # DDP: replicas still bit-identical?
    last = stopping or state.step >= t.max_steps  # the run ends: no later save to retry
    try:
        save_training_state(
            run.run_dir,
            run.resumable(),
            state,
            rank=run.info.rank,
            keep_last=t.keep_last,
            data_fingerprint=run.data_fingerprint if run.info.is_main else None,
            background=t.async_save and not last,
        )
    except CheckpointSaveFailed as err:
        if last or not t.continue_after_failed_save:
            raise
        log.warning("%s; training goes on (trainer.continue_after_failed_save)", err)


def stop_preempted(state: TrainState, sink: MetricSink, stop_signal: str) -> None:
    """End a run that a signal stopped after its checkpoint: say how to resume, and raise."""
    log.warning(
        "%s: stopped after step %d with its checkpoint saved; rerun the same command to "
        "resume (exit status %d)",
        stop_signal,
        state.step,
        PREEMPTED_EXIT_STATUS,
    )
    sink.close(preempted=True)
    raise RunPreempted(f"{stop_signal} at step {state.step}; resume with the same command")


def step_record(
    run: Run, state: TrainState, interval: IntervalStats, lrs: dict[str, float]
) -> dict:
    """One line of ``metrics.jsonl``: the newest step, with the interval's rates."""
    slots_per_s = interval.token_slots / interval.seconds / run.info.world_size
    return {
        "step": state.step,
        "tokens": state.tokens,
        "loss": interval.loss,
        "grad_norm": interval.grad_norm,
        **{f"lr/{name}": lr for name, lr in lrs.items()},
        "step_time_s": interval.seconds / interval.steps,
        "tokens_per_s": interval.tokens / interval.seconds,
        "mfu": mfu(run.flops_per_token(), slots_per_s, run.peak_flops()),
        "optimizer_state_bytes": foam.state_bytes(run.optimizer),
        "skipped_steps": state.skipped_steps,
        **run.peaks.record(),
    }


def evaluate_and_log(run: Run, state: TrainState, sink: MetricSink) -> dict:
    """Validation loss and perplexity at this step, recorded in the history and the metrics."""
    run.peaks.enter("eval")
    faults.hit("eval", step=state.step)
    result = evaluate(
        run.model,
        run.val_batches,
        device=run.device,
        autocast=run.autocast,
        sharded=run.plan.sharded,
    )
    entry = state.record_eval(result)
    sink.log(entry)
    log_evaluation(state.step, "val", result)
    return entry


def test_and_log(run: Run, state: TrainState, sink: MetricSink) -> dict:
    """The test split, once, at the end: numbers no choice was made on (``trainer.test_tokens``)."""
    run.peaks.enter("eval")
    result = evaluate(
        run.model,
        run.test_batches,
        device=run.device,
        autocast=run.autocast,
        sharded=run.plan.sharded,
        split="test",
    )
    sink.log({"step": state.step, "tokens": state.tokens, **result})
    log_evaluation(state.step, "test", result)
    return result


def log_evaluation(step: int, split: str, result: dict) -> None:
    log.info(
        "step %d | %s loss %.4f | %s ppl %.2f (%d tokens; the papers' harness: %.2f)",
        step,
        split,
        result[f"{split}_loss"],
        split,
        result[f"{split}_ppl"],
        result[f"{split}_tokens"],
        result[f"{split}_ppl_paper"],
    )


def log_model_and_optimizer(
    cfg: Config, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    counts = params_counts(model)
    log.info(
        "model %s: %.2fM params (%.2fM in folded matrices) | params: %s | grads: %s",
        cfg.model.name,
        counts["params_total"] / 1e6,
        counts["params_folded"] / 1e6,
        format_bytes(bytes_by_dtype(model.parameters())),
        format_bytes(bytes_by_dtype(p for p in model.parameters() if p.requires_grad)),
    )
    log.info(
        "optimizer %s (%s) %s | planned state: %.2fM elements",
        optim_choice(cfg),
        cfg.optim["name"],
        optimizer_hparams(cfg.optim),
        foam.planned_state_numel(optimizer) / 1e6,
    )


def params_counts(model: torch.nn.Module) -> dict[str, int]:
    counts = models.count_params(model)
    return {"params_total": counts.total, "params_folded": counts.folded}


def optim_choice(cfg: Config) -> str:
    """The optim config the user picked (``foam2``), not only the optimizer it builds (``foam``)."""
    return HydraConfig.get().runtime.choices.get("optim", cfg.optim["name"])


def refuse(message: str) -> NoReturn:
    """A config error met once the run has its directory: rank 0 (the others have none) takes
    the directory back, then the one line and exit status 2."""
    if dist.env_dist_info().rank == 0:
        release_held()  # its run.lock first, so that the directory it made can go
        hydra_cfg = HydraConfig.get()
        discard_refused_run_dir(Path(hydra_cfg.runtime.output_dir), f"{hydra_cfg.job.name}.log")
    exit_config_error(message)


register_configs()
elastic.register_run_stamp()


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    install_stop_signals()  # SIGTERM / SIGUSR1 / SIGUSR2 / Ctrl-C: checkpoint after this step, stop
    try:
        train(cfg)
    except ConfigError as err:
        refuse(str(err))
    except InterpolationResolutionError as err:  # a `${...}` the run resolves (optim.lr=${typo})
        refuse(value_error_message(err))
    except TrainingDiverged as err:
        print(f"\nerror: {err}", file=sys.stderr)  # past the progress bar's line
        sys.exit(3)
    except CheckpointSaveFailed as err:
        print(f"\nerror: {err}", file=sys.stderr)  # past the progress bar's line
        sys.exit(SAVE_FAILED_EXIT_STATUS)
    except RunPreempted as stop:
        print(f"stopped: {stop}", file=sys.stderr)
        sys.exit(PREEMPTED_EXIT_STATUS)
    except StopAborted as abort:
        print(f"stopped: {abort}", file=sys.stderr)
        sys.exit(ABORTED_EXIT_STATUS)
    except ReplicasDiffer as err:
        print(f"\nerror: {err}", file=sys.stderr)
        sys.exit(1)
    except Exception as err:  # a hung or dead peer: one line, not a traceback per rank
        line = dist.collective_failure(err)
        if line is None:
            raise
        print(f"\nerror: {line}", file=sys.stderr)
        sys.exit(1)
    finally:
        shut_down_keeping_exit_status(dist.shutdown)


if __name__ == "__main__":
    try:
        elastic.check_restartable(dist.run_dir_given(sys.argv))
    except ConfigError as err:
        exit_config_error(str(err))
    sys.argv = dist.hydra_argv_for_rank(sys.argv, dist.env_dist_info().rank)
    run_reporting_config_errors(main)  # Hydra's own config errors: one line, exit 2 too
