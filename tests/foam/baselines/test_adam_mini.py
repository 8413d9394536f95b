"""adam_mini and foam_adam_mini against adam-mini 1.1.1, and exact cases."""

import copy

import pytest
import torch
from torch import nn

from foam.baselines.adam_mini import AdamMini, second_moment_blocks
from foam.registry import build_optimizer
from foam.state import planned_state_numel, state_bytes
from tests.helpers.optim import TINY_LLAMA, SpecFold, random_grads, step_with, tiny_llama

adam_mini = pytest.importorskip("adam_mini")

GQA = {**TINY_LLAMA, "num_attention_heads": 8, "num_key_value_heads": 2}
HEADS = dict(dim=64, n_heads=4)
STEPS = 10


def moment_bytes(opt):
    steps = sum(s["step"].numel() * 4 for s in opt.state.values() if "step" in s)
    return state_bytes(opt) - steps


@pytest.mark.parametrize("heads_given", [True, False], ids=["heads-given", "heads-from-config"])
@pytest.mark.parametrize("config", [TINY_LLAMA, GQA], ids=["mha", "gqa"])
def test_adam_mini_matches_reference(config, heads_given):
    """Params and both moments within 1e-6 after 10 fp32 steps, with weight decay; ``dim`` and
    ``n_heads`` given, or read from the transformers model's config."""
    model = tiny_llama(**config)
    ref = copy.deepcopy(model)
    heads = dict(dim=64, n_heads=config["num_attention_heads"])
    hp = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt = build_optimizer("adam_mini", model, **hp, **(heads if heads_given else {}))
    ref_opt = adam_mini.Adam_mini(
        ref.named_parameters(),
        **hp,
        **heads,
        n_kv_heads=config["num_key_value_heads"],
        verbose=False,
    )
    grads = random_grads(model, STEPS)
    step_with(opt, model, grads)
    step_with(ref_opt, ref, grads)
    named_ref = dict(ref.named_parameters())
    worst = 0.0
    for name, p in model.named_parameters():
        q = named_ref[name]
        mine, theirs = opt.state[p], ref_opt.state[q]
        assert mine["exp_avg_sq"].numel() == theirs["vmean"].numel(), name
        for a, b in ((p, q), (mine["exp_avg"], theirs["m"]), (mine["exp_avg_sq"], theirs["vmean"])):
            torch.testing.assert_close(a.flatten(), b.flatten(), rtol=1e-6, atol=1e-6, msg=name)
            worst = max(worst, (a.flatten() - b.flatten()).abs().max().item())
    assert worst < 1e-6


def test_partition_follows_adam_mini_names():
    """q/k per head, v/o/MLP/embedding/head per row, norms whole, biases per element."""
    shape = torch.Size((64, 64))
    head_numel = 64 * 64 // 8
    assert second_moment_blocks("model.layers.0.self_attn.q_proj.weight", shape, head_numel) == 8
    k = torch.Size((16, 64))  # 2 KV heads of 8 dims
    assert second_moment_blocks("model.layers.0.self_attn.k_proj.weight", k, head_numel) == 2
    for name in ("self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.up_proj.weight"):
        assert second_moment_blocks(name, shape, head_numel) == 64
    assert second_moment_blocks("model.embed_tokens.weight", (100, 64), head_numel) == 100
    assert second_moment_blocks("lm_head.weight", (100, 64), head_numel) == 100
    assert second_moment_blocks("model.norm.weight", (64,), head_numel) == 1
    assert second_moment_blocks("unmatched.weight", shape, head_numel) == 1
    assert second_moment_blocks("attn.q_proj.bias", (64,), head_numel) == 64


