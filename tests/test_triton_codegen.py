"""The Triton FOAM step's machine code for an H100 (sm_90), read on a machine without a GPU.

Each case builds the launch ``foam.triton_kernels.launches`` makes for LLaMA-350M matrices,
specialises it the way Triton's launcher does (pointer alignment, integers divisible by 16),
compiles it to PTX with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` and assembles that
with Triton's own ptxas. The step is memory-bound, so what matters is how it moves bytes: every
access to the matrix tile must be a 128-bit vector (``ld.global.v4.b32`` / ``st.global.v4.b32``),
with no register spills and registers for at least a third of the SM's threads.
"""

import re
import subprocess

import pytest
import torch

triton = pytest.importorskip("triton")
nvidia = pytest.importorskip("triton.backends.nvidia.compiler")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from foam import triton_kernels  # noqa: E402
from foam.folding import make_plan  # noqa: E402
from foam.fused import StepScalars  # noqa: E402

pytestmark = pytest.mark.slow  # each case compiles for about ten seconds

CAPABILITY = 90
TARGET = GPUTarget("cuda", CAPABILITY, 32)
MAX_REGISTERS = 80  # 65536 per SM / 80 per thread: 768 of its 2048 threads
SCALARS = StepScalars(0.9, 0.95, 1.0, 1.0, 1e-8, 1e-3, 1.0, mean_of_squares=False)
BF16, FP32 = torch.bfloat16, torch.float32
# LLaMA-350M's matrices: attention (1024 x 1024, fold along the columns), MLP up/gate (2736 x
# 1024, fold along the rows) and down (1024 x 2736); FOAM-2 is one pass with several blocks to a
# tile, FOAM-Mini two passes over one block.
CASES = [
    ((1024, 1024), 2, BF16, BF16),
    ((1024, 1024), 2, BF16, FP32),
    ((2736, 1024), 2, BF16, BF16),
    ((1024, 2736), 2, FP32, FP32),
    ((2736, 1024), "mini", BF16, BF16),
    ((1024, 2736), "mini", BF16, FP32),
]


def ptxas() -> str:
    path = nvidia.get_ptxas(CAPABILITY).path
    if not path:
        pytest.skip("triton ships no ptxas here")
    return path


def compile_launch(shape, level, param_dtype, state_dtype) -> tuple[str, dict]:
    """PTX of the launch for two ``shape`` matrices, and its ``Tiles`` constants."""
    plan = make_plan(shape, level, "larger")
    params = [torch.zeros(plan.rows, plan.cols, dtype=param_dtype) for _ in range(2)]
    states = [torch.zeros(plan.folded_shape, dtype=state_dtype) for _ in range(4)]
    ((grid, args, constants),) = triton_kernels.launches(
        params,
        [torch.zeros_like(p) for p in params],
        states[:2],
        states[2:],
        [plan, plan],
        [(1.0, 1.0)] * 2,
        SCALARS,
    )
    assert grid[1] == 2  # both matrices in one launch
    kernel = triton_kernels._foam_step_kernel
    backend = make_backend(TARGET)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **constants)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, options, bound, specialization, options
    )
    source = ASTSource(kernel, signature, constexprs, attrs)
    compiled = triton.compile(source, target=TARGET, options=options.__dict__)
    return compiled.asm["ptx"], constants


def ptxas_report(ptx: str, tmp_path) -> tuple[int, int]:
    """Registers per thread and bytes of spill stores plus loads, from ``ptxas -v``."""
    source = tmp_path / "kernel.ptx"
    source.write_text(ptx)
    arch = nvidia.sm_arch_from_capability(CAPABILITY)
    done = subprocess.run(
        [ptxas(), "-v", f"--gpu-name={arch}", str(source), "-o", str(tmp_path / "kernel.o")],
        capture_output=True,
        text=True,
        check=True,
    )
    registers = int(re.search(r"Used (\d+) registers", done.stderr).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", done.stderr))
    return registers, spills


def count(ptx: str, instruction: str) -> int:
    return len(re.findall(re.escape(instruction) + r"\s", ptx))


@pytest.mark.parametrize(("shape", "level", "param_dtype", "state_dtype"), CASES)
def test_the_kernel_streams_its_tiles_in_128_bit_vectors_without_spills(
    shape, level, param_dtype, state_dtype, tmp_path
):
    ptxas()
    ptx, constants = compile_launch(shape, level, param_dtype, state_dtype)
    registers, spills = ptxas_report(ptx, tmp_path)
    assert spills == 0
    assert registers <= MAX_REGISTERS
    # a thread's share of one tile of gradient or parameter, in 128-bit vectors; the tile is
    # covered once per pass, so any narrower access to it leaves these counts short
    per_thread = triton_kernels.TILE_ELEMENTS // (32 * triton_kernels.NUM_WARPS)
    vectors = per_thread * param_dtype.itemsize // 16
    gradient_passes = 1 if constants["KP"] else 2
    assert count(ptx, "ld.global.v4.b32") >= (gradient_passes + 1) * vectors
    assert count(ptx, "st.global.v4.b32") >= vectors
    # the block of an entry comes from the tile's shape: the one integer division is the
    # program's own tile index
    assert count(ptx, "div.s32") + count(ptx, "div.u32") <= 1
