"""Every pre-training experiment of the paper as a list of runs: ``sweep.py --experiment NAME``.

Each experiment expands into ``Run``\\ s: a sweep ``Point`` (model, optim config, lr, alpha, seed,
method directory) plus the Hydra overrides that make the run that experiment's (a sequence length,
a rank, ``trainer.max_steps``, ...). The settings are the paper's: the sizes of its table or
figure, the methods it lists, each method's lr and alpha from its optim config (the paper's
Appendix table, ``paper_lr`` by model; the one home of those numbers), the step counts of
``configs/trainer/paper.yaml`` (the paper's architecture table), 3 seeds where the paper reports
3 runs (Table 2, 60M-350M) and one elsewhere.

Runs live where ``sweep.py`` puts every point, ``ROOT/MODEL/METHOD/lr..._seed...``; a method
directory names what makes the run differ (``foam2_seq512``, ``galore_matched_foam3``), so two
experiments that need the same run (Table 2's FOAM-2 on 130M and the residual figure's) share its
directory and train it once, and ``scripts/make_tables.py`` reads them all.

``--dry-run`` prints each run with its tokens and an estimate of its GPU-hours on an H100 and an
A100: training FLOPs (``models.flops_per_token``, forward + backward, PaLM's count) over the
GPU's dense BF16 peak (``train.metrics.PEAK_BF16_FLOPS``) at a stated MFU; evaluation (10M tokens
forward per eval, about 3 % more at the paper's sizes) and checkpoints are not counted.
"""

from __future__ import annotations

import argparse
import copy
import functools
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

import models
from repro.finetune_grid import listing_lines
from repro.memory_estimator import memory_matched
from repro.methods import (
    ABLATION_PREFIX,
    ABLATIONS,
    CONTROL_LABEL,
    FOLD_LEVEL,
    TABLE2,
    TABLE3,
    Variant,
    label,
    sweeps_alpha,
)
from repro.runs import AS_CONFIGURED, REPO, Point, Shape
from train.metrics import peak_flops_for_name
from train.schema import DataConfig, TrainerConfig, paper_size, register_configs

CONFIGS = REPO / "configs"
PAPER_BATCH: int = TrainerConfig.global_batch_size  # sequences per step, the paper's
PAPER_MICRO_BATCH: int = TrainerConfig.micro_batch_size
PAPER_SEQ_LEN: int = DataConfig.seq_len  # tokens per sequence, the paper's
MFU = 0.35
"""The model FLOPs utilisation the GPU-hour estimates assume (``--mfu``): what a well-fed
DDP run of these sizes reaches in bf16; the smallest models reach less, the largest more."""
GPUS = ("H100", "A100")

THREE_SEEDS = (42, 43, 44)
ONE_SEED = (42,)  # the paper's data seed ("All experiments use a random seed of 42")


@dataclass(frozen=True)
class Run:
    """One training run of an experiment."""

    experiment: str
    variant: Variant
    point: Point
    shape: Shape
    """The run's length and batch where the variant or the experiment changes them."""
    overrides: tuple[str, ...]
    """The variant's and the experiment's overrides, ``shape``'s among them (the sweep adds the
    user's after them)."""

    def resolved(self, user: Shape = AS_CONFIGURED) -> tuple[int, int, int]:
        """Steps, sequences per step and sequence length, with the user's ``Shape`` last."""
        shape = self.shape.then(user)
        return (
            paper_steps(self.point.model) if shape.max_steps is None else shape.max_steps,
            PAPER_BATCH if shape.global_batch_size is None else shape.global_batch_size,
            PAPER_SEQ_LEN if shape.seq_len is None else shape.seq_len,
        )

    def tokens(self, user: Shape = AS_CONFIGURED) -> int:
        """Training tokens: steps x sequences per step x sequence length."""
        steps, batch, seq_len = self.resolved(user)
        return steps * batch * seq_len

    def gpu_hours(self, gpu: str, mfu: float, user: Shape = AS_CONFIGURED) -> float:
        """Estimated GPU-hours on ``gpu`` at ``mfu`` (training FLOPs only)."""
        cfg = models.load_model_config(self.point.model)
        flops = models.flops_per_token(cfg, self.resolved(user)[2]) * self.tokens(user)
        return flops / (peak_flops_for_name(gpu) * mfu) / 3600


