"""train/metrics.py: the MFU device table and peak memory per phase."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from train.metrics import PhasePeaks, peak_flops_for_name, peak_memory, reset_peak_memory

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40", 181e12),  # a substring match took the L4 entry (MFU 1.5x too high)
        ("NVIDIA L40S", 362e12),
        ("NVIDIA RTX A6000", 155e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA A10G", None),  # not an A10: unknown rather than wrong
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("Tesla V100-SXM2-32GB", 125e12),
        ("NVIDIA B200", None),
    ],
)
def test_device_table_matches_whole_words(name: str, expected: float | None) -> None:
    assert peak_flops_for_name(name) == expected


def _touch(megabytes: int) -> None:
    """Make the process's resident set grow by about ``megabytes`` for a moment."""
    block = np.ones(megabytes * 2**20 // 8)
    block.sum()


def test_cpu_peak_restarts_after_a_reset() -> None:
    reset_peak_memory(CPU)
    _touch(200)
    high = peak_memory(CPU)["peak_memory_bytes"]
    reset_peak_memory(CPU)
    low = peak_memory(CPU)["peak_memory_bytes"]
    assert high - low > 150 * 2**20


def test_train_peak_excludes_setup_and_eval() -> None:
    peaks = PhasePeaks(CPU)
    _touch(300)  # set-up: say, an fp32 initialisation
    peaks.enter("train")
    _touch(20)
    peaks.enter("eval")
    _touch(200)
    peaks.enter("train")
    _touch(50)
    record = peaks.record()
    by_phase = record["peak_memory_by_phase"]
    assert set(by_phase) == {"setup", "train", "eval"}
    assert record["peak_memory_bytes"] == by_phase["train"]["peak_memory_bytes"]
    assert by_phase["setup"]["peak_memory_bytes"] - record["peak_memory_bytes"] > 200 * 2**20
    assert by_phase["eval"]["peak_memory_bytes"] - record["peak_memory_bytes"] > 100 * 2**20
