"""The fused FOAM step (foam/fused.py: C++ on the CPU, Triton on CUDA) against the eager step.

fp32 must agree to 1e-6 relative (at the tensor's scale) and bf16 to one bf16 rounding, over
several steps, for every option, level, fold axis and divisible or non-divisible shape. The
Triton kernel runs in its CPU interpreter (``TRITON_INTERPRET=1``) when triton is installed.
"""

import copy
import importlib.util
import itertools
import os
import platform
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from foam import FOAM, OptionError, fused, steps_run
from foam.folding import make_plan
from tests.helpers.agreement import assert_agree

# wide, tall, non-divisible, 3-d; then blocks of 16 (level 4) with a shorter tail, not run at
# "mini": one 40-entry block without R^2 in V divides by |block mean|, so two summation orders of
# that mean (torch's and the kernel's, both exact to fp32) can differ by more than 1e-6 relative
# in the update wherever the mean nearly cancels.
SHAPES = [(8, 16), (16, 8), (10, 7), (7, 10), (3, 4, 6)]
LONG_SHAPES = [(16, 40), (40, 16)]
OPTIONS = [
    {},
    {"weight_decay": 0.1},
    {"residual": 0.5, "second_moment": "mean_of_squares"},
    {"residual_in_second_moment": False},
    {"residual": False},
    {"fold_axis": "last", "bias_correction": False},
    {"state_dtype": "float32"},
]
DTYPES = [torch.float32, torch.bfloat16]
STEPS = 4
CASES = [
    (shape, level, dtype, options)
    for shape, level, dtype, options in [
        *itertools.product(SHAPES, [1, 2, 3, "mini"], DTYPES, OPTIONS),
        *itertools.product(LONG_SHAPES, [2, 3, 4], DTYPES, OPTIONS),
    ]
    if level == "mini" or 2**level <= min(shape[0], shape[-1])
]


def needs_cpu_kernel() -> None:
    if not fused.kernel_available("cpu"):
        pytest.fail("the fused CPU kernel did not build (see the log)")


def starts(shapes, dtype) -> list[torch.Tensor]:
    """Fixed starting matrices. Of several, the first is a view one entry into its storage, so
    the Triton launch that holds it cannot assume 16-byte alignment."""
    torch.manual_seed(0)
    if len(shapes) == 1:
        return [torch.randn(shapes[0]).to(dtype)]
    first = torch.randn(torch.Size(shapes[0]).numel() + 1).to(dtype)[1:].view(shapes[0])
    return [first, *(torch.randn(shape).to(dtype) for shape in shapes[1:])]


def gradients(shapes, dtype, generator: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]


def run_all(implementation: str, shapes, dtype, lrs=(1e-2,) * STEPS, **options):
    """``STEPS`` steps of a FOAM over matrices of ``shapes`` from a fixed start, at the learning
    rates ``lrs``; each one's parameter and states."""
    params = [torch.nn.Parameter(p) for p in starts(shapes, dtype)]
    optimizer = FOAM(params, implementation=implementation, **options)
    generator = torch.Generator().manual_seed(1)
    for lr in lrs:
        for p, g in zip(params, gradients(shapes, dtype, generator), strict=True):
            p.grad = g
        optimizer.param_groups[0]["lr"] = lr
        optimizer.step()
    return [
        (p.detach(), optimizer.state[p]["exp_avg"], optimizer.state[p]["exp_avg_sq"])
        for p in params
    ]


def run(implementation: str, shape, dtype, **options):
    """One matrix through ``run_all``: its parameter and states."""
    return run_all(implementation, [shape], dtype, **options)[0]


@pytest.mark.parametrize(("shape", "level", "dtype", "options"), CASES)
def test_cpu_kernel_matches_eager(shape, level, dtype, options):
    needs_cpu_kernel()
    expected = run("eager", shape, dtype, level=level, **options)
    actual = run("fused", shape, dtype, level=level, **options)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == e.dtype
        assert_agree(a, e, dtype)


