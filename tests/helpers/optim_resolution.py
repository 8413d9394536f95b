"""Every optim config resolved for a few models: the record that config refactors are checked against.

Not a test module. ``tests/data/optim_configs_resolved.json`` is this module's output on the
commit before the optim configs were deduplicated (run from that checkout, with its own schema
registration)::

    cd OLD_CHECKOUT &&
        python NEW_CHECKOUT/tests/helpers/optim_resolution.py > optim_configs_resolved.json

``tests/train/test_config.py`` resolves the same configs on the current tree and compares, so a
config that moves a value (an lr table, a level, a rank) into a shared file keeps resolving to
the same thing.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

# The lr lookup's cases (train/schema.py, paper_value): a debug size (the 60M value), table sizes,
# the 3B/7B columns some rows leave empty, Qwen sizes with and without a paper entry.
MODELS = ("llama_tiny", "llama_60m", "llama_350m", "llama_3b", "llama_7b", "qwen_130m", "qwen_1b")


def resolve_for_models(cfg: DictConfig, config_dir: Path, models: tuple[str, ...] = MODELS) -> dict:
    """The record of one composed config: ``{"schema": type name, "optim": cfg.optim resolved for
    models[0], "differs": {model: {key: value}}}``, where ``differs`` holds the keys that resolve
    differently under another model. A defaults list cannot depend on the model, only
    interpolations (lr, widths) do, so one composition serves every model: ``cfg`` is copied and
    each model's YAML merged into the copy's ``model`` in turn."""
    cfg = copy.deepcopy(cfg)
    by_model = {}
    for model in models:
        cfg.model.merge_with(OmegaConf.load(config_dir / "model" / f"{model}.yaml"))
        by_model[model] = OmegaConf.to_container(cfg.optim, resolve=True)
    first = by_model[models[0]]
    differs = {m: {k: v for k, v in r.items() if first[k] != v} for m, r in by_model.items()}
    return {
        "schema": OmegaConf.get_type(cfg.optim).__name__,
        "optim": first,
        "differs": {m: d for m, d in differs.items() if d},
    }


def resolved_optims(config_dir: Path, optims: list[str]) -> dict[str, Any]:
    """``{optim: record}`` for the configs in ``config_dir``, composed as the trainer composes them
    (``train`` must be the same checkout's)."""
    from hydra import compose, initialize_config_dir

    from train.schema import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        return {
            optim: resolve_for_models(
                compose("config", overrides=[f"+model={MODELS[0]}", f"+optim={optim}"]), config_dir
            )
            for optim in optims
        }


if __name__ == "__main__":
    sys.path.insert(0, str(Path.cwd()))  # the checkout to record, with its own schema registration
    from train.config import CONFIG_DIR, options

    json.dump(resolved_optims(CONFIG_DIR, options("optim")), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
