"""The typed shape of a run's config: one dataclass per Hydra group, registered in the ConfigStore.

``configs/config.yaml`` lists ``config_schema`` first in its defaults, so every group it composes
(``model``, ``data``, ``trainer``, ``logger``) is merged into its dataclass: a key the dataclass
does not have, a value of the wrong type, or a choice outside its enum (``Precision``, ...), is
refused by Hydra at compose time with the key's name. The enums are ``StrEnum``: a member equals
and prints as its string, so code and records compare and write ``"bf16"`` as before. The dataclasses hold the defaults; a YAML option states only what makes it that option.

Optim configs are checked against the optimizer itself: each registered optimizer gets a schema
``optim_schema/<name>`` generated from ``foam.available_optimizers()`` (its keywords and their
defaults, which come from the optimizer's constructor), and each ``configs/optim/*.yaml`` extends
the schema of its optimizer through its own defaults list (``/optim_schema/<name>@_here_``). The
optimizer stays the one place where its defaults and its rules on values live. The schemas sit in
a group of their own, not in ``optim``, so ``+optim=`` offers only the YAML options: a bare schema
is no method (it has no paper lr table), and selecting ``optim_schema`` itself is refused by
``Config``, which has no such key.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

import foam
from foam.schedule import MIN_LR_RATIO, WARMUP_RATIO
from models import ModelConfig
from train.distributed import COLLECTIVE_TIMEOUT, SLOW_IO_TIMEOUT

# Keys of an optim config that describe it rather than being optimizer keywords.
DESCRIPTIVE_OPTIM_KEYS = ("name", "paper_lr")
# The ConfigStore group of the optimizer schemas (outside ``optim``: not a choice of ``+optim=``).
OPTIM_SCHEMA_GROUP = "optim_schema"
PROTOCOL_SEED = 42
"""The paper's seed ("All experiments use a random seed of 42"): the default of the run's and the
training stream's seeds, and always the validation set's order, so runs score the same documents."""


class Precision(StrEnum):
    """``trainer.precision``: what the weights, gradients and states are held and computed in."""

    bf16 = "bf16"
    bf16_mixed = "bf16_mixed"
    fp32 = "fp32"


class Parallelism(StrEnum):
    """``trainer.parallelism``: how the model is spread over ranks (``train/parallelism.py``)."""

    ddp = "ddp"
    fsdp = "fsdp"


class OnNonFinite(StrEnum):
    """``trainer.on_nonfinite``: what a non-finite loss or gradient norm does."""

    stop = "stop"
    skip = "skip"


class OnSpike(StrEnum):
    """``trainer.on_spike``: what a loss or gradient norm beyond ``spike_sigma`` does."""

    allow = "allow"
    skip = "skip"


class LoggerName(StrEnum):
    """``logger.name``: the metric sink besides ``metrics.jsonl``."""

    wandb = "wandb"
    none = "none"


class WandbMode(StrEnum):
    """``logger.mode``: wandb's own modes, and ``auto`` (online when logged in, else offline)."""

    auto = "auto"
    online = "online"
    offline = "offline"
    disabled = "disabled"


@dataclass
class DataConfig:
    """Where documents come from and how they become batches (``train/data/corpus.py``, ``train/data/loader.py``,
    ``train/data/tokenizer.py``). The defaults are the benchmark protocol's."""

    name: str = MISSING
    """c4 (the hub stream), local (files under ``path``) or embedded (offline corpus)."""
    path: str | None = None
    """data=local: a folder (a C4 mirror, or jsonl / json / txt / parquet files) or one file."""
    hub_name: str = "allenai/c4"
    hub_config: str = "en"
    seq_len: int = 256
    pack: bool = False
    """true: concatenate documents into full rows (no padding); false: truncate and pad each."""
    tokenizer: str = "t5-base"
    """A hub name, a local path (an HF folder or a ``.model`` file), or ``spm``."""
    tokenizer_fallback: bool = True
    """Train the project's SentencePiece model when the tokenizer cannot be loaded."""
    tokenizer_cache_dir: str | None = None
    """Null: ``$FOAM_CACHE_DIR`` or ``~/.cache/foam``."""
    spm_vocab_size: int = 8192
    """Pieces of the project's SentencePiece model (capped by the model's vocabulary)."""
    allow_small_tokenizer: bool = False
    """Train with a tokenizer of less than half the model's vocabulary (``train/data/tokenizer.py``)."""
    val_fraction: float | None = None
    """Records held out for validation when the source has no validation split."""
    shuffle_seed: int | None = PROTOCOL_SEED
    """The training stream's order: the protocol's fixed seed; null: the run's seed. The
    validation set is always drawn with the protocol's seed, whatever this is."""
    shuffle_buffer: int = 1000
    num_workers: int = 4
    """> 0: a background reader thread, and this many tokenizer threads."""


