"""Launches ``tests/helpers/fsdp_parity_worker.py`` twice, as 2 FSDP2 ranks under torchrun and as
one unsharded process, for the tests that compare the two runs' records."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.helpers.cli import REPO, TORCHRUN

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
WORKER = "tests/helpers/fsdp_parity_worker.py"


def records(cmd: list[str]) -> dict[str, dict]:
    """The worker's JSON records by optimizer, from the run of ``cmd`` in the repository."""
    proc = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["optimizer"]: r for r in lines}


def sharded_and_single(*methods: str) -> tuple[dict[str, dict], dict[str, dict]]:
    """(2-rank FSDP2, 1 process unsharded) records of the worker for ``methods``."""
    sharded = records([TORCHRUN, "--standalone", "--nproc_per_node", "2", WORKER, *methods])
    single = records([sys.executable, WORKER, *methods])
    return sharded, single
