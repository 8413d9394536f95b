"""The fused FOAM step: one pass per folded matrix instead of the eager chain of ops.

The eager step (foam/update.py) is the readable reference; this module runs the same arithmetic
(FOAM_SPEC section 2, with the scalars of foam/update.py) as one kernel call for a whole parameter
group: a C++ operator on the CPU (foam/csrc/foam_step.cpp, built on first use with
``torch.utils.cpp_extension``) and a Triton kernel on CUDA (foam/triton_kernels.py, imported only
when a CUDA parameter steps). Before a kernel is used it is probed: it must build, run one step of
a small matrix for every pair of parameter and state dtypes (synchronised, so an asynchronous
device fault is caught here) and agree with the eager step. A kernel that fails says why in the
``foam.fused`` log; the optimizer then warns or, with ``implementation="fused"``, refuses.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import itertools
import logging
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Union

import torch

from foam.folding import PAPER_FOLD_AXIS, FoldPlan, fold, make_plan
from foam.update import StepScalars, eager_step_

try:
    import fcntl  # POSIX: the build's lock (build_cpu_extension)
except ImportError:  # Windows: torch's lock file alone
    fcntl = None

if TYPE_CHECKING:
    from foam.triton_kernels import TritonGroup

log = logging.getLogger(__name__)

KERNELS = {"cpu": "cpp", "cuda": "triton"}
"""The fused kernel of each device type that has one, by the name ``FOAM.steps_run`` reports."""
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
CPU_SOURCE = Path(__file__).with_name("csrc") / "foam_step.cpp"
CPU_CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fopenmp")
CPU_KERNEL_ENV = "FOAM_CPU_KERNEL"
"""``native`` (the default): the CPU step on this CPU's vectors; ``portable``: on ATen's portable
vectors and array shuffles, what a CPU without AVX2 or NEON runs (how the tests check that path on
any machine)."""
CPU_KERNEL_DEFINES = {"native": (), "portable": ("-DFOAM_PORTABLE",)}
PROBE_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2**-6}
"""How far a probe's result may be from the eager step's, relative to its largest entry."""


def cpu_cflags() -> tuple[str, ...]:
    """The CPU step's compiler flags, for the build ``FOAM_CPU_KERNEL`` names."""
    kernel = os.environ.get(CPU_KERNEL_ENV, "native")
    if kernel not in CPU_KERNEL_DEFINES:
        raise ValueError(
            f"{CPU_KERNEL_ENV}={kernel!r}: expected one of {', '.join(CPU_KERNEL_DEFINES)}"
        )
    return CPU_CFLAGS + CPU_KERNEL_DEFINES[kernel]


def cpu_extension_name() -> str:
    """The CPU operator's name in torch's extension cache, unique to its source file and flags.

    torch keys the cache by name alone and rebuilds whenever the build's source path or content
    differ from the cached build, so two checkouts (a study's and a development tree) under one
    name would rebuild it for each other on every load (about 30 s, and a process that loads it
    meanwhile waits). Hashing the path and content gives each checkout its own build, made once.
    The CPU's instruction sets are hashed too: ``-march=native`` builds for this CPU alone, and a
    cache on a home directory that machines of several kinds share would otherwise hand an
    AVX-512 build to a CPU without it (an illegal instruction, not an error). So are torch's and
    Python's versions, whose headers and ABI the build is compiled against.
    """
    digest = hashlib.sha256(str(CPU_SOURCE.resolve()).encode())
    digest.update(CPU_SOURCE.read_bytes())
    digest.update(" ".join(cpu_cflags()).encode())
    digest.update(cpu_features().encode())
    digest.update(f"{torch.__version__} {platform.python_version()}".encode())
    return f"foam_step_cpu_{digest.hexdigest()[:16]}"


@functools.cache
def cpu_features() -> str:
    """The machine's architecture and its CPU's feature flags (Linux's ``/proc/cpuinfo``: x86's
    ``flags``, ARM's ``Features``), or the architecture alone where they cannot be read."""
    features = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                features = value.strip()
                break
    return f"{platform.machine()} {features}"