@dataclass
class TrainerConfig:
    """The run's protocol; the defaults are the paper's (GaLore/APOLLO/FOAM benchmark): pure bf16,
    global batch 512, 10 % linear warmup, cosine to 10 %, no clipping, eval on 10M tokens."""

    max_steps: int = MISSING
    """Optimizer steps; ``trainer=paper`` looks them up in ``paper_steps`` (see ``paper_value``)."""
    paper_steps: dict[str, int] = field(default_factory=dict)
    global_batch_size: int = 512
    """Sequences per optimizer step = micro_batch_size * accumulation * world size."""
    micro_batch_size: int = 32
    """Sequences per rank per forward; lower it (or use grad_checkpointing) if it runs out of memory."""
    warmup_ratio: float = WARMUP_RATIO
    min_lr_ratio: float = MIN_LR_RATIO
    grad_clip: float = 0.0
    """0 = off (the paper); GaLore's 7B recipe uses 1.0."""
    precision: Precision = Precision.bf16
    """bf16 = pure bf16 (weights, grads, states; the paper) | bf16_mixed | fp32. bf16_mixed keeps
    fp32 weights but computes differently per parallelism: DDP (and any one-rank run) autocasts,
    so the matmuls run in bf16 while the residual stream and norms stay fp32; FSDP2 on two or
    more ranks casts the weights to bf16 (``MixedPrecisionPolicy``), so the residual stream is
    bf16 too."""
    grad_checkpointing: bool = False
    parallelism: Parallelism = Parallelism.ddp
    """ddp (replicate the model on every rank) | fsdp (FSDP2: shard parameters, gradients and
    optimizer states; see train/parallelism.py)."""
    compile: bool | None = None
    """torch.compile each decoder layer (``nn.Module.compile``: parameter and checkpoint names
    unchanged), before FSDP2 shards it (``train/parallelism.py``). Null: on a CUDA GPU only (of
    compute capability 7.0 or newer, with Triton: what inductor builds for), where it pays for
    its compile (``results/bench/train_compile_h100_*.md``); on a CPU it does not
    (``results/bench/train_compile_cpu.md``)."""
    eval_every: int = 1000
    """Optimizer steps between evaluations; 0 = only at the end."""
    eval_tokens: int = 10_000_000
    """Validation budget: non-pad target tokens, all ranks together."""
    eval_micro_batch_size: int | None = None
    """Null: micro_batch_size."""
    test_tokens: int = 0
    """Test budget (non-pad target tokens, all ranks): where > 0, the final evaluation also
    scores the source's test split (``data=local`` with ``*test*`` files), reported as
    ``final_test_*`` in the summary; a split no choice of a study is made on. 0: none."""
    log_update_cosine: bool = False
    """Log, at every evaluation, the cosine between the optimizer's step and Adam's on the same
    gradients (``train/update_cosine.py``; shadow Adam moments of the matrices while on)."""
    log_every: int = 10
    """Optimizer steps between metrics.jsonl / wandb records; also how late a stop signal or a
    wall-clock save can land (``train/preemption.py``)."""
    save_every: int = 1000
    """Optimizer steps between checkpoints; 0 = only the final one."""
    save_every_minutes: float = 0.0
    """Also checkpoint by wall clock (0 = off): a hard kill loses at most this."""
    keep_last: int = 2
    """Checkpoints kept; 0 = all."""
    save_final: bool = True
    resume: str | None = "auto"
    """auto = the run directory's newest checkpoint, if any | a path | none."""
    seed: int = PROTOCOL_SEED
    device: str = "auto"
    """auto = cuda:LOCAL_RANK when available, else cpu."""

    # --- Restarts, hangs, spikes, replica checks (issue #75; README "Faults"; train/elastic.py,
    # train/distributed.py, train/step_guard.py, train/replicas.py) ---
    collective_timeout_s: float = COLLECTIVE_TIMEOUT.total_seconds()
    """How long a training collective (the gradients' all-reduce, the step's counts, a stop
    poll) waits for the other ranks before this rank gives up and exits non-zero, so that a hung
    or frozen rank becomes a restart (torchrun --max-restarts, a requeue) instead of a job that
    holds its nodes: 10 minutes, torch's NCCL default, now also for gloo (torch: 30 min)."""
    slow_io_timeout_s: float = SLOW_IO_TIMEOUT.total_seconds()
    """The same bound for what waits on storage or rank 0's set-up (checkpoint save and load,
    opening the data, building the model): longer, see ``train.distributed.SLOW_IO_TIMEOUT``."""
    on_nonfinite: OnNonFinite = OnNonFinite.stop
    """stop (exit 3 before anything after the bad step is saved) | skip the update (counted in
    ``skipped_steps``); ``train/step_guard.py`` says why and what each costs."""
    on_spike: OnSpike = OnSpike.allow
    """allow | skip an update whose loss or gradient norm is beyond spike_sigma of the last
    spike_window landed steps (OLMo-core's rule)."""
    spike_sigma: float = 6.0
    spike_window: int = 128
    max_skips_in_row: int = 8
    """Skipped updates in a row after which the run stops as a divergence (exit 3)."""
    # --- Checkpoint integrity, failed saves, one run per directory (issue #75; README "Faults",
    # train/checkpoint.py) ---
    verify_checkpoints: bool = True
    """Check a checkpoint's files against its manifest (sizes, CRC-32) before loading it; false
    loads one without (a checkpoint written before manifests)."""
    continue_after_failed_save: bool = False
    """false: a checkpoint that cannot be written stops the run (exit status 74; the previous one
    stays the newest), since a run that goes on unsaved may burn days of compute that the next
    crash loses. true: warn and try again at the next save, for runs where compute is dearer
    than that risk. The stop's save and the final one stop the run either way."""
    async_save: bool = False
    """Write the shards in the background (``dcp.async_save``) while training goes on; the
    checkpoint is checked and published at the next save or at the end of the run."""
    resume_set_aside_newer: bool = False
    """With trainer.resume=<an older checkpoint of this run>: rename the newer ones
    ``step_N.aside`` and go on (refused otherwise: it would fork the run's history)."""
    allow_data_change: bool = False
    """Resume onto data whose fingerprint differs from the checkpoint's (refused otherwise)."""


