"""Configs compose against their schema, every optim config builds its optimizer, and bad configs
fail with the key: at compose time (Hydra and the schema) or before any compute (check_config)."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from methods import ABLATIONS
from omegaconf import OmegaConf, open_dict

import foam
import models
from train.config import (
    CONFIG_DIR,
    ConfigError,
    accumulation_steps,
    build_optimizer,
    check_config,
    optimizer_hparams,
    options,
)
from train.schema import DESCRIPTIVE_OPTIM_KEYS, register_configs

OPTIMS = options("optim")
PAPER_OPTIMS = [
    "adamw",
    *(f"foam{level}" for level in range(1, 9)),
    "foam_mini",
    "galore_1_4",
    "galore_1_8",
    "apollo_1_4",
    "apollo_1_8",
    "apollo_mini",
    "muon",
    "adam_mini",
    "adamw8bit",
    "foam8bit",
    "galore8bit",
    "foam_muon",
    "foam_adam_mini",
    "ldadamw",
    "gwt",
    "gwt_mini",
]


def cfg_for(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_every_promised_optim_config_exists():
    assert set(PAPER_OPTIMS) <= set(OPTIMS)
    assert {"paper", "single_gpu", "cpu_debug"} <= set(options("trainer"))
    assert {"wandb", "none"} <= set(options("logger"))


def test_defaults_and_keys_other_tools_rely_on():
    cfg = cfg_for("+model=llama_350m", "+optim=foam2")
    t = cfg.trainer
    assert (t.max_steps, t.global_batch_size, cfg.data.seq_len) == (60_000, 512, 256)
    assert (t.warmup_ratio, t.min_lr_ratio, t.grad_clip, t.precision) == (0.1, 0.1, 0.0, "bf16")
    assert (t.eval_tokens, t.seed, t.resume, t.device) == (10_000_000, 42, "auto", "auto")
    for key in (
        "micro_batch_size",
        "grad_checkpointing",
        "compile",
        "eval_every",
        "save_every",
        "keep_last",
    ):
        assert key in t
    assert t.save_every_minutes == 0  # wall-clock checkpoints are opt-in
    assert cfg.data.name == "embedded" and cfg.logger.name == "wandb"
    # The paper's (lr, alpha) and the level from the YAML; every other keyword of FOAM at the
    # optimizer's own default, so each can be overridden without "+".
    assert optimizer_hparams(cfg.optim) == {
        **foam.available_optimizers()["foam"],
        "betas": [0.9, 0.95],
        "level": 2,
        "alpha": 0.25,
        "lr": 1e-2,
    }
    assert (
        cfg_for("+model=llama_tiny", "+optim=foam2", "optim.fused_adamw=false").optim.fused_adamw
        is False
    )


def stated_keys(optim: str) -> set[str]:
    """Keys an optim YAML states, itself or through the optim YAMLs it extends."""
    node = OmegaConf.load(CONFIG_DIR / "optim" / f"{optim}.yaml")
    keys = set(node) - {"defaults"}
    for parent in node.get("defaults", []):
        if isinstance(parent, str) and (CONFIG_DIR / "optim" / f"{parent}.yaml").is_file():
            keys |= stated_keys(parent)
    return keys


@pytest.mark.parametrize("optim", OPTIMS)
def test_optim_configs_follow_their_optimizer(optim):
    """Each optim config extends the schema of the optimizer it names: its keys are that
    optimizer's keywords (plus the descriptive ones), and what it leaves out is the default."""
    cfg = cfg_for("+model=llama_350m", f"+optim={optim}")
    keywords = foam.available_optimizers()[cfg.optim.name]
    assert OmegaConf.get_type(cfg.optim).__name__ == f"{cfg.optim.name}_schema"
    assert set(cfg.optim) == set(keywords) | set(DESCRIPTIVE_OPTIM_KEYS)
    assert cfg.optim.lr == cfg.optim.paper_lr["llama_350m"]
    yaml_keys = stated_keys(optim)
    for key, default in keywords.items():
        if key not in yaml_keys:
            expected = list(default) if isinstance(default, tuple) else default
            assert OmegaConf.to_container(cfg.optim, resolve=True)[key] == expected, key


@pytest.mark.parametrize(
    ("group", "override"),
    [
        ("model", "model.hidden_sise=64"),
        ("optim", "optim.levl=3"),
        ("data", "data.seqlen=64"),
        ("trainer", "trainer.max_step=3"),
        ("logger", "logger.projet=x"),
    ],
)
def test_unknown_key_in_each_group_fails_at_compose_time(group, override):
    key = override.split("=")[0]
    with pytest.raises(ConfigCompositionException, match=f"Could not override '{key}'") as err:
        cfg_for("+model=llama_tiny", "+optim=foam2", override)
    assert f"Key '{key.split('.')[1]}' not in" in str(err.value.__cause__)


