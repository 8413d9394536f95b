"""Configs compose against their schema, every optim config builds its optimizer, and bad configs
fail with the key: at compose time (Hydra and the schema) or before any compute (check_config)."""

import functools
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict

import foam
import models
from repro.methods import ABLATIONS
from tests.helpers.optim_resolution import resolve_for_models
from train.cli_errors import composition_error_message, discard_refused_run_dir
from train.config import (
    CONFIG_DIR,
    accumulation_steps,
    build_optimizer,
    check_config,
    optimizer_hparams,
    options,
)
from train.errors import ConfigError
from train.plan import plan_run
from train.schema import DESCRIPTIVE_OPTIM_KEYS, config_record, paper_value, register_configs

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
    assert t.compile is None  # on a CUDA GPU only (train/parallelism.py compiles_layers)
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
    assert cfg.data.name == "c4" and cfg.logger.name == "wandb"  # the paper's protocol
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


@functools.cache
def composed(optim: str) -> DictConfig:
    """``+optim=optim`` for llama_350m, composed once for the tests that only read it."""
    return cfg_for("+model=llama_350m", f"+optim={optim}")


@pytest.mark.parametrize("optim", OPTIMS)
def test_optim_configs_follow_their_optimizer(optim):
    """Each optim config extends the schema of the optimizer it names: its keys are that
    optimizer's keywords (plus the descriptive ones), and what it leaves out is the default."""
    cfg = composed(optim)
    keywords = foam.available_optimizers()[cfg.optim.name]
    assert OmegaConf.get_type(cfg.optim).__name__ == f"{cfg.optim.name}_schema"
    assert set(cfg.optim) == set(keywords) | set(DESCRIPTIVE_OPTIM_KEYS)
    assert cfg.optim.lr == cfg.optim.paper_lr["llama_350m"]
    yaml_keys = stated_keys(optim) | {"lr"}  # lr: the paper table's lookup (test below)
    for key, default in keywords.items():
        if key not in yaml_keys:
            expected = list(default) if isinstance(default, tuple) else default
            assert OmegaConf.to_container(cfg.optim, resolve=True)[key] == expected, key


# Each optim config resolved on main at 6a00c51, before the configs were deduplicated (one FOAM
# config with thin foamN files, the paper's lr rows in configs/paper_lr/), by
# tests/helpers/optim_resolution.py; amended once, by hand, for the rule of train/schema.py's paper_value
# (the Qwen rows dropped from the tables; qwen_1b and the 3B/7B columns a row leaves empty moved
# from the 60M lr to the LLaMA row of their size or the nearest smaller one), and once for
# foam_adam_mini's alpha (0.25 -> 1, Adam-mini's: at Adam-mini's lr, FOAM's 0.25 ran the folded
# variant's matrices at a quarter of the lr Adam-mini's own take), all else kept.
RECORDED = json.loads((Path(__file__).parents[1] / "data/optim_configs_resolved.json").read_text())


def test_every_recorded_optim_config_is_still_an_option():
    assert set(RECORDED) <= set(OPTIMS)


@pytest.mark.parametrize("optim", sorted(RECORDED))
def test_each_optim_config_resolves_as_recorded_on_main(optim):
    """The same schema and the same values, for each of the record's models."""
    assert resolve_for_models(composed(optim), CONFIG_DIR) == RECORDED[optim]


def test_foam_is_foam2_and_foam_n_is_its_level():
    foam = resolve_for_models(composed("foam"), CONFIG_DIR)
    assert foam == RECORDED["foam2"]
    assert RECORDED["foam3"] == {**foam, "optim": {**foam["optim"], "level": 3}}
    assert cfg_for("+model=llama_60m", "+optim=foam", "optim.level=5").optim.level == 5


def test_each_paper_lr_table_is_written_once():
    """The lr rows live in ``configs/paper_lr/`` only, pairwise distinct, each one in use."""
    tables = {p.stem: OmegaConf.load(p) for p in sorted((CONFIG_DIR / "paper_lr").glob("*.yaml"))}
    rows = [tuple(sorted(t.items())) for t in tables.values()]
    assert len(set(rows)) == len(rows) > 1
    used = set()
    for path in sorted(CONFIG_DIR.rglob("*.yaml")):
        node = OmegaConf.load(path)
        assert "paper_lr" not in node, path
        for entry in node.get("defaults", []):
            if isinstance(entry, DictConfig) and "/paper_lr@paper_lr" in entry:
                used.add(entry["/paper_lr@paper_lr"])
    assert used == set(tables)


