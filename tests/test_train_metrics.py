"""The estimated time per step logged before training, from the model's FLOPs and the device."""

import logging

import pytest
import torch

import models
from train import metrics

CPU = torch.device("cpu")


def test_a_paper_size_step_on_cpu_warns_and_points_at_the_cpu_presets(monkeypatch, caplog):
    monkeypatch.setattr(metrics, "measured_matmul_flops", lambda device, dtype: 1e11)
    flops = models.flops_per_token(models.load_model_config("llama_350m"), 256)
    with caplog.at_level(logging.INFO, logger="train.metrics"):
        seconds = metrics.log_step_time_estimate(flops, 512 * 256, CPU, torch.float32, 1000)
    assert seconds == pytest.approx(flops * 512 * 256 / 1e11)  # ~ 4 minutes a step
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "trainer=cpu_debug" in record.message and "llama_tiny" in record.message


def test_a_known_gpu_peak_is_used_at_the_assumed_utilisation(monkeypatch, caplog):
    monkeypatch.setattr(metrics, "peak_flops", lambda device: 1e15)
    with caplog.at_level(logging.INFO, logger="train.metrics"):
        seconds = metrics.log_step_time_estimate(10**9, 4000, CPU, torch.bfloat16, 10)
    assert seconds == pytest.approx(10**9 * 4000 / (1e15 * metrics.ASSUMED_MFU))
    (record,) = caplog.records
    assert record.levelno == logging.INFO and "1000 TFLOP/s" in record.message


def test_measured_matmul_rate_is_plausible():
    rate = metrics.measured_matmul_flops(CPU, torch.float32, n=128)
    assert 1e7 < rate < 1e14


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "0.25 s"), (119, "119 s"), (720, "12 min"), (18720, "5.2 h"), (3.7e7, "428 days")],
)
def test_durations_read_at_a_glance(seconds, text):
    assert metrics.format_duration(seconds) == text
