"""The equality harness of issue #76: an optimizer's step on FSDP2-sharded parameters against the
single-process step of the same optimizer, for any registered method.

A small seeded model of 2-d matrices (and the embedding and norms every method leaves to AdamW)
is sharded with ``fully_shard`` on ``W`` gloo ranks (CPU, one thread each), each matrix along
FOAM's dim (``foam.sharding.shard_dim``) or, for a case that asks (``Case.method_layout``), the
method's, as ``train/parallelism.py`` does (``foam.registry.shard_dims``); seeded
gradients (summed over micro-batches when a case asks) feed several steps; the whole parameters
and optimizer states (``full_tensor()``) come back to compare with ``run_single``'s.

The model's shapes give, at 2, 3 and 4 ranks: rows the ranks do not divide (the attention
matrices' 10 rows at 3 and 4 ranks), a rank with an empty shard (``layers.0.mlp.down_proj``'s 4
rows at 3 ranks, ``layers.1.mlp.down_proj``'s 5 at 4 ranks), eight matrices of one shape (more
than ranks), matrices sharded by dim 1 (gate and up, 16 x 12: folded along their 16 rows, so the
trainer shards their 12 columns), attention heads of 2 rows (``n_heads=5`` over 10 rows) that the
row shards cut at 2 and 4 ranks, and a vocabulary of 11 rows.

One spawn per world size runs every case given (a case whose optimizer refuses the layout comes
back with its one-line error), so a suite pays the start-up of the ranks once. Each rank ends
with ``train.distributed.shutdown``, which fails the run where a gloo thread outlives it.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch import nn

# FSDP2 and DCP are imported before any process group exists: imported after it, they import
# torch.distributed.nn, whose functions bind the live world group as their default and keep it
# (and its gloo threads) past the ranks' teardown, where a thread can abort the rank at exit
# (train.distributed.shutdown checks that none is left).
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

import foam
from foam.registry import shard_dims
from foam.shard_owners import Owners
from foam.shard_sums import PartialSums
from foam.sharding import shard_dim
from train.distributed import shutdown

HIDDEN, HEADS, VOCAB = 10, 5, 11
FFN_IN, FFN_OUT = 12, 16
DOWN_ROWS = (4, 5)  # layer i's down_proj rows: an empty shard at 3 ranks (4) and at 4 ranks (5)
FOLD_AXIS = "larger"  # the trainer's default fold axis, which picks the sharded dims
SPAWN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Case:
    """One optimizer run: ``method`` (a registered name) with ``hparams`` for ``steps`` steps,
    each gradient the sum of ``micro_batches`` seeded parts, in ``dtype``."""

    method: str
    hparams: dict[str, Any] = field(default_factory=dict)
    steps: int = 3
    micro_batches: int = 1
    dtype: torch.dtype = torch.float64
    model: Callable[[torch.dtype], nn.Module] | None = None
    """Builds the model (from ``dtype``, seeded, with ``layers``); ``None``: ``ParityModel``."""
    scale: int = 1
    """``ParityModel``'s dims times this (not the heads): shapes large enough for 8-bit states'
    256-value quantisation blocks to line up with the shards."""
    method_layout: bool = False
    """Shard each matrix by the dim the trainer picks for ``method`` (``foam.registry.shard_dims``:
    its layout rule may take rows where FOAM's fold takes columns); ``False``: FOAM's dim
    (``foam.sharding.shard_dim``), which gives the layouts a method's build must refuse."""

    @property
    def name(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in sorted(self.hparams.items()))
        on = "" if self.model is None else f"@{self.model.__name__}"
        wider = f"@{self.scale}" if self.scale != 1 else ""
        dtype = "" if self.dtype == torch.float64 else f"@{str(self.dtype).removeprefix('torch.')}"
        layout = "@method_layout" if self.method_layout else ""
        return f"{self.method}[{extra}]x{self.micro_batches}{on}{wider}{dtype}{layout}"

    def build_model(self) -> nn.Module:
        if self.model is not None:
            return self.model(self.dtype)
        return ParityModel(self.dtype, self.scale)


@dataclass
class Outcome:
    """A run's end: whole parameters and states by parameter name, or the error it raised."""

    params: dict[str, torch.Tensor] = field(default_factory=dict)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    dtensor_states: dict[str, set[str]] = field(default_factory=dict)
    """The state keys each sharded parameter holds as DTensors (what DCP reshards)."""
    per_rank_state: list[tuple[int, int]] = field(default_factory=list)
    """Each rank's ``(foam.planned_state_numel, state elements it holds)``, step counters
    left out as the plan leaves them out (sharded runs)."""
    planned_whole: int | None = None
    """``foam.planned_state_numel(per_rank=False)``: the whole model's state, on any world size."""
    error: str | None = None


class _Attention(nn.Module):
    def __init__(self, scale: int) -> None:
        super().__init__()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, nn.Linear(HIDDEN * scale, HIDDEN * scale, bias=False))


