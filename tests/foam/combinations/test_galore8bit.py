"""galore8bit against the reference galore_torch.GaLoreAdamW8bit, step for step, on CPU."""

import warnings

import pytest
import torch

import foam.sharding
from foam import build_optimizer, planned_state_numel, state_bytes
from foam.combinations.galore8bit import GaLore8bit
from foam.shard_quantized import QuantBlocks, kernel_absmax
from tests.helpers.optim import random_grads, random_params, step_with, tiny_llama

pytest.importorskip("bitsandbytes")

# Tall (right basis) and wide (left basis) matrices whose 48 x 8 moments are quantised at
# min_8bit_size 256, a small vector that stays float32 and a long one that is quantised.
SHAPES = [(48, 32), (32, 48), (32,), (300,)]
HP = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
LOW = dict(rank=8, update_proj_gap=3)  # refreshes at steps 1, 4, 7, 10
SMALL = 256


def reference(params, monkeypatch):
    galore_torch = pytest.importorskip("galore_torch")
    # The reference's step synchronises CUDA after every parameter: a no-op on CPU tensors.
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return galore_torch.GaLoreAdamW8bit(
            [
                {"params": params[:2], **LOW, "scale": 0.25, "proj_type": "std"},
                {"params": params[2:]},
            ],
            **HP,
            min_8bit_size=SMALL,
        )


def test_matches_reference_galore_adamw8bit_across_refreshes(monkeypatch):
    """Measured: the same 8-bit codes every step, scales and parameters within a float32 ulp
    (1.2e-7: the projection's rounding), uncompressed parameters bit for bit."""
    ours_p, ref_p = random_params(SHAPES), random_params(SHAPES)
    ours = GaLore8bit(
        [{"params": ours_p[:2]}, {"params": ours_p[2:], "rank": None}],
        **HP,
        **LOW,
        alpha=0.25,
        min_8bit_size=SMALL,
    )
    ref = reference(ref_p, monkeypatch)
    for step_grads in random_grads(SHAPES, 10):
        step_with(ours, ours_p, [step_grads])
        step_with(ref, ref_p, [step_grads])
        for a, b in zip(ours_p, ref_p, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=5e-7)
            mine, theirs = ours.state[a], ref.state[b]
            for key, ref_key in (("exp_avg", "state1"), ("exp_avg_sq", "state2")):
                assert mine[key].dtype == theirs[ref_key].dtype
                assert torch.equal(mine[key], theirs[ref_key])
            if theirs["state1"].dtype == torch.uint8:  # our scales in bitsandbytes' order
                for key, ref_key in (("exp_avg", "absmax1"), ("exp_avg_sq", "absmax2")):
                    scales = kernel_absmax(mine[f"{key}_absmax"], mine[key])
                    torch.testing.assert_close(scales, theirs[ref_key])
    for a, b in zip(ours_p[2:], ref_p[2:], strict=True):
        assert torch.equal(a, b)
    assert ours.state[ours_p[0]]["exp_avg"].dtype == torch.uint8
    assert ours.state[ours_p[2]]["exp_avg"].dtype == torch.float32  # 32 < 256: bnb's 32-bit
    assert ours.state[ours_p[1]]["basis"].shape == (32, 8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_state_bytes_are_the_plan_and_the_paper_split(dtype):
    model = tiny_llama(dtype)
    opt = build_optimizer("galore8bit", model, min_8bit_size=SMALL)
    step_with(opt, model, random_grads(model, 1, seed=0))
    counters = 4 * len(list(model.parameters()))
    assert state_bytes(opt) == opt.planned_state_bytes() + counters
    # The element count is GaLore's (rank hidden/4 = 16): the paper's m*r + 2*n*r per matrix.
    assert planned_state_numel(opt) == planned_state_numel(build_optimizer("galore", model))
    matrices = [p for n, p in model.named_parameters() if "proj" in n]
    embed = model.model.embed_tokens.weight
    assert all(opt.state[p]["exp_avg"].dtype == torch.uint8 for p in matrices)
    assert opt.state[embed]["exp_avg"].dtype == torch.uint8  # 8-bit Adam on the rest too
    moment = opt.state[matrices[0]]["exp_avg"]
    absmax = opt.state[matrices[0]]["exp_avg_absmax"]
    assert absmax.shape == QuantBlocks.of(moment.shape).absmax_shape  # shards with the codes


def test_registered_defaults_and_that_it_shards():
    opt = build_optimizer("galore8bit", tiny_llama())
    matrices = next(g for g in opt.param_groups if g["name"] == "matrices")
    others = next(g for g in opt.param_groups if g["name"] == "others")
    assert (matrices["rank"], matrices["alpha"], matrices["update_proj_gap"]) == (16, 0.25, 200)
    assert matrices["eps"] == 1e-8 and others["rank"] is None and opt.min_8bit_size == 4096
    assert "galore8bit" in foam.sharding.SHARDED_METHODS  # tests/foam/test_fsdp_lowrank8bit.py