def test_wrong_type_fails_at_compose_time():
    with pytest.raises(ConfigCompositionException, match=r"trainer\.max_steps=abc"):
        cfg_for("+model=llama_tiny", "+optim=foam2", "trainer.max_steps=abc")
    with pytest.raises(ConfigCompositionException, match=r"trainer\.save_every_minutes=soon"):
        cfg_for("+model=llama_tiny", "+optim=foam2", "trainer.save_every_minutes=soon")
    with pytest.raises(ConfigCompositionException, match=r"optim\.residual=maybe"):
        cfg_for("+model=llama_tiny", "+optim=foam2", "optim.residual=maybe")


def test_unknown_key_in_a_yaml_option_fails_at_compose_time(tmp_path):
    """A user's own option file is held to the schema too (a misspelt key in a file)."""
    import shutil

    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    (configs / "trainer" / "mine.yaml").write_text("# @package trainer\nmax_stpes: 5\n")
    register_configs()
    with (
        initialize_config_dir(config_dir=str(configs), version_base="1.3"),
        pytest.raises(ConfigCompositionException) as err,
    ):
        compose("config", overrides=["+model=llama_tiny", "+optim=foam2", "trainer=mine"])
    assert "max_stpes" in str(err.value) + str(err.value.__cause__)


def test_foam2_release_is_foam2_with_release_semantics():
    paper = optimizer_hparams(cfg_for("+model=llama_60m", "+optim=foam2").optim)
    release = optimizer_hparams(cfg_for("+model=llama_60m", "+optim=foam2_release").optim)
    assert release == {**paper, "semantics": "release"}


@pytest.mark.parametrize(
    ("model", "optim", "lr"),
    [
        ("llama_60m", "adamw", 5e-3),
        ("llama_1b", "adamw", 5e-4),
        ("llama_130m", "muon", 2.5e-3),
        ("llama_3b", "foam2", 5e-3),
        ("llama_7b", "galore_1_4", 1e-2),
        ("llama_350m", "adam_mini", 5e-4),
        ("qwen_130m", "adamw", 1e-3),
        ("llama_tiny", "adamw", 5e-3),
        ("llama_tiny", "foam_mini", 1e-2),
    ],
)
def test_paper_lr_follows_the_model_size(model, optim, lr):
    cfg = cfg_for(f"+model={model}", f"+optim={optim}")
    assert cfg.optim.lr == pytest.approx(lr)
    assert cfg_for(f"+model={model}", f"+optim={optim}", "optim.lr=3e-4").optim.lr == 3e-4


def test_trainer_presets():
    debug = cfg_for("+model=llama_tiny", "+optim=foam2", "trainer=cpu_debug").trainer
    assert (debug.precision, debug.device, debug.global_batch_size) == ("fp32", "cpu", 8)
    single = cfg_for("+model=llama_1b", "+optim=foam2", "trainer=single_gpu").trainer
    assert single.grad_checkpointing and single.max_steps == 100_000


# Wide enough for FOAM-8's 256-entry blocks, small enough to build in a blink.
WIDE_TINY = (
    "model.hidden_size=256",
    "model.intermediate_size=512",
    "model.num_hidden_layers=1",
    "model.vocab_size=512",
)


@pytest.fixture(scope="module")
def tiny_model():
    return models.build_model(cfg_for("+model=llama_tiny", "+optim=adamw").model)


@pytest.fixture(scope="module")
def wide_tiny_model():
    return models.build_model(cfg_for("+model=llama_tiny", "+optim=adamw", *WIDE_TINY).model)


@pytest.mark.parametrize("optim", OPTIMS)
def test_every_optim_config_builds_its_optimizer(optim, wide_tiny_model):
    cfg = cfg_for("+model=llama_tiny", f"+optim={optim}", "logger=none", *WIDE_TINY)
    if cfg.optim.name not in foam.available_optimizers():
        pytest.skip(f"{cfg.optim.name!r} is not registered in foam yet")
    check_config(cfg, world_size=1)
    optimizer = build_optimizer(cfg.optim, wide_tiny_model)
    assert all(g["lr"] > 0 for g in optimizer.param_groups)
    assert foam.planned_state_numel(optimizer) > 0


def expect_error(cfg, key: str, world_size: int = 1) -> str:
    with pytest.raises(ConfigError) as err:
        check_config(cfg, world_size)
    assert key in str(err.value)
    return str(err.value)


def test_missing_model_or_optim_names_the_flag():
    message = expect_error(cfg_for("+optim=foam2"), "+model=")
    assert "llama_350m" in message
    expect_error(cfg_for("+model=llama_tiny"), "+optim=")


