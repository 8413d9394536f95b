"""GWT and GWT-Mini on FSDP2 shards laid out as the trainer lays them out for them
(``foam.baselines.gwt.wavelet_layout``: a matrix by the columns its wavelet runs along only where
each rank's columns are whole ``2**level`` pairs, else by rows), against the single-process step:
2, 3 and 4 gloo ranks (``tests/helpers/sharded_parity.py``, ``Case.method_layout``), parameters
and states, and a DCP checkpoint resumed on other world sizes.

The harness's model gives: gate and up (16 x 12), which FOAM shards by columns, by rows for
GWT-Mini (its level 4 pairs 16 columns) at every world size, and for GWT's level 2 at 2 and 4
ranks (6 and 3 columns a rank), by columns at 3 (4 a rank); rows the ranks do not divide (the
attention's 10 at 3 and 4 ranks) and a rank with an empty shard (``down_proj``'s 4 rows at 3 ranks,
5 at 4). A row shard transforms its rows alone, so the step is the single process's bitwise but
for the limiter's norm, a sum over the ranks (within 1e-12 in float64); without the limiter it is
bitwise.
"""

from __future__ import annotations

import pytest

from foam.baselines.gwt import mini_level, transforms_alone
from foam.registry import shard_dims
from tests.helpers.sharded_parity import (
    Case,
    Outcome,
    RunCache,
    differences,
    run_resumed,
    unsharded_states,
)

REORDERED = 1e-12  # float64 sums of a few squares in another order
GATE = (16, 12)
"""The harness model's gate/up shape."""

CASES = [
    Case("gwt_mini", {"weight_decay": 0.1}, method_layout=True),
    Case("gwt", {"weight_decay": 0.1}, method_layout=True),
    Case("gwt_mini", {"norm_growth_limit": None}, micro_batches=2, method_layout=True),
    Case(
        "gwt",
        {"norm_growth_limit": None, "others": "reference"},
        micro_batches=2,
        method_layout=True,
    ),
]
DEFAULT_CASES = CASES[:1] + CASES[2:3]

RUNS = RunCache()
sharded, single = RUNS.sharded, RUNS.single


def assert_single_process_step(case: Case, outcome: Outcome) -> None:
    """Within ``REORDERED`` with the limiter, bitwise without it; each rank's planned state is
    what it holds; every state a DTensor DCP reshards."""
    reference = single(case)
    limited = case.hparams.get("norm_growth_limit", 1.01) is not None
    assert differences(outcome, reference, REORDERED if limited else 0.0) == [], case.name
    planned, held = zip(*outcome.per_rank_state, strict=True)
    assert planned == held, "foam.planned_state_numel per rank != the state each rank holds"
    assert outcome.planned_whole == reference.planned_whole
    assert unsharded_states(outcome) == [], "a state DCP cannot reshard"


@pytest.mark.parametrize(
    ("method", "shape", "ranks", "dim"),
    [
        # llama_60m's gate/up (1376 x 512): GWT-Mini's level-9 pairs span all 512 columns.
        ("gwt_mini", (1376, 512), 2, 0),
        ("gwt_mini", (1376, 512), 4, 0),
        ("gwt", (1376, 512), 4, 1),  # 128 columns a rank: whole level-2 pairs
        # the harness model's gate/up: 6, 4 and 3 columns a rank at 2, 3 and 4 ranks
        ("gwt_mini", GATE, 2, 0),
        ("gwt_mini", GATE, 3, 0),
        ("gwt", GATE, 2, 0),
        ("gwt", GATE, 3, 1),
        ("gwt", GATE, 4, 0),
        # FSDP2 shards columns only evenly: 3 ranks never split llama_60m's 512 columns.
        ("gwt", (1376, 512), 3, 0),
        # wider than tall: FOAM already shards the rows, which any level takes.
        ("gwt_mini", (512, 1376), 4, 0),
    ],
)
def test_the_trainer_shards_by_rows_where_column_shards_cut_wavelet_pairs(
    method, shape, ranks, dim
):
    assert shard_dims(method, {})(shape, ranks) == dim


def test_a_column_shard_is_local_only_with_whole_pairs():
    assert transforms_alone((16, 12), 1, 3, 2)  # 4 columns a rank, pairs of 4
    assert not transforms_alone((16, 12), 1, 2, 2)  # 6 columns a rank
    assert not transforms_alone((1376, 512), 1, 2, mini_level(512))
    assert transforms_alone((1376, 512), 0, 4, mini_level(512))  # rows: always
    assert transforms_alone(GATE, 1, 1, mini_level(12))  # one rank holds whole rows
    assert shard_dims("gwt", {"level": None})(GATE, 2) == 1  # no wavelet: FOAM's columns


@pytest.mark.distributed
def test_two_ranks_take_the_single_process_step():
    for case, outcome in zip(DEFAULT_CASES, sharded(2, DEFAULT_CASES), strict=True):
        assert_single_process_step(case, outcome)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_case_on_two_three_and_four_ranks_is_the_single_process_step(world):
    for case, outcome in zip(CASES, sharded(world, CASES), strict=True):
        assert_single_process_step(case, outcome)


@pytest.mark.slow
@pytest.mark.distributed
def test_gwt_mini_without_the_partial_sums_is_wrong():
    """The negative control: each rank's limiter then sees its own rows' norm only."""
    case = CASES[0]
    (outcome,) = sharded(2, [case], skip_partial_sums=True)
    wrong = differences(outcome, single(case), 1e-9)
    assert any("grad_norm" in line for line in wrong)
    assert any("gate_proj" in line for line in wrong)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    "case",
    [
        Case("gwt_mini", steps=4, method_layout=True),
        Case("gwt", steps=4, method_layout=True),  # gate/up: rows on 2 ranks, columns on 3
    ],
)
def test_saved_on_two_ranks_resumes_on_three_and_on_one(case):
    resumed = run_resumed(case, save_world=2, load_worlds=(3, 1), saved_after=2)
    for world, outcome in resumed.items():
        assert differences(outcome, single(case), REORDERED) == [], world
