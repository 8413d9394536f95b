"""``scripts/bench_train.py``: the rotation of its rounds; with ``--memory-cap``, the search for
the largest micro-batch that fits (on a stand-in for the GPU's out-of-memory) and the report; the
CLI refuses the cap without a CUDA device."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.memory_cap import CapResult, Trial, cap_table, largest_fitting, search

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("limit", [1, 7, 32, 1024])
def test_the_search_finds_the_largest_size_that_fits_trying_each_size_once(limit):
    for threshold in range(0, 70):
        asked = []

        def fits(size: int, threshold=threshold, asked=asked) -> bool:
            assert 1 <= size <= limit
            asked.append(size)
            return size <= threshold

        assert largest_fitting(fits, limit) == min(threshold, limit)
        assert len(asked) == len(set(asked))  # no size tried twice
        assert len(asked) <= 2 * max(1, threshold).bit_length() + 1


def test_the_search_keeps_the_trial_of_the_size_it_found():
    def trial(size: int) -> Trial | None:
        return Trial(tokens_per_s=100.0 * size, peak_bytes=size * 2**20) if size <= 12 else None

    result = search("foam2", True, trial, limit=64)
    assert result == CapResult("foam2", True, 12, Trial(1200.0, 12 * 2**20))
    assert search("adamw", False, lambda size: None, limit=64).micro_batch == 0


def test_the_cap_table_sets_each_setting_against_the_baselines_same_setting():
    results = [
        CapResult("adamw", False, 8, Trial(1000.0, 900 * 2**20)),
        CapResult("foam2", False, 10, Trial(1100.0, 950 * 2**20)),
        CapResult("adamw", True, 32, Trial(800.0, 900 * 2**20)),
        CapResult("foam2", True, 40, Trial(880.0, 950 * 2**20)),
        CapResult("galore_1_4", False, 0, None),
        CapResult("galore_1_4", True, 0, None),
    ]
    text = cap_table("llama_350m", results, "adamw", seq_len=256)
    rows = [
        line.split("|")[1:-1]
        for line in text.splitlines()
        if line.startswith("| ") and "-|" not in line
    ]
    cells = {(r[0].strip(), r[1].strip()): [c.strip() for c in r[2:]] for r in rows[1:]}
    assert cells[("foam2", "off")] == ["10", "2560", "1100", "1.100", "950"]
    assert cells[("foam2", "on")][3] == "1.100" and cells[("adamw", "on")][3] == "1.000"
    assert cells[("galore_1_4", "off")] == ["0", "0", "-", "-", "-"]
    assert "* foam2 / adamw, tokens/s at the cap (each at its faster setting) = 1.10" in text
    assert "galore_1_4 / adamw" not in text  # nothing fit: no ratio


def test_the_memory_cap_needs_a_cuda_device():
    done = subprocess.run(
        [sys.executable, "scripts/bench_train.py", "--memory-cap", "8", "--device", "cpu"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --memory-cap needs a CUDA device (got --device cpu)"


def test_each_round_of_the_throughput_benchmark_starts_with_the_next_optimizer():
    from tools.bench_train import round_order

    runners = ["adamw", "foam2", "foam_mini"]
    firsts = [round_order(runners, i)[0] for i in range(4)]
    assert firsts == ["adamw", "foam2", "foam_mini", "adamw"]
    assert all(sorted(round_order(runners, i)) == sorted(runners) for i in range(4))


def test_a_trial_trains_the_real_model_at_each_size_the_search_asks_for():
    """The CUDA trial's code on the CPU (no cap to run out of: sizes above 3 stand for OOM): the
    trial at the size found is kept, its tokens/s and peak measured."""
    from tools import bench_train

    args = bench_train.parser().parse_args(
        ["--model", "llama_tiny", "--steps", "1", "--seq-len", "16", "--device", "cpu"]
    )
    runner = bench_train.build_runner(
        "foam2", bench_train.load_model_config("llama_tiny"), args, compiled=False
    )
    sizes = []

    def trial(size: int) -> Trial | None:
        sizes.append(size)
        return bench_train.cap_trial(runner, size, args) if size <= 3 else None

    result = search("foam2", False, trial, limit=8)
    assert result.micro_batch == 3 and sizes == [1, 2, 4, 3]
    assert result.trial.tokens_per_s > 0 and result.trial.peak_bytes > 0