@dataclass(frozen=True)
class Experiment:
    name: str
    paper: str
    """The table or figure of the paper it reproduces."""
    models: tuple[str, ...]
    variants: Callable[[str], list[Variant]]
    """The rows or curves, per model (memory-matched ranks depend on it)."""
    seeds: Callable[[str], tuple[int, ...]] = lambda model: ONE_SEED
    overrides: tuple[str, ...] = ()
    shape: Shape = AS_CONFIGURED
    """The length and batch of every run of it, over its variants'."""

    def runs(
        self, models: Sequence[str] | None = None, seeds: Sequence[int] | None = None
    ) -> list[Run]:
        """The runs, on ``models`` instead of the paper's sizes and with ``seeds`` if given; a
        run two variants share (the same directory) is listed once."""
        out: dict[Point, Run] = {}
        for model in models or self.models:
            for variant in self.variants(model):
                for seed in seeds or self.seeds(model):
                    point = Point(
                        model,
                        variant.optim,
                        paper_lr(variant.optim, model) if variant.lr is None else variant.lr,
                        config_alpha(variant.optim) if variant.alpha is None else variant.alpha,
                        seed,
                        variant.name,
                    )
                    shape = variant.shape.then(self.shape)
                    overrides = (*variant.overrides, *self.overrides, *shape.overrides())
                    out.setdefault(point, Run(self.name, variant, point, shape, overrides))
        return list(out.values())


@functools.cache
def composed_config(optim: str) -> DictConfig:
    """The trainer's config with ``optim``, composed as the trainer composes it (its lr an
    interpolation into the paper's table, ``configs/paper_lr/``, through its defaults list). It is
    composed once, on one model: the model's name is all the table's lookup reads, so
    :func:`paper_lr` gives any model its lr by renaming it."""
    from hydra import compose, initialize_config_dir

    from train.config import CONFIG_DIR, options

    if optim not in options("optim"):
        raise ValueError(f"no optim config {optim!r} (configs/optim/)")
    _register_configs_once()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=["+model=llama_60m", f"+optim={optim}"])


@functools.cache
def _register_configs_once() -> None:
    """The schemas and the table's resolver, registered once per process (each registration
    rebuilds every optimizer's schema)."""
    register_configs()


def paper_lr(optim: str, model: str) -> float:
    """The lr ``optim``'s config gives ``model`` (its ``paper_lr`` table, read by
    ``train.schema.paper_value``)."""
    cfg = copy.deepcopy(composed_config(optim))
    cfg.model.name = model
    return float(cfg.optim.lr)


def config_alpha(optim: str) -> float | None:
    """The config's alpha for a method the paper tunes alpha for (passed explicitly, as the
    sweep's grid does, so the run shares the grid point's directory); ``None`` for the others."""
    if not sweeps_alpha(optim):
        return None
    alpha = composed_config(optim).optim.get("alpha")
    return None if alpha is None else float(alpha)


@functools.cache
def paper_steps(model: str) -> int:
    """The paper's optimizer steps for ``model`` (``trainer=paper``; its rule for other sizes)."""
    _register_configs_once()  # the table's resolver
    trainer = OmegaConf.load(CONFIGS / "trainer" / "paper.yaml")
    resolved = OmegaConf.create({"trainer": trainer, "model": {"name": model}})
    return int(resolved.trainer.max_steps)


def is_paper_size(model: str) -> bool:
    """Whether ``model`` is one of the paper's sizes (either family), not a debug size."""
    return paper_size(model) is not None


def methods(*names: str) -> Callable[[str], list[Variant]]:
    """Optim configs as they are, the same for every model."""
    return lambda model: [Variant(name, name, label(name)) for name in names]


LLAMA_SMALL = ("llama_60m", "llama_130m", "llama_350m")
QWEN = ("qwen_60m", "qwen_130m", "qwen_350m")
QWEN_METHODS = (
    "adamw",
    "adam_mini",
    "muon",
    "galore_1_4",
    "apollo_1_4",
    "foam2",
    "apollo_mini",
    "gwt_mini",
    "foam_mini",
)
"""The Qwen table's rows, in its order."""
SEQ_LEN_METHODS = ("adamw", "muon", "adam_mini", "galore_1_4", "apollo_1_4", "foam2")
SEQ_LENS = (512, 1024)
INT8_METHODS = ("adamw8bit", "galore8bit", "foam8bit")
MATCHED_BASELINES = {"galore": "galore_1_4", "apollo": "apollo_1_4", "gwt": "gwt"}
"""The fold-level figure's baselines, by the method ``memory_matched`` sizes, and the optim
config whose lr and alpha they run with."""
OVERTRAIN_STEPS = 300_000  # 39.3B tokens on LLaMA-130M: the paper's ~39B, ~300 tokens/param
OVERTRAIN_METHODS = ("adamw", "galore_1_4", "apollo_1_4", "foam2")
COMBINATION_METHODS = ("adam_mini", "foam_adam_mini", "muon", "foam_muon")
"""The figure "FOAM with Adam-Mini and Muon": each base method and FOAM folded into it."""
COSINE_LEVELS = (2, 3)  # the appendix figure's panels
NO_RESIDUAL = "_no_residual"  # a cosine variant's name suffix: the same method with rho = 0