def test_unknown_model_size_is_refused_by_hydra():
    with pytest.raises(Exception, match="llama_999m"):
        cfg_for("+model=llama_999m", "+optim=foam2")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("optim.name=sgd9", "optim.name"),
        ("+optim.rank=4", "optim.rank"),
        ("+data.foo=1", "data.foo"),
        ("trainer.max_steps=0", "trainer.max_steps"),
        ("trainer.precision=fp16", "trainer.precision"),
        ("trainer.warmup_ratio=1.0", "trainer.warmup_ratio"),
        ("data.seq_len=4096", "data.seq_len"),
        ("trainer.grad_clip=-1", "trainer.grad_clip"),
        ("trainer.save_every_minutes=-5", "trainer.save_every_minutes"),
    ],
)
def test_bad_values_name_their_key(override, key):
    expect_error(cfg_for("+model=llama_tiny", "+optim=foam2", override), key)


def test_batch_sizes_must_divide():
    assert accumulation_steps(512, 32, 8) == 2
    cfg = cfg_for(
        "+model=llama_tiny",
        "+optim=foam2",
        "trainer.global_batch_size=512",
        "trainer.micro_batch_size=48",
    )
    message = expect_error(cfg, "trainer.global_batch_size")
    assert "trainer.micro_batch_size" in message
    ok = cfg_for("+model=llama_tiny", "+optim=foam2", "trainer.micro_batch_size=64")
    check_config(ok, world_size=8)
    expect_error(ok, "world size 3", world_size=3)


def test_missing_required_value_names_its_key():
    expect_error(
        cfg_for("+model=llama_tiny", "+optim=foam2", "trainer.max_steps=???"), "trainer.max_steps"
    )


def test_the_optimizer_rules_on_values_name_the_key(tiny_model):
    """lr is the optimizer's rule (torch's: lr >= 0), translated into a config error."""
    cfg = cfg_for("+model=llama_tiny", "+optim=adamw", "optim.lr=-1e-3")
    check_config(cfg, world_size=1)
    with pytest.raises(ConfigError, match=r"optim\.lr=-0\.001"):
        build_optimizer(cfg.optim, tiny_model)


def test_invalid_fold_level(tiny_model):
    cfg = cfg_for("+model=llama_tiny", "+optim=foam2")
    build_optimizer(cfg.optim, tiny_model)
    with open_dict(cfg):
        cfg.optim.level = -1
    with pytest.raises(ConfigError, match=r"optim\.level=-1.*level must be an int >= 0"):
        build_optimizer(cfg.optim, tiny_model)


def test_configs_dir_is_the_repo_one():
    assert Path(__file__).resolve().parents[1] / "configs" == CONFIG_DIR


@pytest.mark.parametrize("ablation", ABLATIONS, ids=lambda a: a.name)
def test_every_ablation_composes_with_its_overrides(ablation):
    """scripts/reproduce_cpu.py runs each variant as +optim=OPTIM plus its overrides."""
    cfg = cfg_for("+model=llama_2m", f"+optim={ablation.optim}", *ablation.overrides)
    for override in ablation.overrides:
        key, _, value = override.partition("=")
        assert str(OmegaConf.select(cfg, key)).lower() == value


@pytest.mark.parametrize("resuming", [False, True])
@pytest.mark.parametrize("rank", [0, 1])
def test_under_fsdp_only_rank_0_builds_the_whole_model(monkeypatch, rank, resuming):
    """The other ranks build it on the meta device alone and get their shards from rank 0
    (``fill_from_rank0``): a whole LLaMA-7B is 27 GB of host memory on every rank otherwise. A
    resumed run's checkpoint holds every weight, so no rank builds the whole model then."""
    import torch

    from train import pretrain
    from train.distributed import DistInfo

    built_on = []
    real_build = models.build_model

    def build(cfg, device="cpu", **kwargs):
        built_on.append(str(device))
        return real_build(cfg, device=device, **kwargs)

    filled = []
    monkeypatch.setattr(models, "build_model", build)
    monkeypatch.setattr(pretrain, "parallelize", lambda model, **kwargs: model)  # no group here
    monkeypatch.setattr(pretrain, "log_model_and_optimizer", lambda *args: None)  # no Hydra app
    monkeypatch.setattr(
        pretrain, "fill_from_rank0", lambda model, whole, device: filled.append(whole)
    )
    cfg = cfg_for("+model=llama_tiny", "+optim=foam2", "trainer.parallelism=fsdp")
    model, *_ = pretrain.build_model_and_optimizer(
        cfg, DistInfo(rank=rank, world_size=2), torch.device("cpu"), initialise=not resuming
    )
    whole = rank == 0 and not resuming
    assert built_on == (["meta", "cpu"] if whole else ["meta"])
    assert [w is not None for w in filled] == ([] if resuming else [rank == 0])
    if resuming:  # allocated for the checkpoint instead, on every rank
        assert not any(t.is_meta for t in model.state_dict().values())