def _describe(error: Exception) -> str:
    """``Type: first line of the message``, for one log line."""
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


@functools.cache
def kernel_available(device_type: str) -> bool:
    """Whether the fused kernel for ``device_type`` builds, runs and agrees with the eager step
    here (probed once per process); builds the CPU one on first call.

    The CPU operator is compiled once per machine into torch's extension cache (``make install``
    does it up front); a missing compiler or a failed build logs one warning and returns False.
    """
    if device_type == "cuda":
        if importlib.util.find_spec("triton") is None:
            log.warning("foam: triton is not installed; CUDA parameters take the eager FOAM step")
            return False
        return triton_runs(torch.device("cuda", torch.cuda.current_device()))
    if device_type != "cpu":
        return False
    try:
        build_cpu_extension()
    except Exception as error:  # any build or load failure means: use the eager step
        log.warning(
            "foam: the fused CPU step could not be built (%s); using the eager step",
            _describe(error),
        )
        return False
    return kernel_runs(torch.device("cpu"), "cpp")


def cpu_build_directory() -> Path:
    """Where the CPU operator is built: torch's extension cache (``TORCH_EXTENSIONS_DIR``, else
    its default root), one directory per ``cpu_extension_name``."""
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    return Path(root) / cpu_extension_name()


def build_cpu_extension() -> None:
    """Build (once per machine) and load the CPU operator, holding an exclusive ``flock`` beside
    its build directory meanwhile.

    torch's own guard is a ``lock`` file in the build directory that its builder deletes when it
    finishes; a builder that is killed (a timeout, a preempted job) leaves it, and every later
    process waits on it forever. The ``flock`` dies with its holder, and every builder of this
    operator takes it first, so a ``lock`` file found while holding it was left by a dead one
    and is removed."""
    from torch.utils.cpp_extension import load

    build = cpu_build_directory()
    build.mkdir(parents=True, exist_ok=True)
    with open(build.with_name(build.name + ".flock"), "w") as guard:
        if fcntl is not None:
            fcntl.flock(guard, fcntl.LOCK_EX)
        stale = build / "lock"
        if stale.exists():
            log.warning("foam: removing %s, left by a build of the CPU step that died", stale)
            stale.unlink()
        load(
            name=cpu_extension_name(),
            sources=[str(CPU_SOURCE)],
            extra_cflags=list(cpu_cflags()),
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            is_python_module=False,
        )


def cpu_vector_width() -> int | None:
    """How many float32 entries one vector of the CPU step holds as built here (8 with AVX2,
    AVX-512 CPUs included; 4 with ARM's NEON; 8 in ATen's portable vectors elsewhere), or None
    where the CPU step does not run. Block sizes below it share a vector, so its value says which
    of the kernel's paths a matrix takes."""
    if not kernel_available("cpu"):
        return None
    return int(torch.ops.foam.vector_width())


def triton_runs(device: torch.device) -> bool:
    """Whether the Triton kernel compiles, runs and agrees with the eager step on ``device``."""
    return kernel_runs(device, "triton")


def kernel_runs(device: torch.device, kernel: str) -> bool:
    """Whether ``kernel`` (one of :data:`KERNELS`' values) steps a small matrix on ``device`` as
    the eager step does, for every pair of parameter and state dtypes; a GPU or dtype it cannot
    compile for, a fault or a wrong result logs one warning and returns False."""
    plan = make_plan((4, 7), 1, PAPER_FOLD_AXIS)  # blocks of 2 along the 7 columns, and a tail
    scalars = StepScalars(0.9, 0.95, 1.0, 1.0, 1e-8, 1e-2, 1.0, mean_of_squares=False)
    corrections = (0.1, 0.05)  # the bias corrections of a first step
    try:
        for param_dtype, state_dtype in itertools.product(KERNEL_DTYPES, repeat=2):
            p = torch.zeros(4, 7, dtype=param_dtype, device=device)
            p.grad = torch.linspace(-1.0, 2.0, 28, device=device).reshape(4, 7).to(param_dtype)
            m, v = (torch.zeros(plan.folded_shape, dtype=state_dtype, device=device) for _ in "mv")
            expected = [t.clone() for t in (p, m, v)]
            folds = functools.partial(fold, plan=plan)
            eager_step_(expected[0], p.grad, *expected[1:], plan, folds, corrections, scalars)
            fused_step([p], [m], [v], [plan], corrections, scalars, kernel)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            for name, actual, reference in zip("pmv", (p, m, v), expected, strict=True):
                error = (actual.float() - reference.float()).abs().max().item()
                bound = PROBE_TOLERANCE[actual.dtype] * reference.float().abs().max().item()
                if not error <= bound:
                    raise ArithmeticError(
                        f"{name} is {error:.3g} off the eager step's ({param_dtype} parameter, "
                        f"{state_dtype} states)"
                    )
    except Exception as error:  # any compile, launch or result failure means: use the eager step
        log.warning(
            "foam: the %s FOAM kernel does not run on %s (%s); using the eager step",
            "Triton" if kernel == "triton" else "C++",
            device,
            _describe(error),
        )
        return False
    return True


