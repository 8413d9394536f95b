"""``make gpu-check OUT=DIR`` (scripts/gpu_check.py): the offline install never touches torch and
proves what it installed imports; the check writes each section into DIR as it ends, keeps a
timed-out step's whole output, reads issue 50's targets off its report, and without a GPU runs
its steps on the CPU at tiny sizes and says so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest

from tools import gpu_check, gpu_deps
from tools.gpu_check import TRAIN_METHODS, Report, run_step, targets
from tools.gpu_deps import REQUIRED, conflicting, distribution_of, install, missing

REPO = Path(__file__).resolve().parents[2]


def make_plan(*args: str) -> str:
    return subprocess.run(
        ["make", "-n", *args, "GPU_PYTHON=python3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.parametrize("target", ["gpu-check", "test-gpu"])
def test_the_gpu_targets_never_install_torch_or_build_a_venv(target):
    plan = make_plan(target)
    assert "venv" not in plan and "torch==" not in plan and "pip install" not in plan
    assert "scripts/gpu_check.py install" in plan and plan.count("python3 ") >= 2


def test_out_names_the_checks_folder_and_the_wheels_are_for_the_boxs_python():
    assert "scripts/gpu_check.py run --out /tmp/x" in make_plan("gpu-check", "OUT=/tmp/x")
    assert "--out" not in make_plan("gpu-check")
    wheels = subprocess.run(
        ["make", "-n", "--always-make", "gpu-wheels", "GPU_BOX_PYTHON=3.11"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "scripts/gpu_check.py wheels --dest gpu-wheels --box-python 3.11" in wheels


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
    """This environment has every required package: the install adds nothing, needs no wheels
    folder, and proves every package imports."""
    assert missing(REQUIRED | {"torch"}, sys.executable) == set()
    install(tmp_path / "no-wheels", tmp_path / "site", sys.executable)
    out = capsys.readouterr().out
    assert "nothing to install" in out
    assert f"{len(gpu_deps.IMPORTS)} packages import; pip check: " in out
    assert not (tmp_path / "site").exists()


def test_a_python_lacking_the_trainers_packages_is_told_which_folder_and_how(tmp_path):
    bare = shutil.which("python3")
    if bare is None or not missing(REQUIRED, bare):
        pytest.skip("no Python here lacks the trainer's packages")
    with pytest.raises(SystemExit, match=r"does not exist: make the folder .* `make gpu-wheels "):
        install(tmp_path / "absent", tmp_path / "site", bare)


def test_wheels_for_another_python_are_refused_with_the_fix(tmp_path):
    (tmp_path / "PYTHON").write_text("2.7\n")
    here = gpu_deps.python_version(sys.executable)
    with pytest.raises(SystemExit) as stop:
        install(tmp_path, tmp_path / "site", sys.executable)
    message = str(stop.value)
    assert f"{tmp_path} holds wheels for Python 2.7, this machine runs {here}" in message
    assert f"make gpu-wheels GPU_WHEELS={tmp_path} GPU_BOX_PYTHON={here}" in message


def test_pip_checks_complaints_name_the_distributions_to_replace():
    report = (
        "datasets 5.2.0 has requirement huggingface-hub>=1.0, but you have huggingface_hub 0.36.0.\n"
        "datasets 5.2.0 has requirement pyarrow>=21.0.0, but you have pyarrow 19.0.1.\n"
        "hydra-core 1.3.2 requires antlr4-python3-runtime, which is not installed.\n"
    )
    assert conflicting(report) == {"huggingface-hub", "pyarrow", "antlr4-python3-runtime"}
    assert conflicting("ok") == set()


def test_a_timed_out_step_keeps_its_whole_output_stderr_included(tmp_path):
    code = (
        "import sys, time; print('to stdout', flush=True); "
        "print('to stderr', file=sys.stderr, flush=True); time.sleep(60)"
    )
    step = run_step("slow", [sys.executable, "-c", code], 3, tmp_path / "logs")
    assert step.status == "timed out after 3 s"
    assert step.log == tmp_path / "logs" / "slow.log"
    assert "to stdout" in step.tail and "to stderr" in step.tail
    assert step.log.read_text() == step.tail
    assert 3 <= step.seconds < 30  # what a report says it took
    failed = run_step("fails", [sys.executable, "-c", "raise SystemExit(3)"], 30, tmp_path)
    assert failed.status == "failed (rc 3)"
    assert run_step("late", [sys.executable, "-c", ""], 0, tmp_path).status.startswith("not run")


def check_args(**given) -> Namespace:
    """``gpu_check.py run``'s arguments on the CPU, defaults but for ``given``."""
    return Namespace(**{"cpu": True, "run_budget_s": None, "sections": None, **given})