@pytest.mark.parametrize(
    ("shape", "axis", "block"),
    [((6, 40), 1, 4), ((40, 6), 0, 4), ((40, 6), 0, 40), ((6, 40), 1, 40)],
    ids=["columns", "short-rows", "tall", "whole-rows"],
)
def test_a_nan_gradient_leaves_a_nan_bfloat16_parameter(shape, axis, block):
    """A NaN whose low mantissa bits are all ones (a float32 gradient's payload) rounds to
    -0.0 by the bit arithmetic of round-to-nearest-even alone: the bfloat16 parameter it
    reaches must stay NaN, as torch's conversion keeps it, not turn into a number."""
    needs_cpu_kernel()
    rows, cols = shape
    p = torch.ones(shape, dtype=torch.bfloat16)
    g = torch.full(shape, 0.5)
    g.view(torch.int32)[2, 3] = 0x7FFFFFFF
    blocks = (rows, -(-cols // block)) if axis == 1 else (-(-rows // block), cols)
    m, v = torch.zeros(blocks, dtype=torch.bfloat16), torch.zeros(blocks, dtype=torch.bfloat16)
    geometry = [rows, cols, axis, block]
    scalars = [0.9, 0.95, 1.0, 1.0, 1e-8, 1e-3, 1.0]
    torch.ops.foam.step_([p], [g], [m], [v], geometry, [0.1, 0.05], scalars, False)
    assert torch.isnan(p[2, 3])
    assert torch.isfinite(p[0, 0]) and torch.isfinite(p[-1, -1])  # other blocks: numbers


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("level", [2, "mini"])
def test_cpu_kernel_results_do_not_depend_on_the_thread_count(level, dtype):
    """1, 2 and 3 threads split a tall matrix's columns (FOAM-Mini folds along its 1300 rows:
    one, two and three slices) and its row blocks (FOAM-2) differently; every sum still runs in
    the same order, so the results are the same bits."""
    needs_cpu_kernel()
    before = torch.get_num_threads()
    try:
        outcomes = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outcomes.append(run("fused", (1300, 1100), dtype, level=level))
    finally:
        torch.set_num_threads(before)
    for outcome in outcomes[1:]:
        for a, e in zip(outcome, outcomes[0], strict=True):
            assert torch.equal(a, e)


def vector_shape(kind: str, level: int | str, width: int) -> tuple[int, int]:
    """A shape sized by the CPU step's vector width (8 with AVX2), so that each of its paths
    meets whole vectors, leftovers and tails on whatever CPU runs the test. ``cols``: blocks of
    K = 2**level entries along the rows as two groups of ``width`` blocks, three blocks more and
    a one-entry tail; ``rows``: blocks of rows over columns that are not a whole number of
    vectors; ``mini``: FOAM-Mini over 300 rows and 600 columns (more than one 512-column slice,
    the last one short)."""
    if kind == "cols":
        k = 2**level
        return (3, 2 * k * width + 3 * k + 1)
    if kind == "rows":
        return (4 * 2**level + 3, 6 * width + 5)
    return {"llama_1b": (2, 5461), "mini": (300, 600)}[kind]


VECTOR_CASES = [
    *((kind, level, "larger") for kind in ("cols", "rows") for level in (1, 2, 3, 4)),
    ("llama_1b", 2, "larger"),  # LLaMA-1B's rows: 5461 entries, no whole number of vectors
    ("llama_1b", 3, "larger"),
    ("mini", "mini", "larger"),  # folded along its 300 rows
    ("mini", "mini", "last"),  # along its 600 columns
]
HEAVY = {"residual": 0.5, "second_moment": "mean_of_squares", "weight_decay": 0.1}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", [{}, HEAVY], ids=["paper", "heavy"])
@pytest.mark.parametrize(("kind", "level", "fold_axis"), VECTOR_CASES)
def test_cpu_kernel_matches_eager_at_vector_tails(kind, level, fold_axis, options, dtype):
    needs_cpu_kernel()
    shape = vector_shape(kind, level, fused.cpu_vector_width())
    settings = {"level": level, "fold_axis": fold_axis, **options}
    expected = run("eager", shape, dtype, **settings)
    actual = run("fused", shape, dtype, **settings)
    for a, e in zip(actual, expected, strict=True):
        assert_agree(a, e, dtype)


def test_vector_width_is_the_isa_the_build_targets():
    """The width comes from the instruction set the compiler targeted (-march=native), which
    torch's own CPU kernels report as their capability on the same CPU: AVX2's 8 on any x86 CPU
    that has it, AVX-512 included (the step's shuffles are written for 256-bit vectors)."""
    needs_cpu_kernel()
    capability = torch.backends.cpu.get_cpu_capability()
    portable = 4 if platform.machine() in ("arm64", "aarch64") else 8  # NEON; ATen's 32 bytes
    assert fused.cpu_vector_width() == {"AVX512": 8, "AVX2": 8}.get(capability, portable)


def test_auto_uses_the_kernel_and_level_zero_stays_eager(monkeypatch):
    needs_cpu_kernel()
    calls = []

    def kernel_group(kernel, params, *tensors):
        calls.append(len(params))
        return SimpleNamespace(step=lambda *step: None)

    monkeypatch.setattr(fused, "kernel_group", kernel_group)
    matrices = [torch.nn.Parameter(torch.randn(8, 8)) for _ in range(3)]
    for p in matrices:
        p.grad = torch.randn(8, 8)
    FOAM(matrices, level=2).step()
    assert calls == [3]  # one batched call for the group
    FOAM(matrices, level=0).step()
    FOAM(matrices, level=2, implementation="eager").step()
    assert calls == [3]


def test_fused_step_allocates_nothing_beyond_state():
    """No full-size temporary is allocated through torch (the eager step allocates two: 128 KiB
    here). The kernel's own scratch, a few rows per thread, is invisible to the tracker."""
    needs_cpu_kernel()
    from foam.profiling import peak_transient_bytes

    p = torch.nn.Parameter(torch.randn(64, 256))
    p.grad = torch.randn(64, 256)
    optimizer = FOAM([p], level=2, implementation="fused")
    optimizer.step()
    peak, kept = peak_transient_bytes(optimizer.step)
    assert peak - kept < p.numel() * p.element_size() // 4


def test_bad_implementation_is_a_clear_error():
    with pytest.raises(ValueError, match="implementation must be one of"):
        FOAM([torch.nn.Parameter(torch.randn(4, 4))], implementation="cuda")


TRITON_CASES = [c for c in CASES if c[2] == torch.bfloat16 or c[3] in ({}, OPTIONS[2])][::3]
# Several matrices in one call, grouped into launches by shape: blocks longer than a tile holds
# ("mini" of a 300-entry axis: two passes, along the columns and along the rows, with a shorter
# last chunk), several blocks to a tile with a tail (level 3 of 300), an unaligned first matrix;
# and rows of no whole 128-bit vectors (300 wide), whose entries move one at a time.
TRITON_GROUPS = [
    ([(12, 300), (300, 12), (12, 300), (24, 20), (300, 12)], level, dtype, options)
    for level, dtype, options in [
        ("mini", torch.bfloat16, {"state_dtype": "float32"}),
        ("mini", torch.float32, {"second_moment": "mean_of_squares"}),
        (3, torch.bfloat16, {}),
    ]
]
# More widths of no whole vectors (20, 37, 45, 133) in blocks of 2 to 16 that end short of a row's
# end, folded along them or across (slow: some seconds in the interpreter).
UNALIGNED_MORE = [
    ([(20, 37), (37, 20), (9, 45), (9, 133)], level, dtype, options)
    for level, dtype, options in [
        (2, torch.bfloat16, {}),
        (1, torch.float32, {"fold_axis": "last", "second_moment": "mean_of_squares"}),
        (4, torch.bfloat16, {"state_dtype": "float32", "weight_decay": 0.1}),
    ]
]


# A launch taken once and replayed with scalars written in place, under a changing lr.
SCHEDULE = (1e-2, 2e-2, 5e-3, 1e-3)
# LLaMA-1B's down-projection rows, 5461 entries (no whole vector of any width, a tail of 1 in
# blocks of 4 and 5 in blocks of 8), and its transpose folded along the 5461 rows.
LLAMA_1B_ROWS = [
    ([(3, 5461), (5461, 3)], level, dtype, options)
    for level, dtype, options in [
        (2, torch.bfloat16, {}),
        (3, torch.bfloat16, {"state_dtype": "float32", "weight_decay": 0.1}),
        (2, torch.float32, {"second_moment": "mean_of_squares"}),
    ]
]
REPLAYED = [
    ([(12, 300), (24, 20)], 2, torch.bfloat16, {"weight_decay": 0.1}),
    ([(10, 7)], "mini", torch.float32, {"second_moment": "mean_of_squares"}),
]


def triton_run(shapes, level, dtype, moment_dtype: torch.dtype, **options):
    """``run_all``'s steps through one Triton kernel group made before the first (all matrices in
    one launch a step, the gradients fresh tensors each time)."""
    params = starts(shapes, dtype)
    optimizer = FOAM([torch.nn.Parameter(p) for p in params], lr=1e-2, level=level, **options)
    group = optimizer.param_groups[0]
    plans = [make_plan(p.shape, level, group["fold_axis"]) for p in params]
    exp_avgs = [torch.zeros(plan.folded_shape, dtype=moment_dtype) for plan in plans]
    exp_avg_sqs = [torch.zeros_like(m) for m in exp_avgs]
    scalars = fused.StepScalars.of_group(group)
    kernel = fused.kernel_group("triton", params, exp_avgs, exp_avg_sqs, plans)
    generator = torch.Generator().manual_seed(1)
    for t in range(1, STEPS + 1):
        corrections = (1 - 0.9**t, 1 - 0.95**t) if group["bias_correction"] else (1.0, 1.0)
        kernel.step(gradients(shapes, dtype, generator), corrections, scalars)
    return list(zip(params, exp_avgs, exp_avg_sqs, strict=True))


def replayed_run(shapes, level, dtype, moment_dtype: torch.dtype, lrs, **options):
    """``run_all``'s steps as a CUDA graph would replay them: the step's launch is taken once,
    before the first step, with the gradients in buffers that every step refills; each step
    writes only its scalars (bias corrections, the scheduled ``lrs``) and runs that launch."""
    from foam import triton_kernels  # in the interpreter's process only

    params = starts(shapes, dtype)
    optimizer = FOAM([torch.nn.Parameter(p) for p in params], level=level, **options)
    group = optimizer.param_groups[0]
    plans = [make_plan(p.shape, level, group["fold_axis"]) for p in params]
    exp_avgs = [torch.zeros(plan.folded_shape, dtype=moment_dtype) for plan in plans]
    exp_avg_sqs = [torch.zeros_like(m) for m in exp_avgs]
    kernel = fused.kernel_group("triton", params, exp_avgs, exp_avg_sqs, plans)
    buffers = [torch.zeros(shape, dtype=dtype) for shape in shapes]
    grid, args, constants = kernel.launch(buffers, group["second_moment"] == "mean_of_squares")
    scalars_at = kernel.scalars.data_ptr()
    generator = torch.Generator().manual_seed(1)
    for t, lr in enumerate(lrs, start=1):
        for buffer, g in zip(buffers, gradients(shapes, dtype, generator), strict=True):
            buffer.copy_(g)
        group["lr"] = lr
        corrections = (1 - 0.9**t, 1 - 0.95**t) if group["bias_correction"] else (1.0, 1.0)
        scalars = fused.StepScalars.of_group(group)
        kernel.write_scalars(corrections, scalars)
        expected = torch.tensor([*corrections, *scalars.as_list()], dtype=torch.float32)
        assert torch.equal(kernel.scalars, expected) and kernel.scalars.data_ptr() == scalars_at
        triton_kernels._foam_step_kernel[grid](*args, **constants)
    return list(zip(params, exp_avgs, exp_avg_sqs, strict=True))


def check_cases(cases) -> None:
    """Each case through the Triton kernel against the eager step; run by the tests below in a
    fresh process, since the interpreter must be chosen before triton loads."""
    for shapes, level, dtype, options in cases:
        expected = run_all("eager", shapes, dtype, level=level, **options)
        actual = triton_run(shapes, level, dtype, expected[0][1].dtype, **options)
        for matrix, reference in zip(actual, expected, strict=True):
            for a, e in zip(matrix, reference, strict=True):
                assert_agree(a, e, dtype)
    print(f"{len(cases)} cases agree")


def check_triton_kernel() -> None:
    """Every ``TRITON_CASES`` and ``TRITON_GROUPS`` case, the replayed launches and the probe."""
    check_cases([([shape], *rest) for shape, *rest in TRITON_CASES] + TRITON_GROUPS)
    for shapes, level, dtype, options in REPLAYED:
        expected = run_all("eager", shapes, dtype, lrs=SCHEDULE, level=level, **options)
        actual = replayed_run(shapes, level, dtype, expected[0][1].dtype, SCHEDULE, **options)
        for matrix, reference in zip(actual, expected, strict=True):
            for a, e in zip(matrix, reference, strict=True):
                assert_agree(a, e, dtype)
    print(f"{len(REPLAYED)} replayed launches agree")
    assert fused.triton_runs(torch.device("cpu"))  # the probe kernel_available("cuda") runs
    print("the probe passes")


def test_one_launch_steps_every_matrix_of_any_shape():
    """FOAM-2 of a LLaMA layer's seven matrices (three shapes, folded along the columns or the
    rows) is one launch: a program per tile of each matrix, each program's matrix in a table
    made with the group, a kernel branch per tile kind."""
    triton_kernels = pytest.importorskip("foam.triton_kernels")
    shapes = [(64, 64)] * 4 + [(172, 64)] * 2 + [(64, 172)]
    plans = [make_plan(shape, 2, "larger") for shape in shapes]
    params = [torch.zeros(shape) for shape in shapes]
    states = [torch.zeros(plan.folded_shape) for plan in plans]
    group = triton_kernels.TritonGroup(params, states, states, plans)
    (programs,), _, constants = group.launch(params, False)
    tiles = [triton_kernels.Tiles.of(plan) for plan in plans]
    assert programs == sum(t.programs for t in tiles)
    assert group.owner.bincount().tolist() == [t.programs for t in tiles]
    assert constants["KINDS"] == tuple(dict.fromkeys(t.kind for t in tiles))
    assert {kind[0] for kind in constants["KINDS"]} == {True, False}  # both fold axes
    firsts = group.table[:, 8].tolist()
    assert firsts == [sum(t.programs for t in tiles[:k]) for k in range(len(tiles))]


def test_a_launch_addresses_each_matrix_from_the_first_and_vectorises_only_aligned_ones():
    """The table holds each matrix's parameter, m and v element offsets from the launch's first
    tensors, the gradients' are refreshed by a step where they moved, and a tensor list gets a
    128-bit vector hint only when every address in it is 16-byte aligned (here: views into one
    buffer, at hand-picked element offsets)."""
    triton_kernels = pytest.importorskip("foam.triton_kernels")
    plan = make_plan((4, 8), 2, "larger")
    buffer = torch.zeros(256)  # the caching allocators' blocks are 16-byte aligned
    params = [buffer[0:32].view(4, 8), buffer[32:64].view(4, 8)]
    grads = [buffer[100:132].view(4, 8), buffer[65:97].view(4, 8)]  # offset -35
    m = [buffer[136:144].view(plan.folded_shape), buffer[149:157].view(plan.folded_shape)]
    v = [buffer[160:168].view(plan.folded_shape), buffer[168:176].view(plan.folded_shape)]
    group = triton_kernels.TritonGroup(params, m, v, [plan, plan])
    _, args, constants = group.launch(grads, False)
    assert group.table[:, :3].tolist() == [[0, 0, 0], [32, 13, 8]]
    assert args[5].tolist() == [0, -35]
    # float32: 4 elements to a 16-byte vector; the second gradient and m start off it
    assert (constants["P_ALIGN"], constants["G_ALIGN"], constants["S_ALIGN"]) == (4, 1, 1)
    _, args, constants = group.launch(params, False)  # the gradients moved
    assert args[5].tolist() == [0, 32] and constants["G_ALIGN"] == 4
    bf16 = [t.to(torch.bfloat16) for t in params]  # fresh, aligned storages
    _, _, constants = triton_kernels.TritonGroup(bf16, v, m, [plan, plan]).launch(
        bf16, False
    )  # both moments decide the states' hint: here the second one is misaligned
    assert (constants["P_ALIGN"], constants["G_ALIGN"], constants["S_ALIGN"]) == (8, 8, 1)


def test_a_warm_launch_is_the_same_launch_at_every_step(monkeypatch):
    """Once the gradients stay put, a step's launch allocates nothing, copies nothing to the
    device and passes the very same arguments (so a CUDA graph can capture it): what changes
    between steps is the contents of the group's scalars tensor, written in place by
    ``write_scalars`` (checked in the interpreter by ``replayed_run``)."""
    triton_kernels = pytest.importorskip("foam.triton_kernels")
    plans = [make_plan(shape, 2, "larger") for shape in ((8, 16), (16, 8))]
    params = [torch.zeros(plan.rows, plan.cols) for plan in plans]
    grads = [torch.zeros_like(p) for p in params]
    states = [torch.zeros(plan.folded_shape) for plan in plans]
    group = triton_kernels.TritonGroup(params, states, states, plans)
    first_grid, first, first_constants = group.launch(grads, False)

    def no_tensor(*args, **kwargs):
        raise AssertionError("a warm launch made a tensor")

    monkeypatch.setattr(triton_kernels.torch, "tensor", no_tensor)
    monkeypatch.setattr(torch.Tensor, "copy_", no_tensor)
    grid, warm, constants = group.launch(grads, False)
    assert grid == first_grid and constants == first_constants
    assert all(a is b for a, b in zip(first, warm, strict=True))
    assert any(a is group.scalars for a in warm)
    assert group.scalars.shape == (len(triton_kernels.STEP_SCALARS),)
    assert all(isinstance(a, torch.Tensor) for a in warm)  # no number to freeze


def in_fresh_process(call: str, **env: str) -> str:
    """What ``test_fused.CALL`` prints, run in a fresh process with ``env`` added (settings that
    must be chosen before triton or the CPU step loads)."""
    env = {**os.environ, **env}
    here, repo = Path(__file__).parent, Path(__file__).parents[2]  # test_fused; tests.helpers
    env["PYTHONPATH"] = os.pathsep.join([str(here), str(repo), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", f"import test_fused; test_fused.{call}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,  # a hang, not a slow machine: a few CPU minutes, more beside other work
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    return done.stdout


def interpreted(call: str) -> str:
    """What ``test_fused.CALL`` prints, run with Triton's CPU interpreter in a fresh process."""
    return in_fresh_process(call, TRITON_INTERPRET="1")


def check_cpu_kernel_at_vector_tails() -> None:
    """Every vector-tail case of the CPU step against the eager step, in whichever build
    ``FOAM_CPU_KERNEL`` chose."""
    needs_cpu_kernel()
    width = fused.cpu_vector_width()
    cases = 0
    for kind, level, fold_axis in VECTOR_CASES:
        for dtype in DTYPES:
            for options in ({}, HEAVY):
                settings = {"level": level, "fold_axis": fold_axis, **options}
                shape = vector_shape(kind, level, width)
                expected = run("eager", shape, dtype, **settings)
                for a, e in zip(run("fused", shape, dtype, **settings), expected, strict=True):
                    assert_agree(a, e, dtype)
                cases += 1
    print(f"{cases} cases agree on {width}-wide vectors")


@pytest.mark.slow
def test_the_portable_cpu_kernel_matches_eager_at_vector_tails():
    """The build a CPU without AVX2 runs (ATen's portable vectors, the block shuffles through
    arrays), checked on this one. Slow once: building it takes minutes; cached, seconds."""
    out = in_fresh_process("check_cpu_kernel_at_vector_tails()", FOAM_CPU_KERNEL="portable")
    assert f"{len(VECTOR_CASES) * len(DTYPES) * 2} cases agree on 8-wide vectors" in out


def test_an_unknown_cpu_kernel_build_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("FOAM_CPU_KERNEL", "fastest")
    with pytest.raises(ValueError, match=r"^FOAM_CPU_KERNEL='fastest': expected one of native, "):
        fused.cpu_cflags()


needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)


@needs_triton
def test_triton_kernel_matches_eager_in_the_interpreter():
    out = interpreted("check_triton_kernel()")
    assert f"{len(TRITON_CASES) + len(TRITON_GROUPS)} cases agree" in out
    assert f"{len(REPLAYED)} replayed launches agree" in out
    assert "the probe passes" in out


@needs_triton
@pytest.mark.slow
def test_more_unaligned_rows_match_eager_in_the_interpreter():
    assert f"{len(UNALIGNED_MORE)} cases agree" in interpreted(
        "check_cases(test_fused.UNALIGNED_MORE)"
    )


@needs_triton
@pytest.mark.slow
def test_llama_1b_rows_match_eager_in_the_interpreter():
    assert f"{len(LLAMA_1B_ROWS)} cases agree" in interpreted(
        "check_cases(test_fused.LLAMA_1B_ROWS)"
    )


def test_a_triton_kernel_that_does_not_compile_sends_cuda_to_the_eager_step(monkeypatch, caplog):
    def no_kernel(*args):
        raise RuntimeError("PTX .version 8.4 does not support .target sm_60")

    monkeypatch.setitem(sys.modules, "foam.triton_kernels", SimpleNamespace(TritonGroup=no_kernel))
    with caplog.at_level("WARNING", logger="foam.fused"):
        assert not fused.triton_runs(torch.device("cpu"))
    assert "does not run on cpu (RuntimeError: PTX .version 8.4" in caplog.text


def test_each_source_file_has_its_own_extension_build(tmp_path, monkeypatch):
    """Two checkouts must not share one cached build (torch would rebuild it for each in turn)."""
    name = fused.cpu_extension_name()
    assert name == fused.cpu_extension_name() and name.startswith("foam_step_cpu_")
    copy = tmp_path / "foam_step.cpp"
    copy.write_bytes(fused.CPU_SOURCE.read_bytes())
    monkeypatch.setattr(fused, "CPU_SOURCE", copy)
    assert fused.cpu_extension_name() != name  # same text, another checkout
    other = fused.cpu_extension_name()
    copy.write_text(copy.read_text() + "\n// changed\n")
    assert fused.cpu_extension_name() != other


def test_each_cpu_kind_has_its_own_extension_build(monkeypatch):
    """``-march=native`` builds for one CPU: a cache shared by machines of several kinds (a
    cluster's home directory) must not hand one's build to another."""
    assert fused.cpu_features().startswith(platform.machine())
    name = fused.cpu_extension_name()
    monkeypatch.setattr(fused, "cpu_features", lambda: "x86_64 fpu sse2 avx2")
    without_avx512 = fused.cpu_extension_name()
    monkeypatch.setattr(fused, "cpu_features", lambda: "x86_64 fpu sse2 avx2 avx512f")
    assert len({name, without_avx512, fused.cpu_extension_name()}) == 3


def test_a_lock_left_by_a_killed_build_is_removed_before_building(tmp_path, monkeypatch, caplog):
    """torch's ``lock`` file in the build directory outlives a builder that was killed, and
    torch's ``load`` then waits on it forever; holding the build's ``flock``, nobody else is
    building, so the file is stale and goes (``build_cpu_extension``)."""
    import torch.utils.cpp_extension as cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    build = fused.cpu_build_directory()
    assert build.parent == tmp_path and build.name == fused.cpu_extension_name()
    build.mkdir()
    (build / "lock").touch()
    loads = []

    def load(**kwargs):
        assert not (build / "lock").exists(), "torch's load would wait on the stale lock"
        loads.append(kwargs["build_directory"])

    monkeypatch.setattr(cpp_extension, "load", load)
    with caplog.at_level("WARNING", logger="foam.fused"):
        fused.build_cpu_extension()
    assert loads == [str(build)]
    assert "left by a build of the CPU step that died" in caplog.text
    fused.build_cpu_extension()  # no lock: built (here: loaded) without a word
    assert loads == [str(build)] * 2 and caplog.text.count("died") == 1


def test_the_probe_compares_the_kernel_with_the_eager_step(monkeypatch, caplog):
    """A kernel that runs but computes nothing (here: leaves every tensor as it was) is caught
    by its probe, which says what differs; the real CPU kernel passes it."""
    needs_cpu_kernel()
    assert fused.kernel_runs(torch.device("cpu"), "cpp")
    monkeypatch.setattr(fused, "fused_step", lambda *args: None)
    with caplog.at_level("WARNING", logger="foam.fused"):
        assert not fused.kernel_runs(torch.device("cpu"), "cpp")
    assert "C++ FOAM kernel does not run on cpu (ArithmeticError: p is" in caplog.text
    assert "off the eager step's (torch.float32 parameter, torch.float32 states)" in caplog.text


def test_a_kernel_that_cannot_run_warns_with_auto_and_fails_with_fused(monkeypatch):
    """Said when the optimizer is built, not at its first step; ``eager`` asked for it."""
    monkeypatch.setattr(fused, "kernel_available", lambda device_type: False)
    p = torch.nn.Parameter(torch.randn(8, 16))
    with pytest.raises(OptionError, match=r"implementation='fused' but the fused FOAM step \(cpp"):
        FOAM([p], implementation="fused")
    with pytest.warns(RuntimeWarning, match="steps its folded matrices eagerly"):
        optimizer = FOAM([{"params": [p], "name": "matrices"}])
    p.grad = torch.randn(8, 16)
    optimizer.step()
    assert optimizer.steps_run() == {"matrices": "eager"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FOAM([p], implementation="eager")
        FOAM([p], level=None)  # nothing folded: nothing for a kernel to do


def test_steps_run_says_which_step_each_folded_group_took():
    needs_cpu_kernel()
    matrix, zero, vector = (torch.nn.Parameter(torch.randn(*s)) for s in ((8, 16), (4, 4), (8,)))

    def groups() -> list[dict]:  # torch fills each group's defaults in place
        return [
            {"params": [matrix], "name": "matrices"},
            {"params": [zero], "name": "level 0", "level": 0},
            {"params": [vector], "name": "others", "level": None},
        ]

    fused_optimizer, eager_optimizer = FOAM(groups()), FOAM(groups(), implementation="eager")
    assert fused_optimizer.steps_run() == {}  # nothing stepped yet
    for p in (matrix, zero, vector):
        p.grad = torch.randn_like(p)
    fused_optimizer.step()
    eager_optimizer.step()
    assert fused_optimizer.steps_run() == {"matrices": "cpp", "level 0": "eager"}
    assert eager_optimizer.steps_run() == {"matrices": "eager", "level 0": "eager"}
    assert steps_run(fused_optimizer) == fused_optimizer.steps_run()
    assert steps_run(torch.optim.AdamW([vector])) == {}


def test_a_group_of_mixed_shapes_and_step_counts_steps_as_the_eager_one():
    """One call steps matrices of several shapes and folds; a matrix that had no gradient at
    one step is a step behind from then on (its own bias corrections), as in the eager step."""
    needs_cpu_kernel()
    shapes = [(8, 16), (16, 8), (10, 7), (40, 16)]
    results = {}
    for implementation in ("fused", "eager"):
        params = [torch.nn.Parameter(p) for p in starts(shapes, torch.float32)]
        optimizer = FOAM(params, lr=1e-2, weight_decay=0.1, implementation=implementation)
        generator = torch.Generator().manual_seed(1)
        for step in range(STEPS):
            grads = gradients(shapes, torch.float32, generator)
            for k, (p, g) in enumerate(zip(params, grads, strict=True)):
                p.grad = None if (step, k) == (1, 2) else g
            optimizer.step()
        results[implementation] = [[p.detach(), *optimizer.state[p].values()] for p in params]
    for actual, expected in zip(results["fused"], results["eager"], strict=True):
        for a, e in zip(actual, expected, strict=True):
            assert_agree(a, e, torch.float32)
    assert [state[1].item() for state in results["fused"]] == [STEPS, STEPS, STEPS - 1, STEPS]


def test_a_group_decides_its_routes_once_and_again_when_its_gradients_change(monkeypatch):
    """The kernel call and its tables are made at the first step and kept while the parameters
    and their gradients' dtypes and layouts stay; a gradient the kernel cannot read as it is (a
    transposed view), or a loaded state dict, makes them again (and a step after loading
    continues as the uninterrupted run)."""
    needs_cpu_kernel()
    made = []
    real = fused.kernel_group
    monkeypatch.setattr(fused, "kernel_group", lambda *a: made.append(a[0]) or real(*a))
    params = [torch.nn.Parameter(torch.randn(8, 16)) for _ in range(2)]
    optimizer = FOAM(params, lr=1e-2)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(8, 16)  # fresh gradient tensors, as after zero_grad()
        optimizer.step()
    assert made == ["cpp"]
    params[0].grad = torch.randn(16, 8).t()
    optimizer.step()
    assert made == ["cpp", "cpp"]  # for the other matrix; this one steps eagerly
    assert optimizer.steps_run() == {"0": "cpp+eager"}
    saved = copy.deepcopy(optimizer.state_dict())  # as from a file: no tensor shared
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = FOAM(twin, lr=1e-2)
    resumed.load_state_dict(saved)
    for p, q in zip(params, twin, strict=True):
        p.grad = q.grad = torch.randn(8, 16)
    optimizer.step()
    resumed.step()
    for p, q in zip(params, twin, strict=True):
        assert torch.equal(p, q)
        assert torch.equal(optimizer.state[p]["exp_avg"], resumed.state[q]["exp_avg"])
        assert optimizer.state[p]["step"].item() == resumed.state[q]["step"].item() == 5
    assert made == ["cpp"] * 4  # one each for the loaded optimizer and the stepped one
