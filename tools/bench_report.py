"""What a benchmark report (``scripts/bench_optim.py``, ``scripts/bench_train.py``) states the same
way: the command that made it, the machine it ran on and how loaded that was, and where it goes.

A ratio against a baseline measured in the same run is only as good as the machine was quiet, and
a GPU's numbers are only comparable on the same card, so every report names both.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from train.summary import environment


def command_line() -> str:
    """The command as typed from the repository: ``python scripts/NAME.py ARGS``."""
    return f"python scripts/{Path(sys.argv[0]).name} {' '.join(sys.argv[1:])}".rstrip()


class Machine:
    """The device and the load average at the start; :meth:`describe` adds the load at the end."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.load_before = os.getloadavg()

    def describe(self) -> str:
        """The device as a run's summary records it (``train.summary.environment``): on a CPU
        its model and kernels' instruction set too, since CPU ratios move with both."""
        env = environment()
        name = f"{env['threads']} threads"
        if self.device.type == "cuda":
            name = f"{torch.cuda.get_device_name(self.device)}; {name}"
        else:
            name = f"{env['cpu']}, {env['cpu_capability']}; {name}"
        return (
            f"Device: {self.device} ({name}), torch {env['torch']}; load average (1/5/15 min) "
            f"{load(self.load_before)} at the start, {load(os.getloadavg())} at the end."
        )


def load(averages: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in averages)


def publish(report: str, out: Path | None) -> None:
    """Print ``report``; also write it to ``out`` when given (its folder made as needed)."""
    print(report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report)