def test_each_training_run_has_its_own_budget_whatever_ran_before(tmp_path, monkeypatch):
    """A section that takes all it is allowed and overruns it by 5 s, then six training runs
    that each take all they are given: the section's allowance stops short of the runs'
    reserve (6 x 100 s of 1000), and every run gets the same share of what is left, at the
    reserve's 100 s but for the overrun."""
    clock = [0.0]
    monkeypatch.setattr(gpu_check, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    given: dict[str, float] = {}

    def greedy(mode, budget, out_dir):
        given["greedy"] = budget.left(10**6)
        clock[0] += given["greedy"] + 5
        return "## greedy\n"

    def run_step(name, cmd, timeout, logs, cwd=None):
        given[name] = timeout
        clock[0] += timeout
        logs.mkdir(parents=True, exist_ok=True)
        (logs / f"{name}.log").write_text("")
        return gpu_check.Step(f"timed out after {timeout:.0f} s", "", logs / f"{name}.log")

    monkeypatch.setattr(gpu_check, "run_step", run_step)
    monkeypatch.setattr(gpu_check, "SECTIONS", (greedy, gpu_check.training_runs))
    monkeypatch.setattr(gpu_check, "header", lambda mode, name, python: "# header\n\n")
    gpu_check.check(check_args(out=tmp_path / "out", budget_s=1000, bundle=False, run_budget_s=100))
    assert given.pop("greedy") == 400
    assert list(given) == [f"train_{method}" for method in gpu_check.TRAIN_METHODS]
    assert list(given.values()) == pytest.approx([595 / 6] * len(gpu_check.TRAIN_METHODS))
    report = (tmp_path / "out" / "report.md").read_text()
    assert report.count("timed out after 99 s") == len(gpu_check.TRAIN_METHODS)


def test_sections_picks_the_sections_a_command_runs(tmp_path, monkeypatch):
    ran = []

    def section(name: str):
        def run(mode, budget, out_dir):
            ran.append((name, budget.left(10**6)))
            return f"## {name}\n"

        run.__name__ = name
        return run

    monkeypatch.setattr(gpu_check, "SECTIONS", (section("one"), section("two")))
    monkeypatch.setattr(gpu_check, "header", lambda mode, name, python: "# header\n\n")
    gpu_check.check(check_args(out=tmp_path / "out", budget_s=60, bundle=False, sections=["two"]))
    assert [name for name, _ in ran] == ["two"]
    assert ran[0][1] == pytest.approx(60, abs=1)  # no training runs chosen: nothing reserved


def test_each_section_is_on_disk_before_the_next_starts(tmp_path, monkeypatch):
    """The report in OUT holds every finished section while the next runs (a check cut short
    by the device's limit loses only the section it was in)."""
    report_file = tmp_path / "out" / "report.md"
    seen = []

    def section(name: str):
        def run(mode, budget, out_dir):
            assert out_dir == tmp_path / "out"
            seen.append(report_file.read_text())
            return f"## {name}\n"

        return run

    monkeypatch.setattr(gpu_check, "SECTIONS", (section("one"), section("two")))
    monkeypatch.setattr(gpu_check, "header", lambda mode, name, python: "# header\n\n")
    out = gpu_check.check(check_args(out=tmp_path / "out", budget_s=60, bundle=False))
    assert out == tmp_path / "out"
    assert seen == ["# header\n\n", "# header\n\n## one\n\n"]
    text = report_file.read_text()
    assert text.startswith("# header\n\n## one\n\n## two\n\n## Targets (issue 50)")
    assert "* foam2 step / fused AdamW, llama_350m bf16: not measured (target <= 0.8)" in text


def test_a_bundled_check_leaves_the_report_and_one_archive_after_every_section(
    tmp_path, monkeypatch
):
    """``--bundle``: the sections work elsewhere; OUT holds report.md and check.tar.gz alone,
    the archive rewritten after each section (so a check cut short returns what it did) and
    without the runs' exported models."""
    out = tmp_path / "out"
    archived = []

    def section(name: str):
        def run(mode, budget, work_dir):
            assert work_dir != out
            if (out / gpu_check.BUNDLE).is_file():
                with tarfile.open(out / gpu_check.BUNDLE) as tar:
                    archived.append(sorted(tar.getnames()))
            (work_dir / "logs").mkdir(exist_ok=True)
            (work_dir / "logs" / f"{name}.log").write_text(name)
            (work_dir / "runs" / name / "hf").mkdir(parents=True)
            (work_dir / "runs" / name / "hf" / "model.safetensors").write_bytes(b"0" * 1000)
            (work_dir / "runs" / name / "summary.json").write_text("{}")
            return f"## {name}\n"

        return run

    monkeypatch.setattr(gpu_check, "SECTIONS", (section("one"), section("two")))
    monkeypatch.setattr(gpu_check, "header", lambda mode, name, python: "# header\n\n")
    gpu_check.check(check_args(out=out, budget_s=60, bundle=True))
    assert sorted(p.name for p in out.iterdir()) == ["check.tar.gz", "report.md"]
    assert archived == [["logs/one.log", "runs/one/summary.json"]]
    with tarfile.open(out / gpu_check.BUNDLE) as tar:
        assert sorted(tar.getnames()) == [
            "logs/one.log", "logs/two.log", "runs/one/summary.json", "runs/two/summary.json"
        ]  # fmt: skip
    assert "## one" in (out / "report.md").read_text()


def test_report_add_rewrites_the_file(tmp_path):
    report = Report(tmp_path / "r" / "report.md", "# h\n")
    report.add("## a")
    assert (tmp_path / "r" / "report.md").read_text() == "# h\n## a\n"


def test_the_targets_are_read_off_the_report():
    report = "\n".join(
        [
            "* llama_350m bf16: foam2 / fused AdamW = 0.74",
            "* llama_1b bf16: foam2 / fused AdamW = 0.83",
            "* llama_350m bf16: foam_mini / fused AdamW = 0.65",
            "### llama_60m, bf16, compiled model",
            "",
            "| optimizer | tokens/s | tokens/s / AdamW | x | y | z |",
            "| adamw | 330000 | 1.000 | - | 9000.0 | 1.000 |",
            "| foam2 | 328000 | 0.994 | - | 8900.0 | 0.990 |",
            "* foam2 / adamw, tokens/s at the cap (each at its faster setting) = 1.04",
        ]
    )
    text = targets(report)
    assert "* foam2 step / fused AdamW, llama_350m bf16 = 0.74 (target <= 0.8): met" in text
    assert "* foam2 step / fused AdamW, llama_1b bf16 = 0.83 (target <= 0.8): missed" in text
    assert "* foam_mini step / fused AdamW, llama_350m bf16 = 0.65 (target <= 0.7): met" in text
    assert "* foam_mini step / fused AdamW, llama_1b bf16: not measured" in text
    assert "* foam2 tokens/s / AdamW, llama_60m compiled = 0.99 (target >= 0.99): met" in text
    assert "* foam2 tokens/s / AdamW, llama_350m compiled: not measured" in text
    assert "* foam2 tokens/s / AdamW at the memory cap: 1.04" in text


def test_the_predicted_memory_is_at_the_runs_precision():
    """The CPU mode's fp32 runs are set against fp32 bytes, the GPU's bf16 runs against bf16."""
    bf16 = gpu_check.predicted_bytes("llama_tiny", "foam2", "bf16")
    assert gpu_check.predicted_bytes("llama_tiny", "foam2", "fp32") == 2 * bf16 > 0
    assert gpu_check.predicted_bytes("llama_tiny", "no_such_method", "bf16") is None


@pytest.mark.slow
def test_gpu_check_runs_its_steps_on_the_cpu_and_says_so(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            "make",
            "gpu-check",
            f"GPU_PYTHON={sys.executable}",
            f"GPU_WHEELS={tmp_path / 'wheels'}",
            f"GPU_SITE={tmp_path / 'site'}",
            f"OUT={out}",
            "GPU_CHECK_ARGS=--cpu --budget-s 2400",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (out / "report.md").read_text()
    assert "No GPU: the same steps on the CPU at tiny sizes" in text
    assert "huggingface-hub==" in text and "pyarrow==" in text and "pip check: " in text
    assert "## GPU tests" in text and "skipped" in text  # every gpu test needs CUDA
    assert "foam2 / fused AdamW" in text and "### llama_tiny, bf16" in text
    assert "## Optimizer step by matrix shape, llama_tiny" in text
    assert re.search(r"### llama_tiny, bf16, \d+ x \d+ \(\d+ matrices\)", text)
    assert "### llama_tiny, fp32, eager model" in text  # the end-to-end section, CPU-sized
    assert "Not run: it needs a CUDA device." in text  # the memory cap
    assert "## Targets (issue 50)" in text
    assert (out / "bench_optim.md").is_file() and (out / "logs" / "gpu_tests.log").is_file()
    # The training runs' table (the optimizer-step table above it has rows per method too).
    training = text.split("## Training runs")[1].split("\n## ")[0]
    rows = [line for line in training.splitlines() if line.startswith("| ")]
    steps_taken = {}
    for method in TRAIN_METHODS:
        (line,) = [r for r in rows if r.startswith(f"| {method} | ")]
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert re.fullmatch(r"ok, \d+ s", cells[1]), line
        assert float(cells[2]) > 0 and float(cells[6]) > 0 and float(cells[7]) > 0  # rates, MiB
        estimated, measured = (float(x) for x in cells[10].split(" / "))
        assert estimated > 0 and measured > 0  # the start-up estimate beside the measured step
        summary = json.loads((out / "runs" / method / "summary.json").read_text())
        assert cells[11] == (", ".join(sorted(set(summary["foam_steps"].values()))) or "-")
        steps_taken[method] = cells[11]
    assert steps_taken["foam2"] != "-" and steps_taken["adamw"] == "-"
