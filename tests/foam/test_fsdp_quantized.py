"""Issue #76, the 8-bit methods (``adamw8bit``, ``foam8bit``) on FSDP2 shards: each rank quantises
its own shard (``foam/shard_quantized.py``), bitwise the single-process step, parameters and
states, at 2, 3 and 4 gloo ranks (``tests/helpers/sharded_parity.py``); layouts whose shards would not
begin on a block boundary are refused in one line.

``QuantModel``'s shapes (float32: bitsandbytes' kernels take no float64) at 2, 3 and 4 ranks:
rows the ranks do not divide (``wide``'s 10 rows at 3 and 4 ranks, ``grouped``'s 23 at all), an
empty shard (``layers.0.short``'s 4 rows at 3 ranks, ``layers.1.short``'s 5 at 4 ranks), a state
whose block spans two rows (``grouped``, 23 x 128: two rows a block, 12, 8 or 6 rows a rank), an
embedding of 11 rows, and foam8bit's level-2 folds of 1024 columns to 256. With ``min_8bit_size``
2000 (adamw8bit) the embedding's 2816 entries are 8-bit while each rank holds fewer than 2000 of
them (as ``grouped``'s, ``short``'s at 4 ranks): a threshold judged on the shard would keep them
in float32, which the comparison of the states' dtypes would see; likewise foam8bit's folded
``short`` (1024 or 1280 entries, at 1000). ``TallModel``'s 520 x 512 matrix is folded along its
rows, so the trainer shards it by columns where the ranks divide 512: 256 a rank at 2 ranks
(whole blocks), 128 at 4 (refused); at 3 ranks by rows.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Shard

from foam.shard_quantized import BLOCK, QuantBlocks, blocks, shard_entries
from foam.sharding import SHARDED_METHODS, ShardingNotSupported
from tests.helpers.sharded_parity import (
    Case,
    RunCache,
    differences,
    run_resumed,
    unsharded_states,
)

bnb = pytest.importorskip("bitsandbytes")
import bitsandbytes.functional as F  # noqa: E402

RUNS = RunCache()
sharded, single = RUNS.sharded, RUNS.single

_EMBED_ROWS, _WIDTH = 11, 256
_NORM = 257
"""A float state (under ``min_8bit_size``) in 129, 86 or 65 entries a rank, none a whole number of
torch's fused AdamW vectors (foam8bit's path for small states): each shard is stepped as the
whole tensor's call steps its entries (``foam/shard_adamw.py``), the whole's scalar tail too."""


class _Layer(nn.Module):
    def __init__(self, matrices: dict[str, tuple[int, int]]) -> None:
        super().__init__()
        for name, (rows, cols) in matrices.items():
            setattr(self, name, nn.Linear(cols, rows, bias=False))


def _seeded(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    return model.to(dtype)


class QuantModel(nn.Module):
    """Parameters only (the harness seeds the gradients); shapes in the module docstring."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(_EMBED_ROWS, _WIDTH)
        self.layers = nn.ModuleList(
            [
                _Layer({"wide": (10, 1024), "short": (4, 1024)}),
                _Layer({"short": (5, 1024), "grouped": (23, 128)}),
            ]
        )
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(_NORM))
        _seeded(self, dtype)


class TallModel(nn.Module):
    """One 520 x 512 matrix, sharded by columns at 2 and 4 ranks."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Layer({"tall": (520, 512)})])
        _seeded(self, dtype)


def _case(method: str, model: type[nn.Module] = QuantModel, **kwargs) -> Case:
    hparams = {"min_8bit_size": 2000 if method == "adamw8bit" else 1000, **kwargs.pop("hp", {})}
    return Case(method, hparams, dtype=torch.float32, model=model, **kwargs)


CASES = [
    _case("adamw8bit", hp={"weight_decay": 0.1}),
    _case("adamw8bit", hp={"alpha": 0.5}, micro_batches=2),
    _case("foam8bit", hp={"weight_decay": 0.1}),
    _case("foam8bit", micro_batches=2),
]
TALL = [_case("adamw8bit", TallModel), _case("foam8bit", TallModel)]
EIGHT_BIT = {"adamw8bit": "state1", "foam8bit": "exp_avg"}
"""The state key that holds each method's 8-bit codes."""


