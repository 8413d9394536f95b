"""The Triton FOAM step's machine code for an H100 (sm_90), read on a machine without a GPU.

Each case builds the one launch ``foam.triton_kernels.TritonGroup`` makes for all the folded
matrices of a LLaMA or Qwen model (60M to 7B; two of each shape, so the table addresses several),
specialises it the way Triton's launcher does (pointer alignment, integers divisible by 16),
compiles it to PTX with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` and assembles that
with Triton's own ptxas. The step is memory-bound, so what matters is how it moves bytes: every
access to a matrix tile whose rows start on 16-byte boundaries must be a 128-bit vector
(``ld.global.v4.b32`` / ``st.global.v4.b32``), with no register spills and registers for at least
a third of the SM's threads, for every tile kind the launch has a branch for.
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
from foam.param_groups import split_params  # noqa: E402
from models import build_model, load_model_config  # noqa: E402

pytestmark = pytest.mark.slow  # each case compiles for a few seconds

CAPABILITY = 90
TARGET = GPUTarget("cuda", CAPABILITY, 32)
MAX_REGISTERS = 80  # 65536 per SM / 80 per thread: 768 of its 2048 threads
BF16, FP32 = torch.bfloat16, torch.float32
MODELS = [
    f"{family}_{size}" for family in ("llama", "qwen") for size in ("60m", "350m", "1b", "7b")
]
# FOAM-2 (one pass, several blocks to a tile) in bf16 with bf16 or fp32 states and in fp32;
# FOAM-Mini (two passes over one block) in bf16.
PRECISIONS = [(2, BF16, BF16), (2, BF16, FP32), (2, FP32, FP32), ("mini", BF16, BF16)]


def matrix_shapes(model_name: str) -> list[tuple[int, int]]:
    """The distinct shapes of the matrices FOAM folds in ``model_name`` (built on meta)."""
    model = build_model(load_model_config(model_name), device="meta")
    return sorted({tuple(p.shape) for _, p in split_params(model).matrices})


def ptxas() -> str:
    path = nvidia.get_ptxas(CAPABILITY).path
    if not path:
        pytest.skip("triton ships no ptxas here")
    return path


def compile_launch(shapes, level, param_dtype, state_dtype) -> tuple[str, tuple]:
    """PTX of the one launch that steps two matrices of each of ``shapes``, and its kinds."""
    plans = [make_plan(shape, level, "larger") for shape in shapes for _ in range(2)]
    params = [torch.zeros(plan.rows, plan.cols, dtype=param_dtype) for plan in plans]
    exp_avgs, exp_avg_sqs = (
        [torch.zeros(plan.folded_shape, dtype=state_dtype) for plan in plans] for _ in "mv"
    )
    group = triton_kernels.TritonGroup(params, exp_avgs, exp_avg_sqs, plans)
    _, args, constants = group.launch([torch.zeros_like(p) for p in params], False)
    kernel = triton_kernels._foam_step_kernel
    backend = make_backend(TARGET)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **constants)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, options, bound, specialization, options
    )
    source = ASTSource(kernel, signature, constexprs, attrs)
    compiled = triton.compile(source, target=TARGET, options=options.__dict__)
    return compiled.asm["ptx"], group.kinds


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


@pytest.mark.parametrize(("level", "param_dtype", "state_dtype"), PRECISIONS)
@pytest.mark.parametrize("model_name", MODELS)
def test_the_kernel_streams_its_tiles_in_128_bit_vectors_without_spills(
    model_name, level, param_dtype, state_dtype, tmp_path
):
    ptxas()
    ptx, kinds = compile_launch(matrix_shapes(model_name), level, param_dtype, state_dtype)
    registers, spills = ptxas_report(ptx, tmp_path)
    assert spills == 0
    assert registers <= MAX_REGISTERS
    # a thread's share of one tile of gradient or parameter, in 128-bit vectors, for each kind
    # whose rows are 16-byte aligned; a tile is covered once per pass, so any narrower access
    # to it leaves these counts short
    per_thread = triton_kernels.TILE_ELEMENTS // (32 * triton_kernels.NUM_WARPS)
    vectors = per_thread * param_dtype.itemsize // 16
    aligned = [k for k in kinds if k[4] == triton_kernels.VECTOR_ELEMENTS]
    loads = sum((1 if kind[3] else 2) + 1 for kind in aligned) * vectors
    assert count(ptx, "ld.global.v4.b32") >= loads
    assert count(ptx, "st.global.v4.b32") >= len(aligned) * vectors
    # the block of an entry comes from the tile's shape: the one integer division per kind is
    # the program's own tile index
    assert count(ptx, "div.s32") + count(ptx, "div.u32") <= len(kinds)


def test_the_models_have_unaligned_rows_only_where_expected():
    """The vector counts above skip kinds whose rows are not 16-byte aligned: of these models,
    that is LLaMA-1B's intermediate width (5461) alone, so the test covers every other one."""
    unaligned = {
        name: [s for s in matrix_shapes(name) if s[1] % triton_kernels.VECTOR_ELEMENTS]
        for name in MODELS
    }
    assert unaligned == {name: [(2048, 5461)] if name == "llama_1b" else [] for name in MODELS}