def seq_len_variants(model: str) -> list[Variant]:
    """The sequence-length table: 131K tokens per batch at every length (the paper's "total
    number of tokens per batch is kept fixed"), micro-batches of 8K tokens as at 256."""
    out = []
    for seq_len in SEQ_LENS:
        factor = seq_len // PAPER_SEQ_LEN
        shape = Shape(seq_len, PAPER_BATCH // factor, PAPER_MICRO_BATCH // factor)
        out += [Variant(f"{m}_seq{seq_len}", m, label(m), shape=shape) for m in SEQ_LEN_METHODS]
    return out


def ablation(name: str) -> Variant:
    """The one of ``methods.ABLATIONS`` (FOAM-2's variants) in the directory ``ablation_NAME``."""
    return next(a for a in ABLATIONS if a.name == ABLATION_PREFIX + name)


def fold_levels() -> list[tuple[int | str, Variant]]:
    """FOAM at each level of the paper's fold-level figure: FOAM-2 (Table 2's row) and the
    ``FOLD_LEVEL`` ablations, by level."""
    levels: list[tuple[int | str, Variant]] = [(2, Variant("foam2", "foam2", label("foam2")))]
    for a in ABLATIONS:
        if a.figure == FOLD_LEVEL:
            level = "mini" if a.optim == "foam_mini" else int(a.optim.removeprefix("foam"))
            levels.append((level, a))
    return sorted(levels, key=lambda item: (isinstance(item[0], str), str(item[0])))


def fold_level_variants(model: str) -> list[Variant]:
    """FOAM-l for each level, and GaLore, APOLLO and GWT each sized to FOAM-l's optimizer state
    on ``model`` (``memory_estimator.memory_matched``); Full-Adam as the reference line."""
    out = [Variant("adamw", "adamw", label("adamw"))]
    for level, foam_variant in fold_levels():
        out.append(foam_variant)
        for method, optim in MATCHED_BASELINES.items():
            knobs = memory_matched(model, method, level)
            overrides = tuple(f"optim.{key}={value}" for key, value in knobs.items())
            text = ", ".join(f"{key} {value}" for key, value in knobs.items())
            out.append(
                Variant(
                    f"{method}_matched_{foam_variant.optim}",
                    optim,
                    f"{method} ({text}) at {label(foam_variant.optim)}'s memory",
                    overrides,
                )
            )
    return out


def residual_variants(model: str) -> list[Variant]:
    """FOAM-2 with and without the residual (the figure's ``RESIDUAL`` ablation rho = 0)."""
    return [Variant("foam2", "foam2", label("foam2")), ablation("foam2_no_residual")]


def cosine_variants(model: str) -> list[Variant]:
    """FOAM-2 and FOAM-3 with and without the residual, and Adam itself (whose own step must
    come out at cosine 1: the metric's check), each logging the cosine with Adam's step."""
    on = ("trainer.log_update_cosine=true",)
    out = [Variant("cosine_adamw", "adamw", label("adamw"), on)]
    for level in COSINE_LEVELS:
        optim = f"foam{level}"
        out.append(Variant(f"cosine_{optim}", optim, f"FOAM-{level}", on))
        out.append(
            Variant(
                f"cosine_{optim}{NO_RESIDUAL}",
                optim,
                f"FOAM-{level} without the residual",
                (*on, "optim.residual=false"),
            )
        )
    return out


ALPHA_FIGURE = (0.25, 0.5, 0.75, 1.0)
"""FOAM-2's alphas in the appendix's alpha figure: the grid the Appendix says it tunes scaling
factors over ({0.25, 0.5, 0.75, 1.0}; the main text's grid leaves out 0.75)."""
ALPHA_MODELS = ("llama_60m", "llama_130m")  # both appendix figures' panels
MODULEWISE_ALPHA = 0.25  # FOAM's alpha, which the module-wise Adam gives its matrices


def alpha_variants(model: str) -> list[Variant]:
    """FOAM-2 at its paper lr at each alpha of the figure (one method directory, the alpha in
    each run's directory name)."""
    return [
        Variant("foam2", "foam2", f"FOAM-2, alpha {alpha:g}", alpha=alpha) for alpha in ALPHA_FIGURE
    ]


def modulewise_adam_variants(model: str) -> list[Variant]:
    """The appendix's figure "Comparing FOAM with Adam employing block-wise learning rates":
    Adam at its own lr (one lr everywhere), Adam with FOAM-2's hyperparameters (lr for the
    embeddings, head and norms, lr x alpha for the attention and MLP matrices) and FOAM-2."""
    return [
        Variant("adamw", "adamw", label("adamw")),
        Variant(
            "adamw", "adamw", CONTROL_LABEL, alpha=MODULEWISE_ALPHA, lr=paper_lr("foam2", model)
        ),
        Variant("foam2", "foam2", label("foam2")),
    ]


GPT2_DEBERTA = ("gpt2_base", "deberta_base")
GPT2_DEBERTA_LRS = (5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2)
GPT2_DEBERTA_METHODS = ("adamw", "galore_1_4", "apollo_1_4", "foam2")
"""The appendix's figure names no methods; these are Table 2's block at a quarter of Adam's
state (and Adam), whose scaling factors the appendix keeps unchanged (each config's alpha)."""
GPT2_DEBERTA_STEPS = 20_000  # "20k iterations, covering 2.6B tokens" (20k x 512 x 256)


def lr_grid_variants(model: str) -> list[Variant]:
    """Each method at each lr of the appendix's grid, one method directory per method."""
    return [
        Variant(m, m, f"{label(m)}, lr {lr:g}", lr=lr)
        for m in GPT2_DEBERTA_METHODS
        for lr in GPT2_DEBERTA_LRS
    ]


def overtrain_variants(model: str) -> list[Variant]:
    return [Variant(f"{m}_overtrain", m, label(m)) for m in OVERTRAIN_METHODS]


def _table2_seeds(model: str) -> tuple[int, ...]:
    return ONE_SEED if model == "llama_1b" else THREE_SEEDS


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            "table2",
            "Table 2: final validation PPL and memory, LLaMA 60M-1.3B",
            (*LLAMA_SMALL, "llama_1b"),
            methods(*(m.name for m in TABLE2)),
            seeds=_table2_seeds,
        ),
        Experiment(
            "table3",
            "Table 3: LLaMA-3B and 7B, PPL over steps, time, tokens/s, memory",
            ("llama_3b", "llama_7b"),
            methods(*TABLE3),
            overrides=("trainer.grad_checkpointing=true",),
        ),
        Experiment(
            "qwen", "Table: final validation PPL of Qwen2.5 60M-350M", QWEN, methods(*QWEN_METHODS)
        ),
        Experiment(
            "seq_len",
            "Table: sequence lengths 512 and 1024 at 131K tokens per batch, LLaMA 60M-350M",
            LLAMA_SMALL,
            seq_len_variants,
        ),
        Experiment(
            "int8",
            "Table: 8-bit optimizer states (8-bit Adam, 8-bit GaLore, 8-bit FOAM-2), PPL and memory",
            LLAMA_SMALL,
            methods(*INT8_METHODS),
        ),
        Experiment(
            "fold_level",
            "Figure: FOAM-l against GaLore, APOLLO and GWT at FOAM-l's memory, LLaMA-130M",
            ("llama_130m",),
            fold_level_variants,
        ),
        Experiment(
            "residual",
            "Figure: validation PPL with and without the residual, LLaMA 60M and 130M",
            ("llama_60m", "llama_130m"),
            residual_variants,
        ),
        Experiment(
            "overtrain",
            "Figure: overtraining LLaMA-130M on 39B tokens (300 tokens per parameter)",
            ("llama_130m",),
            overtrain_variants,
            shape=Shape(max_steps=OVERTRAIN_STEPS),
        ),
        Experiment(
            "combinations",
            "Figure: FOAM inside Adam-mini and Muon against the two as they are, LLaMA-130M",
            ("llama_130m",),
            methods(*COMBINATION_METHODS),
        ),
        Experiment(
            "alpha",
            "Appendix figure: FOAM-2's validation PPL at each alpha, LLaMA 60M and 130M",
            ALPHA_MODELS,
            alpha_variants,
        ),
        Experiment(
            "modulewise_adam",
            "Appendix figure: Adam with FOAM's module-wise lr (matrices at lr x alpha) against "
            "Adam and FOAM-2, LLaMA 60M and 130M",
            ALPHA_MODELS,
            modulewise_adam_variants,
        ),
        Experiment(
            "gpt2_deberta",
            "Appendix figure: pre-training GPT-2-base and DeBERTa-base (masked LM) on C4, "
            "20k steps, lr grid",
            GPT2_DEBERTA,
            lr_grid_variants,
            shape=Shape(max_steps=GPT2_DEBERTA_STEPS),
        ),
        Experiment(
            "cosine",
            "Appendix figure: cosine of FOAM-2/3's update with Adam's, with and without the "
            "residual, per layer (LLaMA-60M; the paper does not name the size)",
            ("llama_60m",),
            cosine_variants,
        ),
    )
}


