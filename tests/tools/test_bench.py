"""tools/bench_methods.py, scripts/bench_optim.py and bench_train.py: the optimizers they compare
are the ones a training run builds, and both benchmarks run end to end through their command
lines."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import foam
from foam.optimizer import FOAM
from models import build_model, load_model_config
from tools import bench_floor, bench_methods
from tools.bench_host_cost import report as host_cost_report

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(load_model_config("llama_tiny"))


def test_a_label_builds_its_optim_config_for_the_model(tiny_model):
    galore = bench_methods.builder("galore_1_4", "llama_tiny")(tiny_model)
    hidden = load_model_config("llama_tiny")["hidden_size"]
    config = OmegaConf.load(ROOT / "configs/optim/galore_1_4.yaml")
    projected = [g for g in galore.param_groups if g.get("rank")]
    assert projected and {g["rank"] for g in projected} == {int(hidden * config.rank_fraction)}
    assert {g["update_proj_gap"] for g in projected} == {config.update_proj_gap}


def test_eager_label_is_the_same_config_with_the_eager_step(tiny_model):
    fused = bench_methods.builder("foam3", "llama_tiny")(tiny_model)
    eager = bench_methods.builder("foam3_eager", "llama_tiny")(tiny_model)
    assert isinstance(eager, FOAM)
    folded = [g for g in eager.param_groups if g["level"] == 3]
    assert folded and all(g["implementation"] == "eager" for g in folded)
    assert {g["implementation"] for g in fused.param_groups} == {"auto"}
    assert "foam_muon_eager" not in bench_methods.available_labels()  # not a FOAM config


def test_torch_adamw_labels_and_an_unknown_label(tiny_model):
    fused = bench_methods.builder("adamw_fused", "llama_tiny")(tiny_model)
    assert isinstance(fused, torch.optim.AdamW) and fused.defaults["fused"]
    with pytest.raises(SystemExit, match="unknown optimizer 'adamw9'"):
        bench_methods.builder("adamw9", "llama_tiny")


def test_default_labels_cover_the_papers_tables():
    from repro.methods import TABLE2, TABLE3

    available = set(bench_methods.available_labels())
    assert set(bench_methods.DEFAULT_LABELS) <= available
    expected = {m.name for m in TABLE2} | set(TABLE3) | set(bench_methods.COMBINATIONS)
    assert expected <= set(bench_methods.DEFAULT_LABELS)


def run_script(script: str, *args: str, out: Path) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, f"scripts/{script}", *args, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.read_text() in done.stdout
    return done.stdout


def table_rows(report: str) -> dict[str, list[str]]:
    rows = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and not line.startswith("| method") and cells[1][:1].isdigit():
            rows.setdefault(cells[0], cells)
    return rows


def test_bench_optim_end_to_end(tmp_path):
    report = run_script(
        "bench_optim.py",
        *("--models", "llama_tiny", "--dtypes", "fp32", "--rounds", "1", "--steps", "1"),
        *("--methods", "adamw_fused", "adamw_foreach", "foam2", "foam2_eager", "galore_1_4"),
        out=tmp_path / "optim.md",
    )
    assert report.startswith(
        "# Optimizer step benchmark\n\nCommand: `python scripts/bench_optim.py --models llama_tiny "
    )
    assert re.search(
        r"\n\nDevice: cpu \(.+, [A-Z0-9 ]+; 1 threads\), torch ", report
    )  # bench_report
    assert "* llama_tiny fp32: foam2 / fused AdamW = " in report
    rows = table_rows(report)
    assert set(rows) == {"adamw_fused", "adamw_foreach", "foam2", "foam2_eager", "galore_1_4"}
    assert rows["adamw_fused"][2] == "1.00" and rows["adamw_foreach"][3] == "1.00"
    state_ratio = {label: float(cells[5]) for label, cells in rows.items()}
    assert state_ratio["adamw_foreach"] == 1.0
    assert state_ratio["foam2"] == state_ratio["foam2_eager"] < 1.0  # same state, another step


def test_bench_train_end_to_end(tmp_path):
    report = run_script(
        "bench_train.py",
        *("--model", "llama_tiny", "--rounds", "1", "--steps", "1", "--warmup", "1"),
        *("--batch-size", "2", "--seq-len", "32", "--optimizers", "adamw_fused", "foam2"),
        out=tmp_path / "train.md",
    )
    assert "Command: `python scripts/bench_train.py --model llama_tiny " in report
    assert re.search(r"\n\nDevice: cpu \(.+, [A-Z0-9 ]+; 1 threads\), torch ", report)
    rows = table_rows(report)
    assert set(rows) == {"adamw", "adamw_fused", "foam2"}  # AdamW, the baseline, always runs
    assert rows["adamw"][2] == "1.000" and rows["adamw_fused"][3] == "1.000"
    assert float(rows["foam2"][5]) < 1.0  # its state is smaller than AdamW's


def test_bench_optim_matrices_only_times_the_folded_update_alone(tmp_path):
    report = run_script(
        "bench_optim.py",
        *("--models", "llama_tiny", "--dtypes", "fp32", "--rounds", "1", "--steps", "1"),
        *("--methods", "adamw_fused", "foam2", "--matrices-only"),
        out=tmp_path / "matrices.md",
    )
    assert "**Matrices only**" in report
    # FOAM-2 keeps both moments as means of 4 entries: exactly a quarter of AdamW's state.
    assert table_rows(report)["foam2"][5] == "0.250"


def test_bench_optim_by_shape_times_each_matrix_shape_alone(tmp_path):
    """llama_tiny's matrices come in three shapes (q/k/v/o 64 x 64, gate/up 172 x 64, down
    64 x 172): a table each after the whole model's, with FOAM-2's state a quarter of AdamW's in
    each, since only that shape's matrices have gradients and so state."""
    report = run_script(
        "bench_optim.py",
        *("--models", "llama_tiny", "--dtypes", "fp32", "--rounds", "1", "--steps", "1"),
        *("--methods", "adamw_fused", "foam2", "--by-shape"),
        out=tmp_path / "shapes.md",
    )
    titles = [line for line in report.splitlines() if line.startswith("### ")]
    assert titles == [
        "### llama_tiny, fp32",
        "### llama_tiny, fp32, 64 x 64 (8 matrices)",
        "### llama_tiny, fp32, 172 x 64 (4 matrices)",
        "### llama_tiny, fp32, 64 x 172 (2 matrices)",
    ]
    assert "* llama_tiny fp32, 64 x 172 (2 matrices): foam2 / fused AdamW = " in report
    for section in report.split("### ")[2:]:
        assert table_rows(section)["foam2"][5] == "0.250"


