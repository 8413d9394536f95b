"""Checks on the composed config that fail fast, before any model is built or data is read.

Types and key names are the schema's job (``train/schema.py``, enforced by Hydra at compose time);
what is left here are the rules that relate values to each other or to the run. The optimizer's own
rules stay in the optimizer: ``check_config`` applies those that need no model
(``foam.check_hparams``), ``build_optimizer`` the rest, and both turn a refusal into a config error.
Every message names the offending key, so a bad launch of a thousand-GPU-hour run costs seconds.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

import foam
import models
from foam.errors import OptionError
from foam.schedule import check_schedule
from foam.sharding import ShardingNotSupported
from train.data.corpus import SOURCES
from train.errors import ConfigError
from train.schema import (
    DESCRIPTIVE_OPTIM_KEYS,
    Config,
    DataConfig,
    Precision,
    TrainerConfig,
    resolve_config,
    unknown_key_message,
)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
PARAM_DTYPES = {
    Precision.bf16: torch.bfloat16,
    Precision.bf16_mixed: torch.float32,
    Precision.fp32: torch.float32,
}
"""``trainer.precision`` -> the dtype the weights (and so the optimizer's states) are held in."""


def options(group: str) -> list[str]:
    """The YAML options of a config group (the optimizer schemas are not listed)."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def optimizer_hparams(optim: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords for ``foam.build_optimizer``: the resolved optim config (``Config.optim``)
    minus its descriptive keys."""
    return {k: v for k, v in optim.items() if k not in DESCRIPTIVE_OPTIM_KEYS}


def accumulation_steps(global_batch: int, micro_batch: int, world_size: int) -> int:
    """Micro-batches per rank per optimizer step, so that global = micro * accum * world."""
    if micro_batch <= 0 or global_batch <= 0:
        raise ConfigError(
            "trainer.global_batch_size and trainer.micro_batch_size must be positive, got "
            f"{global_batch} and {micro_batch}"
        )
    if global_batch % (micro_batch * world_size):
        raise ConfigError(
            f"trainer.global_batch_size={global_batch} is not divisible by "
            f"trainer.micro_batch_size={micro_batch} x world size {world_size}: "
            "global = micro * accumulation * world must hold exactly"
        )
    return global_batch // (micro_batch * world_size)


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _check_schema_keys(cfg: DictConfig) -> None:
    """Keys a ``+group.key=`` override appended past the schema (Hydra lets ``+`` add keys)."""
    for group in ("model", "optim", "data", "trainer", "logger"):
        schema = OmegaConf.get_type(cfg[group])
        if dataclasses.is_dataclass(schema):
            known = {f.name for f in dataclasses.fields(schema)}
            extra = sorted(set(cfg[group]) - known)
            if extra:
                raise ConfigError(unknown_key_message(f"{group}.{extra[0]}", schema))


def check_config(cfg: DictConfig, world_size: int) -> Config:
    """Raise ConfigError on the first problem found: what is selected and set, then each group's
    own rules, the model's and the optimizer's from the library that owns them. Returns the
    config typed and resolved (``train.schema.resolve_config``): what every later reader takes."""
    _check_composed(cfg)
    config = resolve_config(cfg)
    try:
        models.validate_model_config(config.model)
    except ValueError as err:
        raise ConfigError(f"model={config.model.name}: {err}") from None
    optim = config.optim
    with _optimizer_errors(optim):  # its rules that need no model, before any data is read
        foam.check_hparams(optim["name"], **optimizer_hparams(optim))
        foam.fold_axis_of(optim)  # the model is sharded for it before the optimizer exists
    _check_trainer(config.trainer, world_size, data_name=config.data.name)
    _check_data(config.data, max_positions=config.model.max_position_embeddings)
    return config


def _check_composed(cfg: DictConfig) -> None:
    """``+model=`` and ``+optim=`` given, no required key left unset, no key past the schema."""
    for group, flag in (("model", "+model"), ("optim", "+optim")):
        _require(
            group in cfg,
            f"{group}: none selected; add {flag}=<name> to the command line "
            f"(options: {', '.join(options(group))})",
        )
    missing = sorted(OmegaConf.missing_keys(cfg))
    _require(not missing, f"{missing[0] if missing else ''}: required, set it on the command line")
    _check_schema_keys(cfg)


def _check_trainer(t: TrainerConfig, world_size: int, data_name: str) -> None:
    """The run's protocol: device, schedule, batch arithmetic, intervals, budgets and seed."""
    _check_device(t.device)
    with _trainer_errors():
        check_schedule(t.max_steps, t.warmup_ratio, t.min_lr_ratio)
    accumulation_steps(t.global_batch_size, t.micro_batch_size, world_size)
    _require(t.grad_clip >= 0, f"trainer.grad_clip must be >= 0 (0 = off), got {t.grad_clip}")
    for key, value in _values(t, "eval_every", "save_every", "keep_last", "log_every"):
        _require(value >= 0, f"trainer.{key} must be >= 0, got {value}")
    _require(
        t.save_every_minutes >= 0,
        f"trainer.save_every_minutes must be a number >= 0 (0 = off), got {t.save_every_minutes}",
    )
    _require(t.eval_tokens > 0, f"trainer.eval_tokens must be positive, got {t.eval_tokens}")
    _require(t.test_tokens >= 0, f"trainer.test_tokens must be >= 0 (0 = off), got {t.test_tokens}")
    _require(
        t.test_tokens == 0 or (data_name in SOURCES and SOURCES[data_name].has_test),
        f"trainer.test_tokens needs data=local (a mirror with test files); data={data_name} "
        "has no test split",
    )
    _require(
        0 <= t.seed < 2**32, f"trainer.seed must be in [0, 2**32) (numpy's range), got {t.seed}"
    )
    _require(
        t.eval_micro_batch_size is None or t.eval_micro_batch_size > 0,
        "trainer.eval_micro_batch_size must be positive, or null for trainer.micro_batch_size, "
        f"got {t.eval_micro_batch_size}",
    )
    for key, value in _values(t, "collective_timeout_s", "slow_io_timeout_s"):  # issue #75's
        _require(value > 0, f"trainer.{key} must be a number of seconds > 0, got {value}")
    for key, value in _values(t, "spike_sigma", "spike_window", "max_skips_in_row"):
        _require(value > 0, f"trainer.{key} must be > 0, got {value}")


def _values(group: object, *keys: str) -> list[tuple[str, Any]]:
    """(key, value) of a typed group's ``keys``, for the rules several keys share."""
    return [(key, getattr(group, key)) for key in keys]


def _check_data(data: DataConfig, max_positions: int) -> None:
    """Rows the model can take, reader settings, and a tokenizer named."""
    _require(
        1 < data.seq_len <= max_positions,
        f"data.seq_len must be in (1, model.max_position_embeddings={max_positions}], "
        f"got {data.seq_len}",
    )
    for key, value in _values(data, "num_workers", "shuffle_buffer"):
        _require(value >= 0, f"data.{key} must be >= 0 (0 = off), got {value}")
    _require(
        data.tokenizer.strip() != "",
        "data.tokenizer is empty: name one (t5-base, spm for the project's SentencePiece, or a "
        "path to a tokenizer directory or SentencePiece model)",
    )


def _check_device(spec: str) -> None:
    """A device this machine has: ``auto`` always; ``cuda`` only where torch sees a GPU."""
    if spec == "auto":
        return
    try:
        device = torch.device(spec)
    except RuntimeError as err:
        raise ConfigError(f"trainer.device={spec}: {str(err).splitlines()[0]}") from None
    _require(
        device.type != "cuda" or torch.cuda.is_available(),
        f"trainer.device={spec}: torch sees no CUDA GPU here; "
        "use trainer.device=auto (the GPU where there is one) or cpu",
    )


def build_optimizer(optim: Mapping[str, Any], model: torch.nn.Module) -> torch.optim.Optimizer:
    """The run's optimizer. What the optimizer itself rejects at construction (a fold level
    beyond the model's matrices, a negative lr) becomes a config error before any compute,
    naming ``optim.<key>`` from the key its ``OptionError`` carries: the optimizer is the one
    place those rules live (``check_config`` applied those that need no model already)."""
    with _optimizer_errors(optim):
        return foam.build_optimizer(optim["name"], model, **optimizer_hparams(optim))


@contextlib.contextmanager
def _trainer_errors() -> Iterator[None]:
    """A trainer setting refused by the module that owns its rule, as a config error naming it."""
    try:
        yield
    except ValueError as err:
        raise ConfigError(f"trainer.{err}") from None


@contextlib.contextmanager
def _optimizer_errors(optim: Mapping[str, Any]) -> Iterator[None]:
    """What the optimizer refuses, as a config error naming the key to fix."""
    try:
        yield
    except ShardingNotSupported as err:
        raise ConfigError(f"trainer.parallelism=fsdp: {err}") from None
    except OptionError as err:
        raise _config_error(err, optim) from None
    except (ValueError, TypeError) as err:
        raise ConfigError(f"optim.name={optim['name']}: {err}") from None


def _config_error(err: OptionError, optim: Mapping[str, Any]) -> ConfigError:
    """The optimizer's refusal as a config error naming ``optim.<the key it carries>``."""
    return ConfigError(f"optim.{err.key}={optim.get(err.key)}: {err}")
