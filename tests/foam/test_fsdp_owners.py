"""The whole-matrix owners (``foam/shard_owners.py``) and the methods that step FSDP2 shards
through them, against the single-process step (``tests/helpers/sharded_parity.py``).

Muon and FOAM-Muon keep their momentum on the shards and run Newton-Schulz on an owner: bitwise
equal to the unsharded step. GaLore refreshes its SVD basis on an owner every 2 steps and projects
each shard: within 1e-12 (float64), the projection being a sum over ranks where the basis lies
along the sharded dim (gate/up, sharded by columns; down, whose basis spans its sharded rows)
and a product of the shard's rows elsewhere. All at 2, 3
and 4 gloo ranks (rows the ranks do not divide, a rank with an empty shard, more same-shape
matrices than ranks, accumulation over micro-batches), resumed from a 2-rank DCP checkpoint on 3
ranks and on 1, and different when the owners' exchange or the partial sums are skipped.
"""

from __future__ import annotations

import pytest
import torch

import foam
from foam.shard_owners import Layout, assign_owners
from tests.helpers import sharded_parity
from tests.helpers.sharded_parity import (
    Case,
    OwnPieceOnly,
    differences,
    outcome_fixtures,
    run_resumed,
    run_sharded,
    run_single,
)

OWNER_METHODS = ("muon", "foam_muon", "galore")
GALORE = {"update_proj_gap": 2}  # a refresh at steps 1 and 3
CASES = (
    Case("muon"),
    Case("foam_muon"),
    Case("foam_muon", {"level": "mini"}),
    Case("galore", GALORE),
    Case("muon", micro_batches=3),
    Case("foam_muon", micro_batches=2),
    Case("galore", GALORE, micro_batches=2),
    Case("galore", {**GALORE, "others": "reference"}),  # GaLore's own AdamW on the rest
)


def check_equal(sharded, single, case: Case) -> list[str]:
    """Bitwise where the work is elementwise or on an owner (Muon, FOAM-Muon); 1e-12 for GaLore,
    whose projection is a sum over ranks where its basis lies along the sharded dim, and a
    product of a shard's rows elsewhere (a one-row shard takes BLAS's matrix-vector kernel, which
    sums in another order than the whole matrix's product: 1e-17 apart here)."""
    return differences(sharded, single, atol=1e-12 if case.method == "galore" else 0.0)


WORLDS = (2, 3, 4)


# -- the primitive, in one process ------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 4, 5, 10, 12])
@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_pieces_are_fsdp2s_torch_chunk_pieces(rows, ranks):
    """A layout cuts dim 0 as ``torch.chunk`` (FSDP2's rule): the last ranks may get none."""
    whole = torch.arange(rows * 3.0).view(rows, 3)
    chunks = torch.chunk(whole, ranks, dim=0)
    layout = Layout((rows, 3), 0, ranks)
    for rank in range(ranks):
        expected = chunks[rank] if rank < len(chunks) else whole[:0]
        assert torch.equal(layout.cut(whole, rank), expected)
        assert layout.piece_shape(rank) == tuple(expected.shape)
    assert sum(layout.piece_numel(r) for r in range(ranks)) == whole.numel()


def test_dim1_pieces_and_a_whole_layout():
    whole = torch.arange(24.0).view(2, 12)
    layout = Layout((2, 12), 1, 4)
    assert [tuple(layout.cut(whole, r)[0, :1].tolist()) for r in range(4)] == [
        (0.0,),
        (3.0,),
        (6.0,),
        (9.0,),
    ]
    assert Layout((2, 12), None, 4).cut(whole, 3) is whole


def test_owners_go_round_robin_for_one_shape_and_balance_cost_across_shapes():
    same = [Layout((10, 10), 0, 3)] * 7
    assert assign_owners(same, 3) == [0, 1, 2, 0, 1, 2, 0]
    big, small = Layout((64, 64), 0, 2), Layout((32, 32), 0, 2)  # cost 8:1
    owners = assign_owners([small] * 8 + [big], 2)
    assert owners[-1] == 0 and owners[:-1] == [1] * 8  # 8 small ones balance one big


# -- equality with the single-process step ------------------------------------------------


sharded, single = outcome_fixtures(CASES, WORLDS)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_sharded_step_is_the_single_process_step_bit_for_bit(sharded, single, case):
    world, outcomes = sharded
    assert check_equal(outcomes[case.name], single[case.name], case) == [], f"{world} ranks"


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_state_keeps_the_parameters_placement(sharded, case):
    """Every matrix's state tensors are DTensors (so DCP saves and reshards them)."""
    _, outcomes = sharded
    outcome = outcomes[case.name]
    keys = {"momentum_buffer"} if "muon" in case.method else {"exp_avg", "exp_avg_sq", "basis"}
    matrices = [n for n in outcome.states if n.endswith("proj.weight")]
    assert len(matrices) == 14
    for name in matrices:
        assert outcome.dtensor_states[name] == keys, name


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("method", OWNER_METHODS)
def test_dcp_saved_on_two_ranks_resumes_on_three_and_on_one(method):
    case = Case(method, GALORE if method == "galore" else {}, steps=4)
    resumed = run_resumed(case, save_world=2, load_worlds=(3, 1), saved_after=2)
    expected = run_single(case)
    for world, outcome in resumed.items():
        assert check_equal(outcome, expected, case) == [], f"resumed on {world}"


def _worker_without_exchange(rank, world, init_file, cases, out, skip_partial_sums):
    import foam.baselines.muon
    import foam.lowrank

    foam.baselines.muon.Owners = foam.lowrank.Owners = OwnPieceOnly
    sharded_parity._cases_worker(rank, world, init_file, cases, out, skip_partial_sums)


@pytest.mark.slow
@pytest.mark.distributed
def test_skipping_the_exchange_or_the_partial_sums_breaks_equality(tmp_path):
    """The negative controls: without the owners' exchange, or (GaLore) without the partial
    sums, the sharded step differs from the single-process one."""
    cases = [Case(m, GALORE if m == "galore" else {}) for m in OWNER_METHODS]
    out = str(tmp_path / "outcomes.pt")
    sharded_parity._spawn(_worker_without_exchange, 2, (cases, out, False), 300)
    for case, outcome in zip(cases, torch.load(out, weights_only=False), strict=True):
        assert outcome.error is None
        assert check_equal(outcome, run_single(case), case), case.name
    galore = Case("galore", GALORE)
    (outcome,) = run_sharded([galore], 2, skip_partial_sums=True)
    assert outcome.error is None
    gaps = check_equal(outcome, run_single(galore), galore)
    assert gaps and all("mlp" in line for line in gaps), gaps


def test_owner_methods_declare_they_shard():
    assert set(OWNER_METHODS) <= set(foam.sharding.SHARDED_METHODS)


# -- the trainer's step: a 2-rank llama_tiny run against the unsharded one ---------------------


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_fsdp_llama_tiny_run_matches_the_unsharded_run():
    """``tests/helpers/fsdp_parity_worker.py`` (two micro-batches a step, gradient clipping) of each
    owners' method: the sharded run's losses are the single-process run's (which equals DDP's)
    to float reordering (FSDP2's reduce-scatter sums the ranks' gradients in another order)."""
    from tests.helpers.fsdp_parity import sharded_and_single

    sharded, single = sharded_and_single(*OWNER_METHODS)
    for name in OWNER_METHODS:
        assert "refused" not in sharded[name], sharded[name]
        assert len(single[name]["losses"]) == 5
        assert sharded[name]["losses"] == pytest.approx(single[name]["losses"], rel=1e-4), name