def test_schemas_are_not_optim_choices():
    """``+optim=foam_schema`` once trained at the optimizer's default lr 1e-4: a schema is no
    method, so it is not in the ``optim`` group at all."""
    assert not [name for name in OPTIMS if name.endswith("_schema")]
    with pytest.raises(MissingConfigException) as err:
        cfg_for("+model=llama_tiny", "+optim=foam_schema")
    assert "foam_schema" not in err.value.options
    assert set(err.value.options) == set(OPTIMS)
    for group in ("optim_schema", "paper_lr"):  # the groups optim configs read from
        with pytest.raises(ConfigCompositionException) as err:
            cfg_for("+model=llama_tiny", "+optim=foam2", f"+{group}=foam")
        assert composition_error_message(err.value) == (
            f"{group}: not a key of the config; keys: data, logger, model, optim, trainer"
        )


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


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["+optim=foam_schema"],
            "optim=foam_schema: no such optim config; did you mean foam_muon? "
            f"(options: {', '.join(OPTIMS)})",
        ),
        (
            ["+optim=foam2", "trainer=papr"],
            "trainer=papr: no such trainer config; did you mean paper? "
            "(options: cpu_debug, paper, single_gpu)",
        ),
        (
            ["+optim=foam2", "data=c5"],
            "data=c5: no such data config (options: c4, embedded, local)",
        ),
        (
            ["+optim=foam2", "trainer.max_step=3"],
            "trainer.max_step: not a key of trainer; did you mean trainer.max_steps?",
        ),
        (
            ["+optim=foam2", "optim.levl=3"],
            "optim.levl: not a key of optim; did you mean optim.level?",
        ),
        (
            ["+optim=foam2", "model.hidden_sise=64"],
            "model.hidden_sise: not a key of model; did you mean model.hidden_size?",
        ),
        (
            ["+optim=foam2", "logger.zzz=1"],
            "logger.zzz: not a key of logger; keys: entity, mode, name, project, run_name, tags",
        ),
        (
            ["optim.lr=1e-3"],
            "optim.lr: optim has no such key (is +optim=<name> on the command line?)",
        ),
        (
            ["+optim=foam2", "trainer.max_steps=abc"],
            "trainer.max_steps=abc: Value 'abc' of type 'str' could not be converted to Integer",
        ),
        (
            ["+optim=foam2", "trainer.max_steps"],
            "Error parsing override 'trainer.max_steps'; missing EQUAL at '<EOF>'; See "
            "https://hydra.cc/docs/1.2/advanced/override_grammar/basic for details",
        ),
    ],
)
def test_what_hydra_cannot_compose_is_one_line(overrides, line):
    """The line the CLI prints (after ``error: ``) for each kind, from Hydra's exception."""
    with pytest.raises((ConfigCompositionException, OverrideParseException)) as err:
        cfg_for("+model=llama_tiny", *overrides)
    assert composition_error_message(err.value) == line


def test_an_appended_misspelt_key_names_the_closest_one():
    """``+trainer.max_step=3`` gets past Hydra (``+`` may add keys); the schema check refuses it."""
    message = expect_error(cfg_for("+model=llama_tiny", "+optim=foam2", "+trainer.max_step=3"), "")
    assert message == "trainer.max_step: not a key of trainer; did you mean trainer.max_steps?"


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
    assert composition_error_message(err.value) == (
        "trainer.max_stpes: not a key of trainer; did you mean trainer.max_steps?"
    )


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
        ("qwen_7b", "foam2", 5e-3),  # the LLaMA row of its size
        ("llama_3b", "adam_mini", 2.5e-4),  # no 3B entry: 1B's, not 60M's 5e-3
        ("qwen_3b", "adam_mini", 2.5e-4),
        ("llama_7b", "gwt", 5e-3),  # no 7B entry: 3B's
        ("llama_tiny", "adamw", 5e-3),
        ("llama_tiny", "foam_mini", 1e-2),
    ],
)
def test_paper_lr_follows_the_model_size(model, optim, lr):
    cfg = cfg_for(f"+model={model}", f"+optim={optim}")
    assert cfg.optim.lr == pytest.approx(lr)
    assert cfg_for(f"+model={model}", f"+optim={optim}", "optim.lr=3e-4").optim.lr == 3e-4