class _Mlp(nn.Module):
    def __init__(self, down_rows: int, scale: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(FFN_IN * scale, FFN_OUT * scale, bias=False)
        self.up_proj = nn.Linear(FFN_IN * scale, FFN_OUT * scale, bias=False)
        self.down_proj = nn.Linear(FFN_OUT * scale, down_rows * scale, bias=False)


class _Layer(nn.Module):
    def __init__(self, down_rows: int, scale: int) -> None:
        super().__init__()
        self.input_layernorm = nn.Module()
        self.input_layernorm.weight = nn.Parameter(torch.ones(HIDDEN * scale))
        self.self_attn = _Attention(scale)
        self.mlp = _Mlp(down_rows, scale)


class ParityModel(nn.Module):
    """Parameters only (the gradients are seeded, there is no forward), named as in LLaMA so that
    the name-driven methods (Adam-mini) find their blocks; ``config`` as a transformers model's."""

    def __init__(self, dtype: torch.dtype = torch.float64, scale: int = 1) -> None:
        super().__init__()
        self.config = SimpleNamespace(hidden_size=HIDDEN * scale, num_attention_heads=HEADS)
        generator = torch.Generator().manual_seed(0)
        self.embed_tokens = nn.Embedding(VOCAB * scale, HIDDEN * scale)
        self.layers = nn.ModuleList(_Layer(rows, scale) for rows in DOWN_ROWS)
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(HIDDEN * scale))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=generator))
        self.to(dtype)


def gradient(name: str, shape: torch.Size, step: int, micro: int, dtype: torch.dtype):
    """The seeded gradient part of parameter ``name`` at (``step``, ``micro``)."""
    seed = (hash_name(name) * 1000 + step * 10 + micro) % (2**31)
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def hash_name(name: str) -> int:
    """A hash of ``name`` that is the same in every process (``hash`` is salted per process)."""
    return sum((i + 1) * ord(c) for i, c in enumerate(name))


def whole_gradient(name: str, shape: torch.Size, step: int, case: Case) -> torch.Tensor:
    total = gradient(name, shape, step, 0, case.dtype)
    for micro in range(1, case.micro_batches):
        total = total + gradient(name, shape, step, micro, case.dtype)
    return total


def build(case: Case, model: nn.Module) -> torch.optim.Optimizer:
    return foam.build_optimizer(case.method, model, **case.hparams)


def optimizer_states(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, dict[str, Any]], dict[str, set[str]]]:
    """Every parameter's state with tensors whole (``full_tensor()``: a collective on DTensors,
    so every rank calls it in the same order), and which keys were DTensors."""
    states, dtensors = {}, {}
    for name, p in model.named_parameters():
        state = optimizer.state.get(p, {})
        whole, held = {}, set()
        for key in sorted(state):
            value = state[key]
            if isinstance(value, DTensor):
                held.add(key)
                value = value.full_tensor()
            if isinstance(value, torch.Tensor):
                value = value.detach().clone()
            whole[key] = value
        states[name], dtensors[name] = whole, held
    return states, dtensors