@dataclass
class LoggerConfig:
    """Metric sinks besides ``metrics.jsonl`` (always written): ``wandb`` or ``none``."""

    name: LoggerName = MISSING
    project: str = "foam-pretrain"
    entity: str | None = None
    mode: WandbMode = WandbMode.auto
    """auto: online when logged in (WANDB_API_KEY or ~/.netrc), else offline; WANDB_MODE overrides."""
    run_name: str | None = None
    """Null: the run directory's name."""
    tags: list[str] = field(default_factory=list)


@dataclass
class Config:
    """The primary config. ``model`` and ``optim`` are appended by ``+model=`` / ``+optim=``.
    Composed, it is a DictConfig of this shape; ``resolve_config`` makes it an instance, once,
    at the run's entry point, and everything after reads that."""

    model: ModelConfig = MISSING
    optim: Any = MISSING
    """Composed: an ``optim_schema/<name>`` (see ``optim_schema``), whose type depends on the
    optimizer; resolved: a plain dict of its keys (the optimizer's keywords and the descriptive
    ``DESCRIPTIVE_OPTIM_KEYS``)."""
    data: DataConfig = MISSING
    trainer: TrainerConfig = MISSING
    logger: LoggerConfig = MISSING


def unknown_key_message(full_key: str, schema: Any) -> str:
    """One line for a key ``schema`` (a dataclass, or anything else when the group has none) does
    not have: the closest key it does have, else its keys. Used for what Hydra refuses at compose
    time and for keys a ``+group.key=`` override appended past the schema."""
    group, _, key = full_key.rpartition(".")
    where = group or "the config"
    if not dataclasses.is_dataclass(schema):  # a group not selected (no +optim=) has no schema
        return f"{full_key}: {where} has no such key (is +{group}=<name> on the command line?)"
    known = [f.name for f in dataclasses.fields(schema)]
    close = difflib.get_close_matches(key, known, n=1)
    prefix = f"{group}." if group else ""
    hint = f"did you mean {prefix}{close[0]}?" if close else f"keys: {', '.join(sorted(known))}"
    return f"{full_key}: not a key of {where}; {hint}"


def _field_type(default: Any) -> Any:
    """The OmegaConf type of an optimizer keyword, from its default. Only bools, floats and strings
    are typed: ints double as names elsewhere (FOAM's ``level`` is an int or ``"mini"``), None says
    nothing about a type and tuples are lists in YAML. The optimizer checks the values."""
    return type(default) if isinstance(default, bool | float | str) else Any


PAPER_SIZES = ("60m", "130m", "350m", "1b", "3b", "7b")
"""The paper's model sizes, smallest first (its Appendix architecture table): LLaMA has all six."""

