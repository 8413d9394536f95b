"""FSDP2 (``trainer.parallelism=fsdp``) on CPU with gloo: sharded training equals unsharded
training, FOAM's states are sharded with the weights, and methods that need whole matrices are
refused before any compute."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
PARITY = ["adamw", "foam", "foam_mini"]
TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"


def records(cmd: list[str]) -> dict[str, dict]:
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["optimizer"]: r for r in lines}


@pytest.fixture(scope="module")
def runs() -> tuple[dict[str, dict], dict[str, dict]]:
    """(2-rank FSDP2, 1 process unsharded) records of ``tests/fsdp_parity_worker.py``."""
    worker = ["tests/fsdp_parity_worker.py", *PARITY, "galore"]
    sharded = records([TORCHRUN, "--standalone", "--nproc_per_node", "2", *worker])
    single = records([sys.executable, *worker])
    return sharded, single


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", PARITY)
def test_two_rank_fsdp_equals_one_rank(runs, name):
    sharded, single = runs
    assert len(single[name]["losses"]) == 5
    assert sharded[name]["losses"] == pytest.approx(single[name]["losses"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", PARITY)
def test_each_rank_holds_half_of_the_moments(runs, name):
    sharded, single = runs
    assert 2 * sharded[name]["moment_bytes"] == single[name]["moment_bytes"] > 0


@pytest.mark.slow
@pytest.mark.distributed
def test_whole_matrix_method_is_refused_under_fsdp(runs):
    sharded, single = runs
    assert "losses" in single["galore"]
    message = sharded["galore"]["refused"]
    assert "'galore' does not support FSDP2" in message and "SVD" in message
    assert "trainer.parallelism=ddp" in message