def run_steps(
    case: Case, model: nn.Module, optimizer: torch.optim.Optimizer, steps: range, shard=None
) -> None:
    """Steps ``steps`` of ``case``: each parameter's gradient, sharded by ``shard(p, whole)``
    when given, accumulated over the micro-batches as FSDP2 accumulates its sharded gradients,
    onto what ``zero_grad`` left (LDAdamW's error feedback)."""
    for step in steps:
        optimizer.zero_grad(set_to_none=True)
        for name, p in model.named_parameters():
            for micro in range(case.micro_batches):
                part = gradient(name, p.shape, step, micro, case.dtype)
                part = shard(p, part) if shard is not None else part
                p.grad = part if p.grad is None else p.grad + part
        optimizer.step()


def run_single(case: Case) -> Outcome:
    """``case`` in this process on the unsharded model."""
    torch.set_num_threads(1)
    model = case.build_model()
    try:
        optimizer = build(case, model)
        run_steps(case, model, optimizer, range(case.steps))
    except Exception as err:  # the harness reports refusals, the test judges them
        return Outcome(error=f"{type(err).__name__}: {err}")
    states, _ = optimizer_states(model, optimizer)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return Outcome(params, states, planned_whole=foam.planned_state_numel(optimizer))


def shard_model(model: nn.Module, world: int, case: Case) -> Any:
    """``fully_shard`` per layer and the root, each matrix along the dim ``case`` asks for
    (``Case.method_layout``); the mesh."""
    mesh = init_device_mesh("cpu", (world,))
    matrices = {id(p) for _, p in foam.split_params(model).matrices}
    if case.method_layout:
        dim_of = shard_dims(case.method, case.hparams)
    else:
        dim_of = lambda shape, ranks: shard_dim(shape, FOLD_AXIS, ranks)  # noqa: E731

    def placement(p: nn.Parameter) -> Shard:
        return Shard(dim_of(tuple(p.shape), world) if id(p) in matrices else 0)

    for layer in model.layers:
        fully_shard(layer, mesh=mesh, shard_placement_fn=placement)
    fully_shard(model, mesh=mesh, shard_placement_fn=placement)
    return mesh


def _distribute(p: torch.Tensor, whole: torch.Tensor) -> torch.Tensor:
    return distribute_tensor(whole, p.device_mesh, p.placements)


def _sharded_outcome(case: Case, model: nn.Module, optimizer, steps: range) -> Outcome:
    run_steps(case, model, optimizer, steps, shard=_distribute)
    held = sum(
        value.to_local().numel() if hasattr(value, "to_local") else value.numel()
        for state in optimizer.state.values()
        for key, value in state.items()
        if isinstance(value, torch.Tensor) and key != "step"
    )
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(per_rank, (foam.planned_state_numel(optimizer), held))
    whole = foam.planned_state_numel(optimizer, per_rank=False)
    states, dtensors = optimizer_states(model, optimizer)
    params = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
    return Outcome(params, states, dtensors, per_rank, whole)


def _agreed_error(err: BaseException | None) -> str | None:
    """The error of a rank that failed, or ``None``; the same on every rank (a collective), so
    the ranks stay in step when only some refuse."""
    message = None if err is None else f"{type(err).__name__}: {err}"
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, message)
    failed = [m for m in every if m is not None]
    return failed[0] if failed else None


def _checked(run) -> Outcome:
    """``run()`` on every rank; an error on any rank becomes every rank's ``Outcome.error``."""
    try:
        outcome, err = run(), None
    except Exception as caught:
        outcome, err = None, caught
    message = _agreed_error(err)
    return Outcome(error=message) if message is not None else outcome


def _init(rank: int, world: int, init_file: str, skip_partial_sums: bool) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    if skip_partial_sums:  # the negative control: a step that forgets to sum across ranks
        PartialSums.reduce = lambda self: self._pending.clear()


