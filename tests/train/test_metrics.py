"""train/metrics.py: the MFU device table and peak memory per phase."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from train import metrics
from train.metrics import PhasePeaks, peak_flops_for_name, peak_memory, reset_peak_memory

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H100 NVL", 835e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA H200 NVL", 835e12),
        ("NVIDIA H800", 989e12),
        ("NVIDIA H800 PCIe", 756e12),
        ("NVIDIA GH200 480GB", 989e12),
        ("NVIDIA B200", 2250e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA L40", 181e12),  # a substring match took the L4 entry (MFU 1.5x too high)
        ("NVIDIA L40S", 362e12),
        ("NVIDIA RTX A6000", 155e12),
        ("NVIDIA A10", 125e12),
        ("NVIDIA A10G", None),  # not an A10: unknown rather than wrong
        ("NVIDIA GeForce RTX 4090", 165e12),
        ("Tesla V100-SXM2-32GB", 15.7e12),  # no bf16 tensor cores: 125e12 is its fp16 figure
        ("Tesla V100-PCIE-16GB", 14e12),
    ],
)
def test_device_table_matches_whole_words(name: str, expected: float | None) -> None:
    assert peak_flops_for_name(name) == expected


@pytest.mark.parametrize(
    ("name", "kind", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "tf32", 494e12),
        ("NVIDIA H100 80GB HBM3", "fp32", 67e12),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
        ("Tesla V100-SXM2-32GB", "tf32", 15.7e12),  # no TF32 either
    ],
)
def test_fp32_runs_are_scored_against_the_tf32_or_fp32_peak(name, kind, expected):
    assert peak_flops_for_name(name, kind) == expected


def test_the_matmul_kind_follows_the_precision_and_torchs_fp32_setting():
    before = torch.get_float32_matmul_precision()
    try:
        assert metrics.matmul_kind("bf16") == metrics.matmul_kind("bf16_mixed") == "bf16"
        torch.set_float32_matmul_precision("highest")
        assert metrics.matmul_kind("fp32") == "fp32"
        torch.set_float32_matmul_precision("high")
        assert metrics.matmul_kind("fp32") == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


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


@pytest.mark.parametrize(("state_dtype", "size"), [(None, 2), ("float32", 4), ("bfloat16", 2)])
def test_the_planned_state_is_sized_in_its_state_dtype(state_dtype, size):
    """bf16 weights with float32 moments hold twice the bytes of bf16 moments."""
    import foam

    model = torch.nn.Linear(8, 16, bias=False).to(torch.bfloat16)
    optimizer = foam.FOAM(model.parameters(), level=1, state_dtype=state_dtype)
    numel = foam.planned_state_numel(optimizer)
    assert metrics.planned_state_bytes(optimizer) == numel * size
    model(torch.ones(2, 8, dtype=torch.bfloat16)).sum().backward()
    optimizer.step()
    allocated = sum(metrics.bytes_by_dtype(metrics.optimizer_state_tensors(optimizer)).values())
    step_counters = sum(
        s["step"].numel() * s["step"].element_size() for s in optimizer.state.values()
    )
    assert allocated - step_counters == metrics.planned_state_bytes(optimizer)


def test_steady_figures_leave_out_each_segments_first_interval():
    from train.state import TrainState
    from train.summary import throughput, throughput_line

    state = TrainState(world_size=2)
    state.add_interval(tokens=100, token_slots=200, seconds=10.0, steady=False)  # compiling
    state.add_interval(tokens=900, token_slots=1000, seconds=1.0, steady=True)
    figures = throughput(state, flops_per_token=6, matmul_kind="bf16", peak_flops=1e3)
    assert figures["tokens_per_s"] == pytest.approx(1000 / 11)
    assert figures["tokens_per_s_steady"] == pytest.approx(900.0)
    assert figures["mfu"] == pytest.approx(6 * 1200 / 11 / 2 / 1e3)  # per device
    assert figures["mfu_steady"] == pytest.approx(6 * 1000 / 1 / 2 / 1e3)
    assert (figures["matmul_kind"], figures["peak_flops"]) == ("bf16", 1e3)
    assert "steady (after the first interval) 900 tokens/s, MFU 300.0%" in throughput_line(figures)
    cpu = throughput(state, flops_per_token=6, matmul_kind="fp32", peak_flops=None)
    assert cpu["mfu"] is cpu["mfu_steady"] is None
    fresh = throughput(TrainState(), flops_per_token=6, matmul_kind="bf16", peak_flops=1e3)
    assert fresh["tokens_per_s_steady"] is None


def test_the_cpu_is_named_with_its_family_model_and_stepping(tmp_path):
    from train.summary import cpu_model

    cpuinfo = tmp_path / "cpuinfo"
    block = "processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: {m}\n"
    block += "model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu avx2\n"
    cpuinfo.write_text(block.format(n=0, m=1) + "\n" + block.format(n=1, m=17))
    assert cpu_model(cpuinfo) == "AMD EPYC (cpu family 25, model 1, stepping 1)"  # the first CPU's
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\n")
    assert cpu_model(cpuinfo) == "Some CPU"
    assert cpu_model(tmp_path / "absent")  # platform.processor() or "unknown", never empty


def test_the_memory_line_states_this_ranks_share_and_the_whole_models():
    """One rank of a GaLore run: parameters and gradients all here, the state the optimizer's
    plan (projected moments, not two full moments), each beside the whole model's."""
    import foam

    model = torch.nn.Sequential(torch.nn.Linear(256, 128, bias=False), torch.nn.LayerNorm(128))
    optimizer = foam.build_optimizer("galore", model, lr=1e-3, rank=4)
    numel = sum(p.numel() for p in model.parameters())
    state = metrics.planned_state_bytes(optimizer)
    assert 0 < state < 2 * 4 * numel
    mib = numel * 4 / 2**20
    assert metrics.per_rank_memory_line(model, optimizer) == (
        f"params {mib:.2f} MiB (whole model {mib:.2f} MiB) | "
        f"grads {mib:.2f} MiB (whole model {mib:.2f} MiB) | "
        f"optimizer state {state / 2**20:.2f} MiB (whole model {state / 2**20:.2f} MiB)"
    )
