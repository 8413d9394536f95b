"""Issue #76 for LDAdamW and 8-bit GaLore: each one's step on FSDP2 shards (2, 3 and 4 gloo
ranks, ``tests/helpers/sharded_parity.py``) against the single-process step, parameters and states.

LDAdamW's power iteration (its SVD at the first step) runs on each matrix's owner once per
``step()``, from the whole gradient-plus-error or the whole blend ``b``; the owner sends the basis
back (and, where the basis lies along the sharded dim, the projection). 8-bit GaLore is GaLore's
sharded step with bitsandbytes' kernel on each rank's moments: quantised whole where they are
replicated, per shard where every shard starts at a 256-value block boundary (the harness's model
at ``scale=32``, 2 and 4 ranks), refused in one line where a block would straddle two ranks (3
ranks at ``scale=32``). At ``scale=1`` its states are all below ``min_8bit_size`` (32-bit states
on the same layouts: rows the ranks do not divide, empty shards).

Within 1e-12 in float64, not bitwise: a shard's product with a basis is BLAS's product of a slice,
which it blocks differently from the whole matrix's (the last bits of gate/up's column pieces
differ; the rows' pieces are bitwise here), and a projection along the sharded dim is a sum over
ranks. 8-bit codes are compared exactly.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Shard

import foam.sharding
from foam.shard_quantized import shard_entries
from tests.helpers import sharded_parity
from tests.helpers.sharded_parity import (
    Case,
    OwnPieceOnly,
    differences,
    outcome_fixtures,
    run_resumed,
    run_sharded,
    run_single,
    unsharded_states,
)

REORDERED = 1e-12
GALORE8BIT = {"update_proj_gap": 2}  # refreshes at steps 1 and 3
LDADAMW = [
    Case("ldadamw", {"weight_decay": 0.1}),
    Case("ldadamw", {"proj_method": "svd"}),
    Case("ldadamw", {"others": "reference"}, micro_batches=2),
]
EIGHT_BIT = [
    Case("galore8bit", {**GALORE8BIT, "weight_decay": 0.1}, scale=32),
    Case("galore8bit", GALORE8BIT, micro_batches=2, scale=32),
]
CASES = [*LDADAMW, Case("galore8bit", GALORE8BIT), *EIGHT_BIT]
WORLDS = (2, 3, 4)
Q_MOMENT = (320, 96)
"""The ``scale=32`` model's attention moments: rank a quarter of the widest matrix's 384."""
STRADDLES = {3}
"""World sizes at which the attention moments (``Q_MOMENT``, sharded by rows) put a block across
two ranks (107 rows of 96 a rank; 160 and 80 rows at 2 and 4 ranks are 60 and 30 whole
blocks)."""


# -- the block alignment, in one process ------------------------------------------------------


@pytest.mark.parametrize("world", WORLDS)
def test_the_refused_world_sizes_are_the_shared_8bit_rule(world):
    """galore8bit's moments take the rule every 8-bit method shares (``foam.shard_quantized``,
    checked against bitsandbytes' own blocks in ``tests/foam/test_fsdp_quantized.py``): q's
    row-sharded moment straddles exactly at the world sizes the tests below expect refused."""
    entries = shard_entries(Q_MOMENT, Shard(0), world)
    assert (entries is not None) is (world in STRADDLES)
    if entries is not None:
        assert entries == 107 * 96


def test_both_methods_declare_they_shard():
    assert {"ldadamw", "galore8bit"} <= set(foam.sharding.SHARDED_METHODS)


# -- equality with the single-process step ------------------------------------------------


sharded, single = outcome_fixtures(CASES, WORLDS)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_sharded_step_is_the_single_process_step(sharded, single, case):
    world, outcomes = sharded
    outcome = outcomes[case.name]
    if case.scale == 32 and world in STRADDLES:
        assert outcome.error.count("\n") == 0
        assert "layers.0.self_attn.q_proj.weight" in outcome.error
        shape = "of shape (320, 320) (its 8-bit state (320, 96)) is sharded by dim 0 over 3 ranks"
        assert shape in outcome.error
        assert "10272 entries a rank" in outcome.error
        assert "so a block would straddle two ranks" in outcome.error
        return
    assert differences(outcome, single[case.name], atol=REORDERED) == [], f"{world} ranks"
    assert unsharded_states(outcome) == []  # every state a DTensor: DCP reshards it


@pytest.mark.slow
@pytest.mark.distributed
def test_eight_bit_states_are_quantised_both_sharded_and_replicated(sharded):
    """At ``scale=32`` q's moments are sharded by rows (the basis on the unsharded side), gate's
    replicated (its basis lies along its sharded columns): both 8-bit, with their scales."""
    world, outcomes = sharded
    if world in STRADDLES:
        pytest.skip("refused at this world size")
    outcome = outcomes[EIGHT_BIT[0].name]
    for name in ("layers.0.self_attn.q_proj.weight", "layers.0.mlp.gate_proj.weight"):
        state = outcome.states[name]
        assert state["exp_avg"].dtype == torch.uint8, name
        assert {"exp_avg_absmax", "exp_avg_sq_absmax"} <= outcome.dtensor_states[name]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    ("case", "load_worlds"),
    [
        (Case("ldadamw", steps=4), (3, 1)),
        (Case("galore8bit", GALORE8BIT, steps=4), (3, 1)),
        (Case("galore8bit", GALORE8BIT, steps=4, scale=32), (4, 1)),  # 3 would refuse
    ],
    ids=lambda value: value.name if isinstance(value, Case) else str(value),
)
def test_dcp_saved_on_two_ranks_resumes_on_other_world_sizes(case, load_worlds):
    """LDAdamW's error feedback (saved as ``error``, the gradient it lives in) and 8-bit codes
    and scales reshard with their DTensor placements."""
    resumed = run_resumed(case, save_world=2, load_worlds=load_worlds, saved_after=2)
    expected = run_single(case)
    for world, outcome in resumed.items():
        assert differences(outcome, expected, atol=REORDERED) == [], f"resumed on {world}"


def _worker_without_exchange(rank, world, init_file, cases, out, skip_partial_sums):

    import foam.baselines.ldadam

    foam.baselines.ldadam.Owners = OwnPieceOnly
    sharded_parity._cases_worker(rank, world, init_file, cases, out, skip_partial_sums)


@pytest.mark.slow
@pytest.mark.distributed
def test_skipping_the_exchange_or_the_partial_sums_breaks_equality(tmp_path):
    """The negative controls: LDAdamW's basis from the owner's own piece only, or 8-bit GaLore's
    projections not summed across ranks, differ from the single-process step."""
    ldadamw = LDADAMW[0]
    out = str(tmp_path / "outcomes.pt")
    sharded_parity._spawn(_worker_without_exchange, 2, ([ldadamw], out, False), 300)
    (outcome,) = torch.load(out, weights_only=False)
    assert outcome.error is None
    assert differences(outcome, run_single(ldadamw), atol=REORDERED)
    galore8bit = EIGHT_BIT[0]
    (outcome,) = run_sharded([galore8bit], 2, skip_partial_sums=True)
    assert outcome.error is None
    gaps = differences(outcome, run_single(galore8bit), atol=REORDERED)
    assert gaps and all("mlp" in line for line in gaps), gaps


@pytest.mark.slow
@pytest.mark.distributed
def test_two_rank_fsdp_llama_tiny_run_matches_the_unsharded_run():
    """``tests/helpers/fsdp_parity_worker.py`` (two micro-batches a step, gradient clipping): LDAdamW's
    error feedback rides in the sharded gradients FSDP2 accumulates into, and 8-bit GaLore's
    embeddings and head are 8-bit on each rank's rows (32000 x 64 in blocks that the 2 ranks'
    16000 rows split whole); the losses are the single-process run's to float reordering."""
    from tests.helpers.fsdp_parity import sharded_and_single

    sharded, single = sharded_and_single("ldadamw", "galore8bit")
    for name in ("ldadamw", "galore8bit"):
        assert "refused" not in sharded[name], sharded[name]
        assert len(single[name]["losses"]) == 5
        assert sharded[name]["losses"] == pytest.approx(single[name]["losses"], rel=1e-4), name
