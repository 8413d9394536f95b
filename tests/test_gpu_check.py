"""``make gpu-check`` (scripts/gpu_check.py): the offline install never touches torch, and without a
GPU the check runs its steps on the CPU at tiny sizes and says so."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repro import gpu_check
from repro.gpu_check import REQUIRED, TRAIN_METHODS, distribution_of, install, missing

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("target", ["gpu-check", "test-gpu"])
def test_the_gpu_targets_never_install_torch_or_build_a_venv(target):
    plan = subprocess.run(
        ["make", "-n", target, "GPU_PYTHON=python3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "venv" not in plan and "torch==" not in plan and "pip install" not in plan
    assert "scripts/gpu_check.py install" in plan and plan.count("python3 ") >= 2


@pytest.mark.parametrize(
    ("wheel", "name"),
    [
        ("hydra_core-1.3.2-py3-none-any.whl", "hydra-core"),
        ("antlr4_python3_runtime-4.9.3-py3-none-any.whl", "antlr4-python3-runtime"),
        ("multiprocess-0.70.16-py311-none-any.whl", "multiprocess"),
        ("PyYAML-6.0.2-cp311-cp311-manylinux_2_17_x86_64.whl", "pyyaml"),
    ],
)
def test_a_wheel_names_its_distribution(wheel, name):
    assert distribution_of(Path(wheel)) == name


def test_nothing_is_installed_where_the_python_has_everything(tmp_path, capsys):
    """This environment has every required package: the install adds nothing and needs no
    wheels folder."""
    assert missing(REQUIRED | {"torch"}, sys.executable) == set()
    install(tmp_path / "no-wheels", tmp_path / "site", sys.executable)
    assert "nothing to install" in capsys.readouterr().out
    assert not (tmp_path / "site").exists()


def test_a_python_lacking_the_trainers_packages_without_wheels_is_told_how_to_get_them(tmp_path):
    bare = shutil.which("python3")
    if bare is None or not missing(REQUIRED, bare):
        pytest.skip("no Python here lacks the trainer's packages")
    with pytest.raises(SystemExit, match=r"make gpu-wheels"):
        install(tmp_path / "empty", tmp_path / "site", bare)


@pytest.mark.slow
def test_gpu_check_runs_its_steps_on_the_cpu_and_says_so(tmp_path):
    report = tmp_path / "gpu_cpu.md"
    proc = subprocess.run(
        [
            "make",
            "gpu-check",
            f"GPU_PYTHON={sys.executable}",
            f"GPU_WHEELS={tmp_path / 'wheels'}",
            f"GPU_SITE={tmp_path / 'site'}",
            f"GPU_CHECK_ARGS=--cpu --out {report} --budget-s 2400",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = report.read_text()
    assert "No GPU: the same steps on the CPU at tiny sizes" in text
    assert "## GPU tests" in text and "skipped" in text  # every gpu test needs CUDA
    assert "foam2 / fused AdamW" in text and "### llama_tiny, bf16" in text
    # The training runs' table (the optimizer-step table above it has rows per method too).
    training = text.split("## Training runs")[1].split("\n## ")[0]
    rows = [line for line in training.splitlines() if line.startswith("| ")]
    for method in TRAIN_METHODS:
        (line,) = [r for r in rows if r.startswith(f"| {method} | ")]
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == "ok", line
        assert float(cells[2]) > 0 and float(cells[6]) > 0 and float(cells[7]) > 0  # rates, MiB
        estimated, measured = (float(x) for x in cells[10].split(" / "))
        assert estimated > 0 and measured > 0  # the start-up estimate beside the measured step


def test_the_predicted_memory_is_at_the_runs_precision():
    """The CPU mode's fp32 runs are set against fp32 bytes, the GPU's bf16 runs against bf16."""
    bf16 = gpu_check.predicted_bytes("llama_tiny", "foam2", "bf16")
    assert gpu_check.predicted_bytes("llama_tiny", "foam2", "fp32") == 2 * bf16 > 0
    assert gpu_check.predicted_bytes("llama_tiny", "no_such_method", "bf16") is None