def listing() -> str:
    """``--list``: each experiment, what it reproduces, and its runs."""
    lines = []
    for e in EXPERIMENTS.values():
        runs = e.runs()
        lines.append(f"{e.name:<15} {len(runs):>3} runs  {e.paper}")
    return "\n".join([*lines, *listing_lines()])


def experiment_runs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[Run]:
    """``sweep.py --experiment``'s runs: on ``--model`` instead of the paper's sizes, with
    ``--seeds``, and only the ``--methods`` (method directories) named, if given."""
    unused = [
        flag for flag, value in GRID_ONLY.items() if getattr(args, value) not in (None, False)
    ]
    if unused:
        parser.error(f"{', '.join(unused)} do(es) not apply to --experiment")
    if args.mfu is not None and not 0 < args.mfu <= 1:
        parser.error(f"--mfu is a fraction of the peak in (0, 1], got {args.mfu}")
    try:
        Shape.of_overrides(args.overrides)
    except ValueError as e:
        parser.error(str(e))
    if args.experiment not in EXPERIMENTS:
        parser.error(f"unknown experiment {args.experiment!r}; known: {', '.join(EXPERIMENTS)}")
    runs = EXPERIMENTS[args.experiment].runs([args.model] if args.model else None, args.seeds)
    if args.methods:
        names = {run.point.name for run in runs}
        unknown = sorted(set(args.methods) - names)
        if unknown:
            parser.error(
                f"--methods {unknown} not in {args.experiment}: {', '.join(sorted(names))}"
            )
        runs = [run for run in runs if run.point.name in args.methods]
    return runs


