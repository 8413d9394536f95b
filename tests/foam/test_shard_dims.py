"""The dim FSDP2 shards each matrix by for a method (``foam.registry.shard_dims``): FOAM's choice
(``foam.sharding.shard_dim``), unless the method's layout rule refuses it and accepts the other
dim, which FSDP2 can shard. The trainer (``train.parallelism.parallelize``) and the memory
estimator (``repro.memory_estimator.shard_as_trainer``) both shard through it."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Shard

import foam
import models
from foam.registry import shard_dims
from foam.sharding import ShardingNotSupported, shard_dim
from repro.memory_estimator import _as_rank, shard_as_trainer, sharded_estimate

QUANTIZED = ("adamw8bit", "foam8bit")
WITH_RULES = (*QUANTIZED, "gwt", "gwt_mini")
"""The methods that declare a layout rule (GWT's: ``tests/foam/test_fsdp_gwt.py``)."""


@pytest.mark.parametrize(
    ("method", "shape", "ranks", "expected"),
    [
        # llama_60m's gate/up on 4 ranks: FOAM's 128 columns a rank are half a 256-entry block;
        # 344 rows of 512 are whole blocks (and 344 rows keep foam8bit's level-2 fold local).
        ("adamw8bit", (1376, 512), 4, 0),
        ("foam8bit", (1376, 512), 4, 0),
        # 256 columns a rank are whole blocks: FOAM's choice stays.
        ("adamw8bit", (1024, 512), 2, 1),
        ("foam8bit", (1024, 512), 2, 1),
        # 258 rows a rank are whole blocks of adamw8bit's state, but 4 (2**level) does not
        # divide them, so foam8bit's fold along rows would straddle ranks: FOAM's choice stays.
        ("adamw8bit", (1032, 512), 4, 0),
        ("foam8bit", (1032, 512), 4, 1),
        # under min_8bit_size (4096 entries) the state is float: any layout, FOAM's choice.
        ("adamw8bit", (64, 32), 4, 1),
        # llama_1b's down_proj on 16 ranks: FOAM's rows (128 x 5461) straddle blocks and 16 does
        # not divide 5461 columns (FSDP2 shards a dim > 0 only evenly): FOAM's choice stays.
        ("adamw8bit", (2048, 5461), 16, 0),
        # llama_7b's gate/up on 64 ranks: 64 columns a rank, or 172 rows of 4096.
        ("adamw8bit", (11008, 4096), 64, 0),
        ("foam8bit", (11008, 4096), 64, 0),
        ("foam", (11008, 4096), 64, 1),
    ],
)
def test_the_method_rule_picks_the_other_dim_only_where_it_refuses_foams(
    method, shape, ranks, expected
):
    assert shard_dims(method, {})(shape, ranks) == expected


def test_methods_without_a_layout_rule_keep_foams_choice():
    shapes = [(1376, 512), (512, 1376), (512, 512), (172, 64), (2048, 5461), (11008, 4096)]
    for method in foam.available_optimizers():
        if method in WITH_RULES:
            continue
        hparams = (
            {"fold_axis": "last"} if "fold_axis" in foam.available_optimizers()[method] else {}
        )
        for shape in shapes:
            for ranks in (2, 3, 4, 64):
                expected = shard_dim(shape, foam.fold_axis_of(hparams), ranks)
                assert shard_dims(method, hparams)(shape, ranks) == expected, (method, shape)


def _matrix_dims(model: str, method: str, ranks: int, **hparams) -> dict[str, int]:
    """The sharded dim of each MLP matrix of layer 0 as the estimator (and trainer) shards it."""
    net = models.build_model(models.load_model_config(model), device="meta", dtype=torch.bfloat16)
    with _as_rank(0, ranks):
        shard_as_trainer(net, ranks, method, hparams)
        mlp = net.model.layers[0].mlp
        dims = {name: getattr(mlp, name).weight.placements[0] for name in ("gate_proj", "up_proj")}
        foam.build_optimizer(method, net, **hparams)  # accepted: no refusal
    assert all(isinstance(p, Shard) for p in dims.values())
    return {name: p.dim for name, p in dims.items()}


@pytest.mark.parametrize("method", QUANTIZED)
def test_8bit_methods_on_llama_60m_x4_are_estimated_with_gate_and_up_by_rows(method):
    whole = sharded_estimate("llama_60m", method, 1, 4, 0).optimizer_bytes
    per_rank = sharded_estimate("llama_60m", method, 4, 4, 0).optimizer_bytes
    assert whole / 4 <= per_rank < 1.1 * whole / 4
    assert _matrix_dims("llama_60m", method, 4) == {"gate_proj": 0, "up_proj": 0}
    assert _matrix_dims("llama_60m", "foam", 4) == {"gate_proj": 1, "up_proj": 1}


@pytest.mark.parametrize("method", QUANTIZED)
def test_8bit_methods_on_llama_7b_x64_shard_gate_and_up_by_rows(method):
    """The matrices' shards are whole blocks (172 rows of 4096); what 64 ranks still refuse is
    the 4096-entry norm gains, 64 entries a rank of an 8-bit state (bitsandbytes quantises from
    4096 entries): with ``min_8bit_size`` above that they stay float and 7B trains on 64."""
    assert _matrix_dims("llama_7b", method, 64, min_8bit_size=4097) == {
        "gate_proj": 0,
        "up_proj": 0,
    }
    with pytest.raises(ShardingNotSupported, match=r"input_layernorm\.weight of shape \(4096,\)"):
        sharded_estimate("llama_7b", method, 64, 2, 0)


def test_a_layout_neither_dim_can_take_is_still_refused_in_one_line():
    with pytest.raises(ShardingNotSupported) as err:
        sharded_estimate("llama_1b", "adamw8bit", 16, 2, 0)
    message = str(err.value)
    assert (
        "model.layers.0.mlp.down_proj.weight of shape (2048, 5461) is sharded by dim 0" in message
    )
    assert "\n" not in message


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("method", QUANTIZED)
def test_the_trainer_shards_tall_matrices_by_rows_for_8bit_methods(tmp_path, method):
    """``train/pretrain.py`` under FSDP2 on 2 ranks with a 1024 x 128 gate/up: FOAM's column
    shards (64 columns a rank) would straddle 256-entry blocks and be refused; the trainer
    shards them by rows (512 rows of 128) and follows its DDP run's losses."""
    from tests.helpers.cli import command, run, torchrun, train_losses

    assert shard_dims(method, {})((1024, 128), 2) == 0
    wider = ("model.hidden_size=128", "model.intermediate_size=1024")
    steps = ("trainer.max_steps=3", "trainer.eval_every=0", "trainer.save_every=0", *wider)
    losses = {}
    for layout in ("ddp", "fsdp"):
        cmd = command(tmp_path / layout, *steps, f"trainer.parallelism={layout}", optim=method)
        run(torchrun(cmd))
        losses[layout] = train_losses(tmp_path / layout)
    assert sorted(losses["fsdp"]) == [1, 2, 3]
    assert losses["fsdp"] == pytest.approx(losses["ddp"], rel=1e-5)
