"""Every optim config resolved for a few models: the record that config refactors are checked against.

Not a test module. ``tests/data/optim_configs_resolved.json`` is this module's output on the
commit before the optim configs were deduplicated (run from that checkout, with its own schema
registration)::

    cd OLD_CHECKOUT && python NEW_CHECKOUT/tests/optim_resolution.py > optim_configs_resolved.json

``test_train_config.py`` resolves the same configs on the current tree and compares, so a config
that moves a value (an lr table, a level, a rank) into a shared file keeps resolving to the same
thing.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# The lr lookup's cases: debug size (falls back to the 60M value), table sizes, the 3B/7B columns
# some rows leave empty, a Qwen size in the table and one outside it.
MODELS = ("llama_tiny", "llama_60m", "llama_350m", "llama_3b", "llama_7b", "qwen_130m", "qwen_1b")


def resolved_optims(
    config_dir: Path, optims: list[str], models: tuple[str, ...] = MODELS
) -> dict[str, Any]:
    """``{optim: {"schema": type name, "optim": cfg.optim resolved for models[0], "differs":
    {model: {key: value}}}}`` for the configs in ``config_dir`` (``train`` must be the same
    checkout's), where ``differs`` holds the keys that resolve differently for another model.

    Each optim is composed once, as the trainer composes it, and resolved under each model's
    config: a defaults list cannot depend on the model, only interpolations (lr, widths) do."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from train.schema import register_configs

    register_configs()
    out: dict[str, Any] = {}
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        for optim in optims:
            cfg = compose("config", overrides=[f"+model={models[0]}", f"+optim={optim}"])
            by_model = {}
            for model in models:
                cfg.model.merge_with(OmegaConf.load(config_dir / "model" / f"{model}.yaml"))
                by_model[model] = OmegaConf.to_container(cfg.optim, resolve=True)
            first = by_model[models[0]]
            differs = {
                m: {k: v for k, v in resolved.items() if first[k] != v}
                for m, resolved in by_model.items()
            }
            out[optim] = {
                "schema": OmegaConf.get_type(cfg.optim).__name__,
                "optim": first,
                "differs": {m: d for m, d in differs.items() if d},
            }
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path.cwd()))  # the checkout to record, with its own schema registration
    from train.config import CONFIG_DIR, options

    json.dump(resolved_optims(CONFIG_DIR, options("optim")), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