@pytest.mark.parametrize(
    ("model", "steps"),
    [("llama_130m", 20_000), ("qwen_130m", 20_000), ("qwen_1b", 100_000), ("qwen_tiny", 10_000)],
)
def test_paper_steps_follow_the_model_size(model, steps):
    assert cfg_for(f"+model={model}", "+optim=foam2", "trainer=paper").trainer.max_steps == steps


def test_paper_value_takes_the_size_or_the_nearest_smaller_one():
    table = {"llama_60m": 1, "llama_350m": 3, "llama_1b": 4}
    assert paper_value(table, "llama_350m") == 3
    assert paper_value(table, "qwen_350m") == 3
    assert paper_value(table, "llama_130m") == 1
    assert paper_value(table, "qwen_7b") == 4
    assert paper_value(table, "llama_2m") == paper_value(table, "qwen_tiny") == 1
    assert paper_value({}, "llama_60m", 0.5) == 0.5
    with pytest.raises(ValueError, match="llama_60m"):
        paper_value({"llama_1b": 4}, "llama_60m")


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
        ("trainer.max_steps=0", "trainer.max_steps must be a positive number of optimizer steps"),
        ("trainer.warmup_ratio=1.0", "trainer.warmup_ratio must be in [0, 1), got 1.0"),
        ("trainer.min_lr_ratio=-0.1", "trainer.min_lr_ratio must be in [0, 1], got -0.1"),
        ("data.seq_len=4096", "data.seq_len"),
        ("trainer.grad_clip=-1", "trainer.grad_clip"),
        ("trainer.save_every_minutes=-5", "trainer.save_every_minutes"),
        ("trainer.device=gpu", "trainer.device=gpu: Expected one of cpu, cuda"),
        ("model.hidden_size=63", "model=llama_tiny: hidden_size 63 is not divisible by"),
        ("model.num_key_value_heads=3", "model=llama_tiny: num_attention_heads 4 is not a"),
        ("trainer.seed=-1", "trainer.seed must be in [0, 2**32)"),
        ("trainer.eval_micro_batch_size=0", "trainer.eval_micro_batch_size must be positive"),
        ("trainer.test_tokens=-1", "trainer.test_tokens must be >= 0"),
        ("trainer.test_tokens=100", "trainer.test_tokens needs data=local"),
        ("data.num_workers=-1", "data.num_workers must be >= 0"),
        ("data.shuffle_buffer=-1", "data.shuffle_buffer must be >= 0"),
        ("data.tokenizer=", "data.tokenizer is empty"),
        ("optim.lr=inf", "optim.lr=inf: lr must be >= 0 and finite"),
    ],
)
def test_bad_values_name_their_key(override, key):
    expect_error(cfg_for("+model=llama_tiny", "+optim=foam2", override), key)


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("trainer.precision=fp16", "expected one of [bf16, bf16_mixed, fp32]"),
        ("trainer.parallelism=tp", "expected one of [ddp, fsdp]"),
        ("logger.name=tensorboard", "expected one of [wandb, none]"),
        ("logger.mode=loud", "expected one of [auto, online, offline, disabled]"),
    ],
)
def test_a_choice_outside_its_set_is_refused_at_compose_time(override, line):
    """The choice sets are the schema's enums: Hydra refuses the value before any check runs,
    and the CLI's one line names the key, the value and the choices."""
    with pytest.raises(ConfigCompositionException) as err:
        cfg_for("+model=llama_tiny", "+optim=foam2", override)
    value = override.partition("=")[2]
    assert composition_error_message(err.value) == f"{override}: Invalid value '{value}', {line}"