def test_heads_are_required_for_queries_and_keys():
    """A model without a transformers config must be told its heads."""
    without_config = nn.ModuleDict({"q_proj": nn.Linear(8, 8), "norm": nn.LayerNorm(8)})
    with pytest.raises(ValueError, match="n_heads="):
        build_optimizer("adam_mini", without_config)
    assert build_optimizer("adam_mini", without_config, dim=8, n_heads=2).head_numel == 32
    with pytest.raises(ValueError, match="named_parameters"):
        AdamMini(list(tiny_llama().parameters()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foam_adam_mini_level0_is_adam_mini(dtype):
    model = tiny_llama(dtype)
    ref = copy.deepcopy(model)
    opt = build_optimizer("foam_adam_mini", model, level=0, weight_decay=0.1, **HEADS)
    ref_opt = build_optimizer("adam_mini", ref, weight_decay=0.1, **HEADS)
    grads = random_grads(model, STEPS)
    step_with(opt, model, grads)
    step_with(ref_opt, ref, grads)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_foam_adam_mini_hand_computed():
    """One 2x4 'mlp' matrix (a block per row), level 1, with the update written out by hand."""
    w = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    lr, (b1, b2), eps = 0.1, (0.5, 0.75), 1e-8
    opt = AdamMini([("mlp.w", w)], lr=lr, betas=(b1, b2), eps=eps, level=1)
    spec = SpecFold((2, 4), 1)  # the spec's A and E as matrices
    g1 = torch.tensor([[1.0, 3.0, 0.0, 2.0], [4.0, 4.0, -1.0, 1.0]], dtype=torch.float64)
    g2 = torch.tensor([[2.0, 0.0, 1.0, 1.0], [0.0, -2.0, 3.0, 3.0]], dtype=torch.float64)

    # step 1: m/bc1 = A(G), so the residual restores G; v/bc2 = row mean of G^2 = 3.5 and 8.5
    w.grad = g1
    opt.step()
    first = -lr * g1 / (torch.tensor([[3.5], [8.5]], dtype=torch.float64).sqrt() + eps)
    torch.testing.assert_close(w.detach(), first, rtol=0, atol=1e-15)
    assert opt.state[w]["exp_avg"].tolist() == [[1.0, 0.5], [2.0, 0.0]]  # (1 - b1) * (2, 1; 4, 0)

    # step 2: (E(M~)/bc1 + G - E(A(G))) / (sqrt(v/bc2) + eps)
    w.grad = g2
    opt.step()
    m = b1 * (1 - b1) * spec.A(g1) + (1 - b1) * spec.A(g2)
    v = b2 * (1 - b2) * torch.tensor([[3.5], [8.5]]).double() + (1 - b2) * g2.square().mean(1, True)
    numerator = spec.E(m / (1 - b1**2)) + g2 - spec.E(spec.A(g2))
    second = first - lr * numerator / ((v / (1 - b2**2)).sqrt() + eps)
    torch.testing.assert_close(w.detach(), second, rtol=0, atol=1e-15)


@pytest.mark.parametrize(("name", "extra"), [("adam_mini", {}), ("foam_adam_mini", {"level": 2})])
def test_state_bytes_match_plan_in_param_dtype(name, extra):
    model = tiny_llama(torch.bfloat16)
    opt = build_optimizer(name, model, **HEADS, **extra)
    step_with(opt, model, random_grads(model, 1))
    assert moment_bytes(opt) == 2 * planned_state_numel(opt)
    states = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
    assert all(v.dtype == torch.bfloat16 for v in states)
    with torch.device("meta"):
        meta = tiny_llama(seed=None)
    assert planned_state_numel(build_optimizer(name, meta, **HEADS, **extra)) == (
        planned_state_numel(opt)
    )


def test_foam_adam_mini_saves_state_against_adam_mini():
    model = tiny_llama()
    mini = planned_state_numel(build_optimizer("adam_mini", model, **HEADS))
    folded = planned_state_numel(build_optimizer("foam_adam_mini", model, level=2, **HEADS))
    matrix_numel = sum(
        p.numel() for n, p in model.named_parameters() if "proj" in n and p.ndim == 2
    )
    assert mini - folded == matrix_numel * 3 // 4  # every matrix here folds exactly by 4


@pytest.mark.parametrize("name", ["adam_mini", "foam_adam_mini"])
def test_lambda_lr(name):
    model = tiny_llama()
    opt = build_optimizer(name, model, lr=1e-2, alpha=0.5, **HEADS)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.1 * (step + 1))
    step_with(opt, model, random_grads(model, 1))
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-3, 2e-3])