def _cases_worker(
    rank: int, world: int, init_file: str, cases, out: str, skip_partial_sums: bool
) -> None:
    _init(rank, world, init_file, skip_partial_sums)
    outcomes = []
    for case in cases:

        def run(case: Case = case) -> Outcome:
            model = case.build_model()
            shard_model(model, world, case)
            optimizer = build(case, model)
            return _sharded_outcome(case, model, optimizer, range(case.steps))

        outcomes.append(_checked(run))
    if rank == 0:
        torch.save(outcomes, out)
    shutdown(require_stopped=True)


def _spawn(worker, world: int, args: tuple, timeout_s: float) -> None:
    """``worker(rank, world, init_file, *args)`` on ``world`` ranks; fails after ``timeout_s``
    (a rank left a collective) rather than hang the suite."""
    with tempfile.TemporaryDirectory() as tmp:
        context = mp.spawn(
            worker, args=(world, str(Path(tmp) / "init"), *args), nprocs=world, join=False
        )
        deadline = time.monotonic() + timeout_s
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                for process in context.processes:
                    process.kill()
                raise TimeoutError(f"{world} ranks did not finish within {timeout_s} s")


def run_sharded(
    cases: Sequence[Case],
    world: int,
    *,
    skip_partial_sums: bool = False,
    timeout_s: float = SPAWN_TIMEOUT_S,
) -> list[Outcome]:
    """Every case on ``world`` gloo ranks (one spawn); ``skip_partial_sums`` makes
    ``PartialSums.reduce`` drop its parts instead of summing them (the test that the exchange is
    needed)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "outcomes.pt")
        _spawn(_cases_worker, world, (list(cases), out, skip_partial_sums), timeout_s)
        return torch.load(out, weights_only=False)


# -- DCP: save on one world size, resume on another ------------------------------------------


def _dcp_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    weights, optim = get_state_dict(model, optimizer)
    return {"model": weights, "optim": optim}


def _resume_worker(
    rank: int, world: int, init_file: str, case: Case, ckpt: str, saved: int, load: bool, out: str
) -> None:
    """``saved`` steps then a DCP save to ``ckpt``; or (``load``) a load of it and the rest."""
    _init(rank, world, init_file, False)

    def run() -> Outcome:
        model = case.build_model()
        shard_model(model, world, case)
        optimizer = build(case, model)
        if not load:
            run_steps(case, model, optimizer, range(saved), shard=_distribute)
            dcp.save(_dcp_state(model, optimizer), checkpoint_id=ckpt)
            return Outcome()
        state = _dcp_state(model, optimizer)
        dcp.load(state, checkpoint_id=ckpt)
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        return _sharded_outcome(case, model, optimizer, range(saved, case.steps))

    outcome = _checked(run)
    if rank == 0:
        torch.save(outcome, out)
    shutdown(require_stopped=True)


def run_resumed(
    case: Case,
    save_world: int,
    load_worlds: Iterable[int],
    saved_after: int,
    timeout_s: float = SPAWN_TIMEOUT_S,
) -> dict[int, Outcome]:
    """``case``'s first ``saved_after`` steps on ``save_world`` ranks, saved with DCP, then the
    rest on each of ``load_worlds`` ranks after loading it: the end of each resumed run."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, out = str(Path(tmp) / "ckpt"), str(Path(tmp) / "saved.pt")
        _spawn(_resume_worker, save_world, (case, ckpt, saved_after, False, out), timeout_s)
        saved = torch.load(out, weights_only=False)
        if saved.error:
            return {world: saved for world in load_worlds}
        for world in load_worlds:
            out = str(Path(tmp) / f"resumed_{world}.pt")
            _spawn(_resume_worker, world, (case, ckpt, saved_after, True, out), timeout_s)
            results[world] = torch.load(out, weights_only=False)
    return results


# -- comparison ------------------------------------------------------------------------------


