"""train/estimate.py: the time per step said before training and checked after the first interval."""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import pytest
import torch
from hydra import compose, initialize_config_dir

import models
from train import estimate
from train.config import check_config
from train.plan import plan_run
from train.schema import register_configs

CPU = torch.device("cpu")
CONFIG_DIR = models.CONFIG_DIR.parent


def run_config(*overrides: str):
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose("config", overrides=["+optim=foam2", "trainer=cpu_debug", *overrides])


def estimate_for(
    cfg, monkeypatch, matmul_rate: float, compiled: bool = False
) -> estimate.StepTimeEstimate:
    monkeypatch.setattr(estimate, "measured_matmul_flops", lambda device, dtype: matmul_rate)
    config = check_config(cfg, world_size=1)
    plan = dataclasses.replace(plan_run(config.trainer, 1, CPU), compiled=compiled)
    setup = estimate.StepSetup(config, CPU, plan, contextlib.nullcontext)
    return estimate.estimate_step_time(setup, steps=1000, is_main=True)


def test_a_paper_size_step_on_cpu_warns_and_points_at_the_cpu_presets(monkeypatch, caplog):
    cfg = run_config("+model=llama_350m", "trainer.global_batch_size=512")
    flops = models.flops_per_token(cfg.model, 256)
    with caplog.at_level(logging.INFO, logger="train.estimate"):
        result = estimate_for(cfg, monkeypatch, 1e11)
    assert result.seconds == pytest.approx(flops * 512 * 256 / 1e11)  # ~ 4 minutes a step
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "trainer=cpu_debug" in record.message and "llama_tiny" in record.message


def test_a_known_gpu_peak_is_used_at_the_assumed_utilisation(monkeypatch):
    monkeypatch.setattr(estimate, "peak_flops", lambda device, kind: 1e15 if kind == "bf16" else 0)
    seconds, how = estimate.flop_bound(10**9, 4000, CPU, "bf16")
    assert seconds == pytest.approx(10**9 * 4000 / (1e15 * estimate.ASSUMED_MFU))
    assert "1000 TFLOP/s bf16 peak" in how


def test_a_small_step_is_timed_on_a_copy_not_guessed_from_flops(monkeypatch, caplog):
    """At an absurd matmul rate the FLOP bound says nanoseconds; the trial times the real step
    (forward, backward, optimizer) and leaves the run's random stream where it was."""
    cfg = run_config("+model=llama_tiny", "data.seq_len=32", "trainer.micro_batch_size=2")
    torch.manual_seed(0)
    expected_draw = torch.rand(3)
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="train.estimate"):
        result = estimate_for(cfg, monkeypatch, 1e18)
    assert torch.equal(torch.rand(3), expected_draw)
    bound, _ = estimate.flop_bound(models.flops_per_token(cfg.model, 32), 8 * 32, CPU, "fp32")
    assert result.seconds > 1000 * bound  # a real step of forward + backward + update
    assert "timed on a copy of the model" in caplog.records[0].message


@pytest.mark.parametrize("compiled", [False, True])
def test_the_trial_compiles_its_copy_as_the_run_compiles_its_layers(monkeypatch, compiled):
    """A run that compiles (by default on a GPU) is timed compiled, or the trial would estimate
    the slower eager step. The copy's layers are compiled before it steps."""
    cfg = run_config("+model=llama_tiny", "data.seq_len=32", "trainer.micro_batch_size=2")
    compiled_models = []
    monkeypatch.setattr(estimate, "compile_decoder_layers", compiled_models.append)
    monkeypatch.setattr(estimate, "train_step", lambda model, *args, **kwargs: None)
    estimate_for(cfg, monkeypatch, 1e18, compiled=compiled)
    assert len(compiled_models) == int(compiled)
    assert all(isinstance(m, torch.nn.Module) for m in compiled_models)


@pytest.mark.parametrize("pack", [False, True])
def test_the_trial_batch_pads_a_token_unless_the_data_is_packed(pack):
    """Unpacked batches carry padding, hence an attention mask transformers keeps (another kernel
    and compiled graph than none); packed ones never do."""
    cfg = run_config("+model=llama_tiny", "data.seq_len=32", f"data.pack={str(pack).lower()}")
    batch = estimate.trial_batch(check_config(cfg, world_size=1))
    assert batch["input_ids"].shape == (cfg.trainer.micro_batch_size, 32)
    assert int((batch["attention_mask"] == 0).sum()) == (0 if pack else 1)
    assert torch.equal(batch["labels"] == -100, batch["attention_mask"] == 0)


def test_the_measured_time_is_logged_once_beside_the_estimate_after_step_one(caplog):
    result = estimate.StepTimeEstimate(0.1, "the FLOP bound")
    with caplog.at_level(logging.INFO, logger="train.estimate"):
        result.compare(step=1, steps=1, seconds=5.0)  # step 1 is warm-up: nothing
        result.compare(step=10, steps=9, seconds=1.8)
        result.compare(step=20, steps=10, seconds=3.0)
    (record,) = caplog.records
    assert record.message == (
        "time per optimizer step: 0.2 s measured over steps 2-10, 0.1 s estimated "
        "(the FLOP bound; x2.00)"
    )
    assert result.measured == pytest.approx(0.2)  # summary.json's step_s_measured


def test_measured_matmul_rate_is_plausible():
    rate = estimate.measured_matmul_flops(CPU, torch.float32, n=128)
    assert 1e7 < rate < 1e14


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "0.25 s"), (119, "119 s"), (720, "12 min"), (18720, "5.2 h"), (3.7e7, "428 days")],
)
def test_durations_read_at_a_glance(seconds, text):
    assert estimate.format_duration(seconds) == text