GRID_ONLY = {
    "--lrs": "lrs",
    "--alphas": "alphas",
    "--config-alpha": "config_alpha",
    "--name": "name",
}
"""The grid sweep's flags, which an experiment (each run at the paper's setting) does not take."""


def plan(runs: Sequence[Run], commands: dict[Path, list[str]], args: argparse.Namespace) -> str:
    """``--dry-run``: each run's tokens, GPU-hours and command (or that it is finished, when
    ``commands`` has none for its directory), then the totals."""
    mfu = args.mfu or MFU
    user = Shape.of_overrides(args.overrides)
    lines = []
    totals = dict.fromkeys(GPUS, 0.0)
    tokens = 0
    for run in runs:
        hours = {gpu: run.gpu_hours(gpu, mfu, user) for gpu in GPUS}
        for gpu in GPUS:
            totals[gpu] += hours[gpu]
        tokens += run.tokens(user)
        cost = ", ".join(f"{hours[gpu]:,.1f} h {gpu}" for gpu in GPUS)
        where = f"{run.point.model}/{run.point.name}/{run.point.run_dir(Path()).name}"
        lines.append(f"# {where}: {run.tokens(user) / 1e9:.2f}B tokens, {cost}")
        command = commands.get(run.point.run_dir(args.root))
        lines.append(shlex.join(command) if command else "#   finished")
    cost = ", ".join(f"{totals[gpu]:,.0f} GPU-hours on {gpu}" for gpu in GPUS)
    lines.append(
        f"# {args.experiment}: {len(runs)} runs, {tokens / 1e9:.1f}B tokens, {cost} (training "
        f"FLOPs at {mfu:.0%} MFU of the dense BF16 peak; finished runs included)"
    )
    return "\n".join(lines)