def covers(p: torch.Tensor, plan: FoldPlan | None, state_dtype: torch.dtype) -> bool:
    """Whether the fused kernels take ``p`` (a plain tensor: a sharded parameter's local shard,
    ``plan`` its fold): a folded matrix (block > 1) of a contiguous float32/bfloat16 tensor on
    the CPU or CUDA. Level 0 and float16/float64 parameters take the eager step."""
    return (
        plan is not None
        and plan.block > 1
        and p.device.type in KERNELS
        and p.dtype in KERNEL_DTYPES
        and state_dtype in KERNEL_DTYPES
        and p.is_contiguous()
    )


def grad_fits(grad: torch.Tensor) -> bool:
    """Whether the kernels read ``grad`` (a plain tensor) as it is: float32/bfloat16,
    contiguous."""
    return grad.dtype in KERNEL_DTYPES and grad.is_contiguous()


class CppGroup:
    """Folded matrices on the CPU stepped by one call of the C++ operator; what stays put
    between steps (tensor lists, geometry) is made once."""

    def __init__(
        self,
        params: list[torch.Tensor],
        exp_avgs: list[torch.Tensor],
        exp_avg_sqs: list[torch.Tensor],
        plans: list[FoldPlan],
    ) -> None:
        self.tensors = params, exp_avgs, exp_avg_sqs
        self.geometry = [n for plan in plans for n in (plan.rows, plan.cols, plan.axis, plan.block)]

    def step(
        self, grads: list[torch.Tensor], corrections: tuple[float, float], scalars: StepScalars
    ) -> None:
        """One fused FOAM step of every matrix, in place on parameters and states."""
        params, exp_avgs, exp_avg_sqs = self.tensors
        torch.ops.foam.step_(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            self.geometry,
            list(corrections) * len(params),
            scalars.as_list(),
            scalars.mean_of_squares,
        )


KernelGroup = Union["CppGroup", "TritonGroup"]


def kernel_group(
    kernel: str,
    params: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    plans: list[FoldPlan],
) -> KernelGroup:
    """The fused step of folded matrices of one device and dtypes by ``kernel`` (one of
    :data:`KERNELS`' values), made once and stepped with ``.step(grads, corrections,
    scalars)``."""
    if kernel == "cpp":
        return CppGroup(params, exp_avgs, exp_avg_sqs, plans)
    from foam.triton_kernels import TritonGroup

    return TritonGroup(params, exp_avgs, exp_avg_sqs, plans)


def fused_step(
    params: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    plans: list[FoldPlan],
    corrections: tuple[float, float],
    scalars: StepScalars,
    kernel: str | None = None,
) -> None:
    """One FOAM step of folded matrices of one device and dtypes, at one step count, in place
    on params (their ``.grad`` the gradients) and states, by ``kernel`` (the device's,
    :data:`KERNELS`, unless given: the probe runs Triton's interpreter on the CPU too)."""
    group = kernel_group(
        kernel or KERNELS[params[0].device.type], params, exp_avgs, exp_avg_sqs, plans
    )
    group.step([p.grad for p in params], corrections, scalars)
