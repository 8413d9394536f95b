"""Pre-train a LLaMA / Qwen model on C4 with any optimizer of the project (the paper's protocol).

    torchrun --nproc_per_node 8 train/pretrain.py +model=llama_350m +optim=foam2
    python train/pretrain.py +model=llama_tiny +optim=foam2 trainer=cpu_debug logger=none
    python train/pretrain.py +model=llama_60m +optim=adamw hydra.run.dir=runs/adamw60m   # rerun
        the same command to resume it from its newest checkpoint (trainer.resume=auto)

The file reads top to bottom as the training story; each step it calls lives in a small module
of ``train/`` with its own tests. What a run writes into its run directory: ``config.yaml``
(resolved), ``metrics.jsonl``, ``summary.json`` (schema in ``train/summary.py``),
``checkpoints/step_*`` and, with ``logger=wandb``, ``wandb/``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python train/pretrain.py` anywhere

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

import foam
import models
from train import distributed as dist
from train.checkpoint import find_resume_checkpoint, load_checkpoint, save_checkpoint
from train.config import (
    ConfigError,
    accumulation_steps,
    build_optimizer,
    check_config,
    optimizer_hparams,
)
from train.data import build_tokenizer, build_train_loader, build_val_batches
from train.evaluate import evaluate
from train.loggers import JsonlWriter, WandbLogger, new_run_id
from train.metrics import (
    bytes_by_dtype,
    format_bytes,
    mfu,
    optimizer_state_tensors,
    peak_flops,
    peak_memory,
)
from train.schedule import build_scheduler
from train.seeding import rng_state, seed_everything, set_rng_state
from train.summary import git_sha, write_summary
from train.trainer import (
    TrainingDiverged,
    accumulate_gradients,
    grad_norm_and_clip,
)

log = logging.getLogger("train.pretrain")
PARAM_DTYPES = {"bf16": torch.bfloat16, "bf16_mixed": torch.float32, "fp32": torch.float32}


def train(cfg: DictConfig) -> dict:
    """One run, start (or resume) to summary; returns the summary."""
    wall_start = time.perf_counter()
    t = cfg.trainer

    # 1. Check the config before anything is built, then join the other ranks. Rank 0's Hydra
    #    run directory is everyone's (the others were told not to create one, see distributed.py).
    info = dist.env_dist_info()
    check_config(cfg, info.world_size)
    accum = accumulation_steps(t.global_batch_size, t.micro_batch_size, info.world_size)
    device = dist.resolve_device(t.device, info)
    dist.init_distributed(info, device)
    run_dir = Path(dist.broadcast_object(HydraConfig.get().runtime.output_dir))
    optim_choice = HydraConfig.get().runtime.choices.get("optim", cfg.optim.name)
    if info.is_main:
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    log.info(
        "run dir %s | %d rank(s) x %d micro-batch x %d accumulation = %d sequences/step",
        run_dir,
        info.world_size,
        t.micro_batch_size,
        accum,
        t.global_batch_size,
    )

    # 2. Model and optimizer: identical seeds give identical replicas. Pure bf16 (the paper) keeps
    #    weights, grads and states in bf16; bf16_mixed keeps fp32 weights under a bf16 autocast.
    seed_everything(t.seed)
    model = models.build_model(cfg.model, device=device, dtype=PARAM_DTYPES[t.precision])
    model.train()
    if t.grad_checkpointing:
        models.enable_gradient_checkpointing(model)
    if t.compile:  # compiles forward in place: parameter names and checkpoints stay the same
        model.compile()
    model.config.use_cache = False
    hparams = optimizer_hparams(cfg.optim)
    optimizer = build_optimizer(cfg.optim, model)
    scheduler = build_scheduler(
        optimizer, max_steps=t.max_steps, warmup_ratio=t.warmup_ratio, min_lr_ratio=t.min_lr_ratio
    )
    ddp_model = model
    if info.enabled:
        ddp_model = DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            forward_sync_buffers=False,  # the only buffers (RoPE) are identical on every rank
        )

    def autocast() -> contextlib.AbstractContextManager:
        if t.precision == "bf16_mixed":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    counts = models.count_params(model)
    params = [p for p in model.parameters() if p.requires_grad]
    log.info(
        "model %s: %.2fM params (%.2fM in folded matrices) | params: %s | grads: %s",
        cfg.model.name,
        counts.total / 1e6,
        counts.folded / 1e6,
        format_bytes(bytes_by_dtype(model.parameters())),
        format_bytes(bytes_by_dtype(params)),
    )
    log.info(
        "optimizer %s (%s) %s | planned state: %.2fM elements",
        optim_choice,
        cfg.optim.name,
        hparams,
        foam.planned_state_numel(optimizer) / 1e6,
    )

    # 3. Data: each rank reads its own shard of the stream; validation is a fixed token budget.
    tokenizer = build_tokenizer(cfg.data, cfg.model.vocab_size)
    train_loader = build_train_loader(
        cfg.data,
        tokenizer,
        micro_batch_size=t.micro_batch_size,
        rank=info.rank,
        world_size=info.world_size,
        seed=t.seed,
    )
    val_batches = build_val_batches(
        cfg.data,
        tokenizer,
        micro_batch_size=t.eval_micro_batch_size or t.micro_batch_size,
        rank=info.rank,
        world_size=info.world_size,
        max_tokens=t.eval_tokens,
    )

    # 4. Resume: model, optimizer, schedule, data position, RNG, counters and the logger's run id.
    step, tokens, train_time, prior_wall, eval_history = 0, 0, 0.0, 0.0, []
    ckpt_path = dist.broadcast_object(find_resume_checkpoint(t.resume, run_dir))
    run_id = None
    if ckpt_path is not None:
        state = load_checkpoint(ckpt_path)
        if state["world_size"] != info.world_size:
            raise ConfigError(
                f"trainer.resume: {ckpt_path} was written by {state['world_size']} "
                f"rank(s), this run has {info.world_size}; the data position is per rank"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        train_loader.load_state_dict(state["data"][info.rank])
        set_rng_state(state["rng"][info.rank])
        step, tokens, train_time = state["step"], state["tokens"], state["train_time_s"]
        prior_wall, eval_history, run_id = (
            state["wall_time_s"],
            state["eval_history"],
            state["run_id"],
        )
        log.info("resumed from %s at step %d (%d tokens)", ckpt_path, step, tokens)
        del state

    # 5. Logging: metrics.jsonl always, wandb when asked; rank 0 only.
    jsonl = wandb = None
    if info.is_main:
        run_id = run_id or new_run_id(run_dir)
        jsonl = JsonlWriter(run_dir, resume_step=step if ckpt_path else None)
        if cfg.logger.name == "wandb":
            wandb = WandbLogger(
                cfg.logger, run_dir, run_id, OmegaConf.to_container(cfg, resolve=True)
            )

    def log_record(record: dict) -> None:
        if info.is_main:
            jsonl.log(record)
            if wandb:
                wandb.log(record)

    def run_eval() -> dict:
        result = evaluate(model, val_batches, device=device, autocast=autocast)
        entry = {
            "step": step,
            "tokens": tokens,
            "val_loss": result["val_loss"],
            "val_ppl": result["val_ppl"],
        }
        if not eval_history or eval_history[-1]["step"] != step:
            eval_history.append(entry)
        log_record({**entry, "val_tokens": result["val_tokens"]})
        log.info(
            "step %d | val loss %.4f | val ppl %.2f (%d tokens)",
            step,
            result["val_loss"],
            result["val_ppl"],
            result["val_tokens"],
        )
        return entry

    def save() -> None:
        data_states = dist.all_gather_object(train_loader.state_dict())
        rngs = dist.all_gather_object(rng_state())
        if info.is_main:
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "data": data_states,
                "rng": rngs,
                "step": step,
                "tokens": tokens,
                "train_time_s": train_time,
                "wall_time_s": prior_wall + time.perf_counter() - wall_start,
                "eval_history": eval_history,
                "run_id": run_id,
                "world_size": info.world_size,
            }
            path = save_checkpoint(
                run_dir,
                step,
                state,
                {"tokens": tokens, "git_sha": git_sha()},
                keep_last=t.keep_last,
            )
            log.info("saved %s", path)
        dist.barrier()

    # 6. Train: exactly max_steps optimizer steps; lr is a function of the optimizer step.
    flops_per_token = models.flops_per_token(cfg.model, cfg.data.seq_len)
    peak = peak_flops(device)
    last_mfu = None
    progress = tqdm(total=t.max_steps, initial=step, disable=not info.is_main, dynamic_ncols=True)
    while step < t.max_steps:
        start = time.perf_counter()
        micro_batches = [next(train_loader) for _ in range(accum)]
        result = accumulate_gradients(
            ddp_model, micro_batches, device=device, world_size=info.world_size, autocast=autocast
        )
        grad_norm = grad_norm_and_clip(params, t.grad_clip)
        if not (math.isfinite(result.loss) and math.isfinite(grad_norm)):
            raise TrainingDiverged(
                f"step {step + 1}: loss {result.loss}, grad norm {grad_norm}; stopped before the "
                "update (nothing of this step was checkpointed)"
            )
        lrs = {g.get("name", str(i)): g["lr"] for i, g in enumerate(optimizer.param_groups)}
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        step, tokens, train_time = step + 1, tokens + result.tokens, train_time + elapsed
        if step == 1 and info.is_main:
            log.info(
                "optimizer state after the first step: %s",
                format_bytes(bytes_by_dtype(optimizer_state_tensors(optimizer))),
            )
        last_mfu = mfu(flops_per_token, result.token_slots / elapsed / info.world_size, peak)
        progress.update(1)
        progress.set_postfix(loss=f"{result.loss:.4f}", lr=f"{next(iter(lrs.values())):.2e}")
        if step == 1 or step == t.max_steps or (t.log_every and step % t.log_every == 0):
            log_record(
                {
                    "step": step,
                    "tokens": tokens,
                    "loss": result.loss,
                    "grad_norm": grad_norm,
                    **{f"lr/{name}": lr for name, lr in lrs.items()},
                    "step_time_s": elapsed,
                    "tokens_per_s": result.tokens / elapsed,
                    "mfu": last_mfu,
                    "optimizer_state_bytes": foam.state_bytes(optimizer),
                    **peak_memory(device),
                }
            )
        if step == t.max_steps or (t.eval_every and step % t.eval_every == 0):
            run_eval()
        if (t.save_every and step % t.save_every == 0) or (step == t.max_steps and t.save_final):
            save()
    progress.close()
    train_loader.close()  # stop its read-ahead thread

    # 7. Final evaluation (already done unless resumed after the end) and the summary.
    final = eval_history[-1] if eval_history and eval_history[-1]["step"] == step else run_eval()
    skipped = sum(dist.all_gather_object(int(train_loader.stats.get("skipped", 0))))
    summary = {
        "final_val_loss": final["val_loss"],
        "final_val_ppl": final["val_ppl"],
        "steps": step,
        "tokens": tokens,
        "tokens_per_s": tokens / train_time if train_time else None,
        "optimizer_state_bytes": foam.state_bytes(optimizer),
        **{"peak_memory_reserved_bytes": None, **peak_memory(device)},
        "mfu": last_mfu,
        "wall_time_s": prior_wall + time.perf_counter() - wall_start,
        "git_sha": git_sha(),
        "model": cfg.model.name,
        "optim": optim_choice,
        "optim_name": cfg.optim.name,
        "lr": hparams.get("lr"),
        "alpha": hparams.get("alpha"),
        "level": hparams.get("level"),
        "hparams": hparams,
        "seed": t.seed,
        "precision": t.precision,
        "world_size": info.world_size,
        "global_batch_size": t.global_batch_size,
        "micro_batch_size": t.micro_batch_size,
        "seq_len": cfg.data.seq_len,
        "params_total": counts.total,
        "params_folded": counts.folded,
        "data_skipped": skipped,
        "eval_history": eval_history,
    }
    if info.is_main:
        write_summary(run_dir, summary)
        jsonl.close()
        if wandb:
            wandb.summary(summary)
            wandb.close()
        log.info(
            "done: %d steps, %d tokens, val ppl %.2f, %.0f s",
            step,
            tokens,
            final["val_ppl"],
            summary["wall_time_s"],
        )
    return summary


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        train(cfg)
    except (ConfigError, TrainingDiverged) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2 if isinstance(err, ConfigError) else 3)
    finally:
        dist.shutdown()


if __name__ == "__main__":
    sys.argv = dist.hydra_argv_for_rank(sys.argv, dist.env_dist_info().rank)
    main()