def test_a_choice_reads_and_records_as_its_string(tmp_path):
    """The enums are StrEnums: code compares them with strings, the resolved config and the
    summary write the plain name, as before the enums."""
    cfg = cfg_for("+model=llama_tiny", "+optim=foam2", "trainer.precision=bf16_mixed")
    assert cfg.trainer.precision == "bf16_mixed" and f"{cfg.trainer.parallelism}" == "ddp"
    assert "precision: bf16_mixed\n" in OmegaConf.to_yaml(cfg, resolve=True)
    assert json.loads(json.dumps(OmegaConf.to_container(cfg.logger)))["mode"] == "auto"


@pytest.mark.parametrize(
    "overrides",
    [
        ("+model=llama_350m", "+optim=foam2", "trainer=paper"),  # lr and steps interpolated
        ("+model=deberta_tiny", "+optim=galore_1_4", "trainer=cpu_debug", "logger=none"),
    ],
)
def test_the_resolved_config_records_as_the_composed_one_resolved(overrides):
    """The config is typed and resolved once (``check_config``); what a run records of it
    (``config.yaml``, the logger's config) is what resolving the composed config gave."""
    cfg = cfg_for(*overrides)
    config = check_config(cfg, world_size=1)
    record = config_record(config)
    assert OmegaConf.to_yaml(record) == OmegaConf.to_yaml(cfg, resolve=True)
    assert OmegaConf.to_container(record) == OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(config.model, models.ModelConfig) and isinstance(config.optim, dict)
    assert optimizer_hparams(config.optim) == optimizer_hparams(cfg.optim)


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_a_gpu_on_a_machine_without_one_is_refused_before_compute(monkeypatch, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = cfg_for("+model=llama_tiny", "+optim=foam2", f"trainer.device={device}")
    message = expect_error(cfg, f"trainer.device={device}: torch sees no CUDA GPU here")
    assert "trainer.device=auto" in message
    check_config(cfg_for("+model=llama_tiny", "+optim=foam2", "trainer.device=cpu"), 1)


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


@pytest.mark.parametrize(
    ("optim", "override", "line"),
    [
        ("adamw", "optim.lr=-1e-3", "optim.lr=-0.001: lr must be >= 0"),
        ("foam2", "optim.alpha=-0.25", "optim.alpha=-0.25: alpha must be >= 0"),
        ("muon", "optim.betas=[0.9,1.0]", "optim.betas=[0.9, 1.0]: betas must be two numbers"),
    ],
)
def test_the_optimizer_rules_on_values_name_the_key_before_any_model(
    tiny_model, optim, override, line
):
    """The optimizer's rules on values (``foam.check_hparams``) are checked with the config, before
    data or model; building the optimizer applies the same rules, from the same home."""
    cfg = cfg_for("+model=llama_tiny", f"+optim={optim}", override)
    assert expect_error(cfg, line).startswith(line)
    with pytest.raises(ConfigError, match=re.escape(line)):
        build_optimizer(cfg.optim, tiny_model)


def test_invalid_fold_level(tiny_model):
    cfg = cfg_for("+model=llama_tiny", "+optim=foam2")
    build_optimizer(cfg.optim, tiny_model)
    with open_dict(cfg):
        cfg.optim.level = -1
    with pytest.raises(ConfigError, match=r"optim\.level=-1.*level must be an int >= 0"):
        build_optimizer(cfg.optim, tiny_model)


@pytest.mark.parametrize(
    ("override", "line"),
    [
        # the key comes with the optimizer's error: the message's own words do not matter
        ("optim.level=7", "optim.level=7: level 7 makes blocks of 128 entries"),
        ("optim.state_dtype=int8", "optim.state_dtype=int8: state_dtype must be a floating"),
        ("optim.semantics=draft", "optim.semantics=draft: semantics must be one of"),
    ],
)
def test_an_optimizer_error_names_the_key_it_carries(tiny_model, override, line):
    cfg = cfg_for("+model=llama_tiny", "+optim=foam2", override)
    with pytest.raises(ConfigError) as err:
        build_optimizer(cfg.optim, tiny_model)
    assert str(err.value).startswith(line), err.value
    assert str(err.value).count("optim.") == 1  # one key, not every key the message mentions


def test_configs_dir_is_the_repo_one():
    assert Path(__file__).resolve().parents[2] / "configs" == CONFIG_DIR


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

    def fill(model, build_whole, device, is_main):  # the real one's builds, no group here
        filled.append(build_whole() if is_main else None)

    monkeypatch.setattr(pretrain, "fill_from_rank0", fill)
    cfg = cfg_for("+model=llama_tiny", "+optim=foam2", "trainer.parallelism=fsdp")
    config, cpu = check_config(cfg, world_size=2), torch.device("cpu")
    model, *_ = pretrain.build_model_and_optimizer(
        config,
        DistInfo(rank=rank, world_size=2),
        cpu,
        plan_run(config.trainer, 2, cpu),
        initialise=not resuming,
    )
    whole = rank == 0 and not resuming
    assert built_on == (["meta", "cpu"] if whole else ["meta"])
    assert [w is not None for w in filled] == ([] if resuming else [rank == 0])
    if resuming:  # allocated for the checkpoint instead, on every rank
        assert not any(t.is_meta for t in model.state_dict().values())


def refused_run_dir(path: Path) -> Path:
    """What a command refused at its config leaves: Hydra's files, its log, the resolved config."""
    (path / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (path / ".hydra" / name).write_text("x: 1\n")
    (path / "pretrain.log").write_text("")
    (path / "config.yaml").write_text("x: 1\n")
    return path


def test_a_refused_run_takes_its_run_directory_back(tmp_path):
    run_dir = refused_run_dir(tmp_path / "run")
    discard_refused_run_dir(run_dir, "pretrain.log")
    assert not run_dir.exists() and tmp_path.exists()


@pytest.mark.parametrize(
    "extra", ["checkpoints/step_00000010/model.pt", "metrics.jsonl", ".hydra/multirun.yaml"]
)
def test_a_run_directory_with_anything_else_is_left_as_it_was(tmp_path, extra):
    """Resuming a run with a bad override, or a directory of the user's: nothing is deleted."""
    run_dir = refused_run_dir(tmp_path / "run")
    (run_dir / extra).parent.mkdir(parents=True, exist_ok=True)
    (run_dir / extra).write_text("keep")
    before = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*"))
    discard_refused_run_dir(run_dir, "pretrain.log")
    assert sorted(p.relative_to(run_dir) for p in run_dir.rglob("*")) == before


def test_the_working_directory_is_never_taken_back(tmp_path, monkeypatch):
    """``hydra.run.dir=.``: the files are the user's working directory's too."""
    run_dir = refused_run_dir(tmp_path / "run")
    monkeypatch.chdir(run_dir)
    discard_refused_run_dir(Path("."), "pretrain.log")
    assert (run_dir / "config.yaml").exists()


@pytest.mark.parametrize(
    ("parallelism", "precision", "world", "sharded", "autocast", "dtype"),
    [
        ("ddp", "bf16_mixed", 2, False, True, torch.float32),
        ("fsdp", "bf16_mixed", 2, True, False, torch.float32),  # FSDP2 casts by itself
        ("fsdp", "bf16_mixed", 1, False, True, torch.float32),  # one rank: never wrapped
        ("fsdp", "bf16", 4, True, False, torch.bfloat16),
        ("ddp", "fp32", 1, False, False, torch.float32),
    ],
)
def test_the_run_plan_decides_parallelism_once(
    parallelism, precision, world, sharded, autocast, dtype
):
    trainer = SimpleNamespace(
        parallelism=parallelism,
        precision=precision,
        compile=None,
        global_batch_size=8,
        micro_batch_size=2,
    )
    plan = plan_run(trainer, world, torch.device("cpu"))
    assert (plan.sharded, plan.autocast, plan.param_dtype) == (sharded, autocast, dtype)
    assert plan.accumulation == 8 // (2 * world) and plan.compiled is False


TRAIN = Path(__file__).resolve().parents[2] / "train"


def test_the_run_plan_is_the_only_reader_of_the_parallelism_rules():
    """The rules (train/parallelism.py, train/config.py) are applied once, in train/plan.py: no
    other module of the trainer re-derives sharding, autocast, compilation or the weights' dtype
    from the config, so a changed parallelism reaches every reader through the plan."""
    rules = {"shards_parameters", "uses_autocast", "compiles_layers", "PARAM_DTYPES"}
    homes = {"plan.py", "parallelism.py", "config.py"}
    readers = {
        path.relative_to(TRAIN).as_posix(): sorted(
            rules & set(re.findall(r"\w+", path.read_text()))
        )
        for path in TRAIN.rglob("*.py")
        if path.name not in homes
    }
    assert {path: names for path, names in readers.items() if names} == {}


def stand_ins(monkeypatch, module, results: dict) -> dict[str, tuple]:
    """Replace each name of ``results`` in ``module`` by a stand-in that records its last call's
    ``(args, kwargs)`` in the returned dict and returns its result (called, if callable)."""
    calls: dict[str, tuple] = {}

    def stand_in(name, result):
        def record(*args, **kwargs):
            calls[name] = (args, kwargs)
            return result(*args, **kwargs) if callable(result) else result

        return record

    for name, result in results.items():
        monkeypatch.setattr(module, name, stand_in(name, result))
    return calls


@pytest.mark.parametrize("planned", ["ddp", "fsdp"])
def test_a_changed_parallelism_reaches_every_reader_through_the_plan(monkeypatch, planned):
    """Two ranks, bf16_mixed, and a config that says the other parallelism than the plan: every
    reader of the trainer follows the plan (where the model is built and who fills it, what
    ``parallelize`` does, the step's and evaluation's autocast, evaluation's and
    the export's gather, the step-time trial). A reader that re-derived a fact from
    ``trainer.parallelism`` would follow the config instead."""
    import dataclasses

    from train import pretrain
    from train.distributed import DistInfo
    from train.metrics import PhasePeaks
    from train.state import TrainState

    other = {"ddp": "fsdp", "fsdp": "ddp"}[planned]
    cfg = cfg_for(
        "+model=llama_tiny", "+optim=adamw", f"trainer.parallelism={other}",
        "trainer.precision=bf16_mixed", "trainer.max_steps=1",
    )  # fmt: skip
    config = check_config(cfg, world_size=2)
    cpu, sharded = torch.device("cpu"), planned == "fsdp"
    plan = plan_run(dataclasses.replace(config.trainer, parallelism=planned), 2, cpu)
    calls = stand_ins(
        monkeypatch,
        pretrain,
        {
            "parallelize": lambda model, **kwargs: model,
            "fill_from_rank0": lambda model, *args, **kwargs: model.to_empty(device=cpu),
            "per_rank_memory_line": "",
            "log_model_and_optimizer": None,
            "train_step": (SimpleNamespace(), torch.tensor(0.0), {"lr": 1.0}),
            "evaluate": {"val_ppl": 1.0},
            "log_evaluation": None,
            "estimate_step_time": None,
            "run_summary": {},
            "unsharded_model": None,
        },
    )
    info = DistInfo(rank=1, world_size=2)  # not the main rank: nothing is written
    built = pretrain.build_model_and_optimizer(config, info, cpu, plan)
    run = pretrain.Run(
        config, info, cpu, PhasePeaks(cpu), Path("."), [], plan, *built, None, None, None, None
    )
    state = TrainState(world_size=2)
    guard = SimpleNamespace(policy=SimpleNamespace(reads_every_step=False))
    pretrain.step_once(run, state, SimpleNamespace(add=lambda *args: None), guard)
    pretrain.estimate_steps(run, state)
    pretrain.finish(run, state, SimpleNamespace(log=dict, close=dict), None)

    assert calls["parallelize"][1]["sharded"] is sharded
    assert ("fill_from_rank0" in calls) is sharded  # built on the meta device, filled by rank 0
    assert calls["evaluate"][1]["sharded"] is calls["unsharded_model"][1]["sharded"] is sharded
    assert calls["estimate_step_time"][0][0].plan is plan
    for reader in ("train_step", "evaluate"):  # FSDP2 casts by itself: no autocast then
        assert isinstance(calls[reader][1]["autocast"](), torch.autocast) is not sharded