def assert_bitwise(case: Case, outcome) -> None:
    """Parameters and states (dtypes included) bitwise the single-process run's; every state
    a DTensor DCP reshards, but bitsandbytes' constant code books (the same on every rank)."""
    reference = single(case)
    assert differences(outcome, reference) == [], case.name
    assert [s for s in unsharded_states(outcome) if "qmap" not in s] == [], case.name
    key = EIGHT_BIT[case.method]
    quantised = [n for n, s in reference.states.items() if s[key].dtype == torch.uint8]
    assert quantised, "the case quantises nothing"


def test_both_methods_declare_shards():
    assert {"adamw8bit", "foam8bit"} <= set(SHARDED_METHODS)


@pytest.mark.distributed
def test_two_ranks_quantise_their_shards_as_one_process():
    cases = [CASES[0], CASES[2], TALL[0]]  # rows of whole blocks, columns of whole blocks
    for case, outcome in zip(cases, sharded(2, cases), strict=True):
        assert_bitwise(case, outcome)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_case_on_two_three_and_four_ranks_is_the_single_process_step(world):
    cases = CASES + TALL
    for case, outcome in zip(cases, sharded(world, cases), strict=True):
        if world == 4 and case.model is TallModel:  # 128 columns a rank
            assert outcome.error.startswith(f"ShardingNotSupported: {case.method} under FSDP2: ")
            assert "layers.0.tall.weight of shape (520, 512)" in outcome.error
            assert "sharded by dim 1 over 4 ranks, 128 entries of each row a rank" in outcome.error
            assert "\n" not in outcome.error
        elif world == 3 and case.method == "foam8bit" and case.model is TallModel:
            assert "FOAM under FSDP2" in outcome.error  # FOAM's own fold, sharded by rows
        else:
            assert_bitwise(case, outcome)


@pytest.mark.slow
@pytest.mark.distributed
def test_blocks_across_shards_are_refused_in_one_line():
    """The harness's own model: every matrix smaller than one block, so any row split straddles."""
    cases = [Case("adamw8bit", {"min_8bit_size": 0}), Case("foam8bit", {"min_8bit_size": 0})]
    for case, outcome in zip(cases, sharded(2, cases), strict=True):
        assert outcome.error.startswith(f"ShardingNotSupported: {case.method} under FSDP2: ")
        assert "sharded by dim 0 over 2 ranks" in outcome.error
        assert "\n" not in outcome.error


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("method", ["adamw8bit", "foam8bit"])
def test_saved_on_two_ranks_resumes_on_three_and_on_one(method):
    case = _case(method, steps=4)
    resumed = run_resumed(case, save_world=2, load_worlds=(3, 1), saved_after=2)
    for world, outcome in resumed.items():
        assert differences(outcome, single(case)) == [], world


# -- the layout rule against bitsandbytes, in one process -------------------------------------

LAYOUTS = [
    ((10, 256), 0, 4),  # 3, 3, 3, 1 rows of whole blocks
    ((5, 1024), 0, 4),  # 2, 2, 1, 0 rows: an empty shard
    ((23, 128), 0, 4),  # two rows a block, 6 rows a rank
    ((23, 128), 0, 3),  # 8 rows a rank
    ((95, 96), 0, 4),  # 8 rows are 3 blocks; 24 rows a rank, the last 23
    ((23, 128), 0, 5),  # 5 rows a rank: a block straddles
    ((10, 10), 0, 2),  # 50 entries a rank
    ((22, 96), 0, 3),  # 8 rows a rank but 3 of them on the last
    ((4, 1024), 1, 4),  # 256 columns a rank
    ((4, 1024), 1, 8),  # 128 columns a rank
    ((3, 384), 1, 3),  # 128 columns a rank (each row 1.5 blocks)
    ((600,), 0, 3),  # a vector: 200 entries a rank
    ((1024,), 0, 3),  # 342 entries a rank
    ((1024,), 0, 4),  # 256 a rank
]