class OwnPieceOnly(Owners):
    """Owners whose gather skips the exchange: the owner's 'whole' matrix is its own piece, the
    rest zeros (Newton-Schulz or an SVD of a partial matrix, the bug the exchange avoids)."""

    def gather(self, pieces, dtype):
        wholes = {}
        for i in self.mine:
            whole = torch.zeros(self.layouts[i].shape, dtype=dtype)
            self.layouts[i].cut(whole, self.rank).copy_(pieces[i])
            wholes[i] = whole
        return wholes


def outcome_fixtures(cases: list[Case], worlds: Sequence[int]) -> tuple[Any, Any]:
    """Module-scoped ``sharded`` (``(world, outcomes by case name)``, one spawn per world in
    ``worlds``) and ``single`` (outcomes by case name) fixtures of ``cases``."""

    @pytest.fixture(scope="module", params=worlds)
    def sharded(request):
        world = request.param
        return world, {c.name: o for c, o in zip(cases, run_sharded(cases, world), strict=True)}

    @pytest.fixture(scope="module")
    def single():
        return {case.name: run_single(case) for case in cases}

    return sharded, single


class RunCache:
    """Outcomes of one test module's cases, each run once per session (a spawn of ranks costs
    seconds): a case's name is its key within the module that owns the cache."""

    def __init__(self) -> None:
        self._runs: dict[tuple, Outcome] = {}

    def sharded(
        self, world: int, cases: list[Case], skip_partial_sums: bool = False
    ) -> list[Outcome]:
        """``cases`` on ``world`` ranks, one spawn for those not run yet."""
        key = lambda case: (world, case.name, skip_partial_sums)  # noqa: E731
        todo = [case for case in cases if key(case) not in self._runs]
        if todo:
            outcomes = run_sharded(todo, world, skip_partial_sums=skip_partial_sums)
            self._runs.update(zip(map(key, todo), outcomes, strict=True))
        return [self._runs[key(case)] for case in cases]

    def single(self, case: Case) -> Outcome:
        if case.name not in self._runs:
            self._runs[case.name] = run_single(case)
        return self._runs[case.name]


def differences(sharded: Outcome, single: Outcome, atol: float = 0.0) -> list[str]:
    """What differs (by more than ``atol``; 0: bitwise) between two outcomes, one line each."""
    if sharded.error or single.error:
        return [f"errors: sharded {sharded.error!r}, single {single.error!r}"]
    lines = []
    for name, expected in single.params.items():
        lines += _compare(f"param {name}", sharded.params.get(name), expected, atol)
    for name, state in single.states.items():
        got = sharded.states.get(name, {})
        if set(got) != set(state):
            lines.append(f"state {name}: keys {sorted(got)} != {sorted(state)}")
            continue
        for key, expected in state.items():
            lines += _compare(f"state {name}[{key}]", got[key], expected, atol)
    return lines


def _compare(what: str, got: Any, expected: Any, atol: float) -> list[str]:
    if not isinstance(expected, torch.Tensor):
        return [] if got == expected else [f"{what}: {got!r} != {expected!r}"]
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        shape = getattr(got, "shape", type(got).__name__)
        return [f"{what}: shape {shape} != {tuple(expected.shape)}"]
    if got.dtype != expected.dtype:
        return [f"{what}: dtype {got.dtype} != {expected.dtype}"]
    if expected.is_floating_point() or expected.is_complex():
        gap = (got.double() - expected.double()).abs().max().item() if got.numel() else 0.0
        same = torch.equal(got, expected) if atol == 0 else gap <= atol
        return [] if same else [f"{what}: max |diff| {gap:.3g} > {atol:g}"]
    return [] if torch.equal(got, expected) else [f"{what}: integer values differ"]


def unsharded_states(outcome: Outcome) -> list[str]:
    """Tensor states of more than one element that a sharded run did not keep as DTensors
    (DCP could not reshard them)."""
    return [
        f"{name}[{key}]"
        for name, state in outcome.states.items()
        for key, value in state.items()
        if isinstance(value, torch.Tensor)
        and value.numel() > 1
        and key not in outcome.dtensor_states.get(name, set())
    ]