PAPER_VALUE_RESOLVER = "paper_value"


def paper_size(model: str) -> str | None:
    """The paper's size a model name stands for (``qwen_1b`` -> ``"1b"``); None for debug sizes."""
    size = model.split("_", 1)[-1]
    return size if size in PAPER_SIZES else None


def paper_value(table: Mapping[str, Any], model: str, default: Any = None) -> Any:
    """``model``'s entry in a per-size table of the paper (``configs/paper_lr/``, the step counts
    of ``trainer=paper``), keyed by LLaMA model name. A Qwen size takes the LLaMA row of its size
    (the paper trains Qwen "following the same experimental setup in LLaMA experiments"); a size
    the row leaves empty takes the nearest smaller size the row has (Adam-mini at 3B: 1B's lr,
    where the 60M lr would be 20 times larger); debug sizes take the smallest. ``default`` serves an
    empty table (an optimizer the paper gives no lr)."""
    if not table:
        return default
    if model in table:
        return table[model]
    size = paper_size(model)
    ladder = PAPER_SIZES[: PAPER_SIZES.index(size) + 1] if size else PAPER_SIZES[:1]
    listed = [f"llama_{s}" for s in reversed(ladder) if f"llama_{s}" in table]
    if not listed:
        raise ValueError(f"no entry for {model!r} at or below its size in {sorted(table)}")
    return table[listed[0]]


def paper_value_lookup(table: str, default: Any) -> str:
    """The interpolation that reads ``table`` (a config key) for the composed model: see
    ``paper_value``; the resolver is registered by ``register_configs``."""
    return f"${{{PAPER_VALUE_RESOLVER}:${{{table}}},${{model.name}},{default}}}"


def optim_schema(name: str, keywords: Mapping[str, Any]) -> type:
    """A dataclass for optimizer ``name``: its keywords with the registry's defaults (lr: the paper
    table's entry for the model, see ``paper_value``), plus the descriptive ``name`` (fixed to
    ``name``) and ``paper_lr`` (the paper's lr by LLaMA model name)."""
    fields: list[tuple[str, Any, Any]] = [("name", str, field(default=name))]
    for key, default in keywords.items():
        value = list(default) if isinstance(default, tuple) else default
        if key == "lr":
            value = paper_value_lookup("optim.paper_lr", default)
        fields.append((key, _field_type(default), field(default_factory=lambda v=value: v)))
    fields.append(("paper_lr", dict[str, float], field(default_factory=dict)))
    return dataclasses.make_dataclass(f"{name}_schema", fields)


def register_configs() -> None:
    """Put the schemas into Hydra's ConfigStore and the ``paper_value`` resolver into OmegaConf
    (call before composing ``configs/config.yaml``)."""
    OmegaConf.register_new_resolver(PAPER_VALUE_RESOLVER, paper_value, replace=True)
    store = ConfigStore.instance()
    store.store(name="config_schema", node=Config)
    for name, keywords in foam.available_optimizers().items():
        store.store(group=OPTIM_SCHEMA_GROUP, name=name, node=optim_schema(name, keywords))


def resolve_config(cfg: DictConfig) -> Config:
    """The composed config typed and resolved, once: each group its dataclass, every ``${...}``
    (the paper's lr and steps for the model) resolved here rather than at each read. The optim
    group becomes a plain dict: its schema is generated per method, so no reader could name its
    type. Call after ``train.config``'s check that nothing required is left unset."""
    config = OmegaConf.to_object(cfg)
    config.optim = dataclasses.asdict(config.optim)
    return config


def config_record(config: Config) -> DictConfig:
    """What a run records of its resolved config (``config.yaml``, the logger's config): the
    typed config in OmegaConf's form, which writes as the composed config resolved did."""
    return OmegaConf.structured(config)


def data_config(cfg: DataConfig | DictConfig | Mapping[str, Any]) -> DataConfig:
    """A ``DataConfig`` from the composed ``cfg.data``, a loaded YAML or a plain mapping (scripts
    and tests), checked against the schema: an unknown key or a value of the wrong type raises
    naming the key, and values are converted as Hydra would (``"2048"`` for an int)."""
    return _typed(DataConfig, cfg)


def model_config(cfg: ModelConfig | DictConfig | Mapping[str, Any]) -> ModelConfig:
    """A ``ModelConfig`` from a model group read back (a run's ``config.yaml``), as ``data_config``."""
    return _typed(ModelConfig, cfg)


def _typed(schema: type, cfg: Any) -> Any:
    if isinstance(cfg, schema):
        return cfg
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), cfg))