def _scales_padded(absmax: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """bitsandbytes' scales (one per block, in order) in ``QuantBlocks``' layout."""
    layout = QuantBlocks.of(shape).absmax_shape
    padded = torch.zeros(math.prod(layout))
    padded[: absmax.numel()] = absmax
    return padded.view(layout)


@pytest.mark.parametrize(("shape", "dim", "ranks"), LAYOUTS)
def test_a_shard_quantised_alone_is_the_whole_tensors_blocks_exactly_when_allowed(
    shape, dim, ranks
):
    """Each ``torch.chunk`` shard quantised alone by bitsandbytes gives the whole tensor's codes
    and, from the scales laid out as ``QuantBlocks`` says and chunked like the state, its scales,
    exactly in the layouts ``shard_entries`` allows; in the others some shard's blocks begin
    at the wrong origin and differ (so a layout rule that let them through would fail here)."""
    whole = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    code = F.create_dynamic_map(signed=True)
    codes, scales = F.quantize_blockwise(whole, code=code, blocksize=BLOCK)
    layout = _scales_padded(scales.absmax, shape)
    same = True
    for part, part_codes, part_scales in zip(
        torch.chunk(whole, ranks, dim),
        torch.chunk(codes, ranks, dim),
        torch.chunk(layout, ranks, dim if len(shape) == 2 else 0),
        strict=False,
    ):
        if part.numel() == 0:
            continue
        mine, mine_scales = F.quantize_blockwise(part.contiguous(), code=code, blocksize=BLOCK)
        expected = part_scales.reshape(-1)[: blocks(part.numel())]
        same &= torch.equal(mine, part_codes) and torch.equal(mine_scales.absmax, expected)
    assert same is (shard_entries(shape, Shard(dim), ranks) is None)


def test_the_scale_layout_and_the_llama_1b_down_proj_rule():
    """In one process the layout holds bitsandbytes' scales in order, then zero padding."""
    assert QuantBlocks.of((17, 96)).absmax_shape == (3, 3)  # 8 rows = 3 blocks; 17 rows 7 blocks
    assert QuantBlocks.of((1024,)).absmax_shape == (4, 1)
    assert QuantBlocks.of((2048, 5461)).absmax_shape == (8, 5461)
    assert shard_entries((2048, 5461), Shard(0), 2) is None  # 1024 rows: 21844 blocks
    assert shard_entries((2048, 5461), Shard(0), 16) == 128 * 5461


def test_llama_1b_down_proj_on_three_ranks_is_refused_naming_it():
    """The trainer's layout (meta model, a fake process group): 683 of down_proj's 2048 rows of
    5461 a rank are not whole blocks; the first 8-bit matrix that breaks is named."""
    from repro.memory_estimator import sharded_estimate

    with pytest.raises(ShardingNotSupported) as refused:
        sharded_estimate("llama_1b", "adamw8bit", 3)
    message = str(refused.value)
    assert "adamw8bit under FSDP2: model.layers.0.mlp.down_proj.weight" in message
    assert "of shape (2048, 5461) is sharded by dim 0 over 3 ranks" in message
    assert "\n" not in message


# -- the trainer end to end ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    ("optim", "overrides"), [("adamw8bit", ("optim.min_8bit_size=12000",)), ("foam8bit", ())]
)
def test_two_rank_fsdp_training_follows_the_ddp_losses(tmp_path, optim, overrides):
    """``train/pretrain.py`` on ``llama_tiny`` (its sharding, accumulation, clipping, DCP save)
    under FSDP2 on 2 ranks against DDP on 2 ranks: the same losses up to the reduce-scatter's
    reordering. The 32000 x 64 embedding and head are 8-bit in both; adamw8bit's
    ``min_8bit_size`` keeps the 172 x 64 MLP matrices, which no 2-rank shard cuts into whole
    blocks (32 columns, or 86 rows of 64, a rank), in float32 (foam8bit folds them below 4096)."""
    from tests.helpers.cli import command, run, torchrun, train_losses

    steps = ("trainer.max_steps=4", "trainer.eval_every=0", "trainer.save_every=2", *overrides)
    losses = {}
    for layout in ("ddp", "fsdp"):
        cmd = command(tmp_path / layout, *steps, f"trainer.parallelism={layout}", optim=optim)
        run(torchrun(cmd))
        losses[layout] = train_losses(tmp_path / layout)
    assert sorted(losses["fsdp"]) == [1, 2, 3, 4]
    assert losses["fsdp"] == pytest.approx(losses["ddp"], rel=1e-5)