def test_host_cost_runs_with_every_launch_stubbed():
    """Every Triton launch of a step is stubbed (a real one would fail on CPU tensors), so the
    benchmark reports both kernels; how fast is for the benchmark to say, not for a test."""
    report = host_cost_report(["llama_tiny"], rounds=1, steps=2)
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in report.splitlines()
        if line.startswith("| llama_tiny")
    ]
    assert [cells[2] for cells in rows] == ["cpp", "triton"]
    matrices = len(foam.split_params(build_model(load_model_config("llama_tiny"))).matrices)
    assert {int(cells[1]) for cells in rows} == {matrices}


def test_a_steps_byte_floor_counts_parameter_gradient_and_state_traffic():
    """A 4 x 8 bf16 parameter and its gradient, and 40 bytes of state: 64 bytes read and
    written, 64 read, 40 read and written."""
    p = torch.zeros(4, 8, dtype=torch.bfloat16)
    p.grad = torch.zeros(4, 8, dtype=torch.bfloat16)
    frozen = torch.zeros(3)  # no gradient: no step, no bytes
    assert bench_floor.step_bytes([p, frozen], state_bytes=40) == 2 * 64 + 64 + 2 * 40
    floor = bench_floor.Floor("m", best_ms=3.0, bytes_moved=2_000_000, params=1, bandwidth=1e9)
    assert floor.floor_ms == 2.0 and floor.ratio == 1.5 and floor.arithmetic_ratio is None


def test_a_step_whose_square_roots_and_divisions_exceed_its_floor_is_said_to_be_out_of_reach():
    """A million entries at 3 ns of square root and division each: 3 ms, 1.5x a 2 ms floor
    (flagged); at 2 ns, 1.0x (not flagged)."""
    slow, fast = (
        bench_floor.Floor("m", 4.0, 2_000_000, params=10**6, bandwidth=1e9, sqrt_div_ns=ns)
        for ns in (3.0, 2.0)
    )
    assert slow.arithmetic_ratio == pytest.approx(1.5) and fast.arithmetic_ratio == 1.0
    lines = bench_floor.headline("x", [slow, fast])
    assert lines[0] == (
        "* x: m step = 2.00x its byte floor (its square roots and divisions alone take 1.50x: "
        "no exact step is within 1.25x here)"
    )
    assert lines[1] == "* x: m step = 2.00x its byte floor"
    assert "| m | 4.00 | 2.0 | 2.00 | 2.00 | 1.50 | 1.00 |" in bench_floor.markdown(
        "x", [slow], "m"
    )


def test_sqrt_div_is_timed_where_a_compiler_builds_it_and_skipped_where_none_does(monkeypatch):
    ns = bench_floor.sqrt_div_ns(repeats=200, rounds=2)
    assert ns is not None and 0 < ns < 100
    monkeypatch.setenv("CC", "/nonexistent/cc")
    assert bench_floor.sqrt_div_ns(repeats=1, rounds=1) is None


def test_bench_optim_floor_reports_each_step_over_its_bytes(tmp_path):
    """``--floor`` times the matrices alone, with each method's bytes a parameter as counted by
    hand for llama_tiny's shapes (all divide by FOAM-2's blocks of 4): AdamW fp32 reads and
    writes parameter, two moments and reads the gradient, 28 bytes; FOAM-2 12 bytes for
    parameter and gradient and 2 x 2 x 4 / 4 for its folded moments."""
    report = run_script(
        "bench_optim.py",
        *("--floor", "--models", "llama_tiny", "--dtypes", "fp32", "--rounds", "1"),
        *("--steps", "1", "--bandwidth-mib", "16"),
        out=tmp_path / "floor.md",
    )
    assert report.startswith("# Optimizer step against its byte floor\n\nCommand: `python ")
    assert re.search(
        r"Copy bandwidth \(`a.add_\(b\)`, 2 x 16 MiB, best of 5\): [0-9.]+ GB/s", report
    )
    rows = table_rows(report)
    assert set(rows) == set(bench_floor.FLOOR_METHODS)
    assert rows["adamw_fused"][2] == "28.0" and rows["foam2"][2] == "16.0"
    assert 12.0 <= float(rows["foam_mini"][2]) < float(rows["foam3"][2]) < 16.0
    for method, cells in rows.items():
        best, floor, ratio = float(cells[1]), float(cells[3]), float(cells[4])
        half = 0.005  # the table's rounding of both times
        assert (best - half) / (floor + half) <= ratio <= (best + half) / max(floor - half, 1e-9)
        assert f"* llama_tiny fp32: {method} step = {cells[4]}x its byte floor" in report
        assert float(cells[5]) > 0  # square roots and divisions over the floor: measured
    assert re.search(
        r"Square root and division alone \(`tools/bench_floor.sqrt_div_ns`.*\): "
        r"[0-9.]+ ns an entry",
        report,
    )
