"""train/update_cosine.py: the cosine of an optimizer's step with Adam's, by hand and end to end."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from tests.helpers.cli import command, records, run
from train.distributed import shutdown
from train.errors import ConfigError
from train.update_cosine import UpdateCosine, averages, track_update_cosine

G1 = [[3.0, -4.0]]
G2 = [[1.0, 2.0]]
BETAS, EPS = (0.9, 0.95), 1e-8


def tracked(optimizer, due_steps):
    """Two steps (gradients ``G1``, ``G2``) of ``optimizer`` over a one-matrix model's ``0.weight``
    (1 x 2) with the cosine measured at ``due_steps``; what it logged."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 1, bias=False))
    optimizer = optimizer(model.parameters())
    logged, done = [], {"steps": 0}
    UpdateCosine(
        model,
        optimizer,
        next_step=lambda: done["steps"] + 1,
        due=lambda step: step in due_steps,
        log=logged.append,
    )
    for g in (G1, G2):
        model[0].weight.grad = torch.tensor(g)
        optimizer.step()
        done["steps"] += 1
    return logged


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_sgd_against_adam_by_hand():
    """SGD steps along -g. Adam's first step is -g/|g| elementwise: cos = (3 + 4) / (5 sqrt 2);
    its second is -m_hat / sqrt(v_hat) from the EMAs of both gradients."""

    def sgd(params):
        optimizer = torch.optim.SGD(params, lr=0.1)
        optimizer.param_groups[0].update(betas=BETAS, eps=EPS)  # what the shadow Adam reads
        return optimizer

    logged = tracked(sgd, {1, 2})
    first = 7 / (5 * math.sqrt(2))
    pairs = list(zip(G1[0], G2[0], strict=True))
    m = [(0.9 * 0.1 * a + 0.1 * b) / (1 - 0.9**2) for a, b in pairs]
    v = [(0.95 * 0.05 * a * a + 0.05 * b * b) / (1 - 0.95**2) for a, b in pairs]
    second = cosine(G2[0], [mi / (math.sqrt(vi) + EPS) for mi, vi in zip(m, v, strict=True)])
    assert [r["step"] for r in logged] == [1, 2]
    # The step taken is measured as a float32 difference of weights, which loses the bits the
    # weights' magnitude takes (~1e-6 relative here; 1.1e-6 seen on one machine): 1e-5 is ample and
    # still far below the gap between the two steps' cosines (0.99 and 0.17).
    assert logged[0]["update_cosine/mean"] == pytest.approx(first, rel=1e-5)
    assert logged[1]["update_cosine/0"] == pytest.approx(second, rel=1e-5)
    assert second < first < 1


def test_adamw_is_adam_and_only_due_steps_are_measured():
    def adamw(params):
        return torch.optim.AdamW(params, lr=0.1, betas=BETAS, eps=EPS, weight_decay=0.0)

    logged = tracked(adamw, {2})
    assert [r["step"] for r in logged] == [2]
    assert logged[0]["update_cosine/mean"] == pytest.approx(1.0, abs=1e-6)


def test_averages_per_layer_per_type_and_overall():
    cosines = {
        "model.layers.0.self_attn.q_proj.weight": 0.2,
        "model.layers.0.mlp.up_proj.weight": 0.4,
        "model.layers.1.self_attn.q_proj.weight": 0.6,
    }
    assert averages(cosines) == pytest.approx(
        {
            "update_cosine/layer_0": 0.3,
            "update_cosine/layer_1": 0.6,
            "update_cosine/q_proj": 0.4,
            "update_cosine/up_proj": 0.4,
            "update_cosine/mean": 0.4,
        }
    )


def test_off_registers_nothing():
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    run_ = SimpleNamespace(cfg=SimpleNamespace(trainer=SimpleNamespace(log_update_cosine=False)))
    run_.optimizer = optimizer
    assert track_update_cosine(run_, None, None) is None
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks


@pytest.mark.slow
@pytest.mark.parametrize(("optim", "adam_like"), [("adamw", True), ("foam2", False)])
def test_trainer_logs_the_cosine_at_every_evaluation(tmp_path, optim, adam_like):
    run_dir = tmp_path / "run"
    overrides = ("trainer.max_steps=4", "trainer.eval_every=2", "trainer.save_every=0")
    run(command(run_dir, *overrides, "trainer.log_update_cosine=true", optim=optim))
    logged = [r for r in records(run_dir) if "update_cosine/mean" in r]
    assert [r["step"] for r in logged] == [2, 4]
    layers = {k for k in logged[0] if k.startswith("update_cosine/layer_")}
    assert layers == {"update_cosine/layer_0", "update_cosine/layer_1"}
    for record in logged:
        if adam_like:  # AdamW's own step (fp32, no decay): the metric's fixed point
            assert record["update_cosine/mean"] == pytest.approx(1.0, abs=1e-4)
        else:
            assert 0 < record["update_cosine/mean"] < 0.999
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 4


def test_sharded_matrices_are_refused_in_one_line():
    """Under FSDP2 the matrices are DTensor shards, which a shadow Adam of whole matrices cannot
    follow. (The guard once tested the parameters with the model-level ``FSDPModule`` test, so it
    never fired.)"""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False))
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters())
        with pytest.raises(ConfigError, match="needs whole matrices"):
            UpdateCosine(model, optimizer, next_step=lambda: 1, due=bool, log=print)
    finally:
        shutdown()
