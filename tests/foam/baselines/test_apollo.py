"""foam.baselines.apollo.APOLLO against the reference apollo_torch.APOLLOAdamW, and its library contracts."""

import itertools
import math

import pytest
import torch

import foam
from foam import build_optimizer, planned_state_numel, state_bytes
from foam.baselines.apollo import APOLLO
from tests.helpers.optim import random_grads, random_params, step_with, tiny_llama

SHAPES = [(48, 32), (32, 48), (32,)]  # tall (right basis), wide (left basis), a vector
HP = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
SPIKES = {4: 8.0, 8: 20.0}  # gradient norm spikes that trip the norm-growth limiter


CASES = [  # scale_type, rank, alpha, scale_front, dtype, tolerance
    ("channel", 4, 1.0, False, torch.float64, 1e-12),
    ("tensor", 1, 128.0, False, torch.float64, 1e-12),
    ("tensor", 1, 128.0, True, torch.float64, 1e-12),
    ("channel", 4, 0.5, True, torch.float32, 2e-6),
]


@pytest.mark.parametrize(("scale_type", "rank", "alpha", "scale_front", "dtype", "tol"), CASES)
def test_matches_reference_apollo_adamw(scale_type, rank, alpha, scale_front, dtype, tol):
    reference_module = pytest.importorskip("apollo_torch")
    ours_p, ref_p = random_params(SHAPES, dtype=dtype), random_params(SHAPES, dtype=dtype)
    low = dict(rank=rank, update_proj_gap=3, proj_type="std")  # redraws at steps 1, 4, 7, 10
    ours = APOLLO(
        [{"params": ours_p[:2]}, {"params": ours_p[2:], "rank": None}],
        **HP,
        **low,
        alpha=alpha,
        scale_type=scale_type,
        scale_front=scale_front,
    )
    ref = reference_module.APOLLOAdamW(
        [
            {
                "params": ref_p[:2],
                **low,
                "scale": alpha,
                "scale_type": scale_type,
                "proj": "random",
            },
            {"params": ref_p[2:]},
        ],
        **HP,
        scale_front=scale_front,
    )
    for step_grads in random_grads(SHAPES, 10, dtype=dtype, scale=SPIKES):
        step_with(ours, ours_p, [step_grads])
        step_with(ref, ref_p, [step_grads])
        for a, b in zip(ours_p, ref_p, strict=True):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    assert foam.projections_computed(ours) == 4  # steps 1, 4, 7, 10
    for a, b in zip(ours_p[:2], ref_p[:2], strict=True):
        mine, theirs = ours.state[a], ref.state[b]
        for key in ("exp_avg", "exp_avg_sq"):
            assert mine[key].shape == theirs[key].shape
            torch.testing.assert_close(mine[key], theirs[key], rtol=tol, atol=tol)
        torch.testing.assert_close(mine["basis"], theirs["projector"].ortho_matrix)
        assert mine["seed"] == theirs["projector"].seed
        torch.testing.assert_close(mine["grad_norm"], theirs["scaled_grad"], rtol=tol, atol=0)


def test_limiter_caps_norm_growth_and_alpha_enters_as_its_square_root():
    def updates(alpha, limit):
        params = random_params(SHAPES, dtype=torch.float64)[:1]
        opt = APOLLO(params, **{**HP, "weight_decay": 0.0}, rank=4, alpha=alpha)
        opt.param_groups[0]["norm_growth_limit"] = limit
        out = []
        for step_grads in random_grads(SHAPES, 6, dtype=torch.float64, scale=SPIKES):
            start = params[0].detach().clone()
            step_with(opt, params, [step_grads[:1]])
            t = len(out) + 1
            step_size = HP["lr"] * math.sqrt(1 - 0.95**t) / (1 - 0.9**t)
            out.append((start - params[0].detach()) / step_size)
        return out

    limited = [torch.linalg.vector_norm(u) for u in updates(1.0, 1.01)]
    # the limiter's ratio has a 1e-8 in its denominator: the cap is 1.01 * (previous + 1e-8)
    assert all(b <= 1.01 * (a + 1e-8) * (1 + 1e-12) for a, b in itertools.pairwise(limited))
    assert limited[4] == pytest.approx(1.01 * limited[3])  # the spike at step 5 is capped
    free = updates(1.0, None)
    scaled = updates(128.0, None)
    for a, b in zip(free, scaled, strict=True):
        torch.testing.assert_close(b, math.sqrt(128.0) * a)


@pytest.mark.parametrize("name", ["apollo", "apollo_mini"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_state_bytes_equal_the_plan_on_a_llama(name, dtype):
    model = tiny_llama(dtype)
    opt = build_optimizer(name, model)
    planned = planned_state_numel(opt)
    step_with(opt, model, random_grads(model, 1, seed=0))
    n_params = len(list(model.parameters()))
    elem = torch.finfo(dtype).bits // 8
    assert state_bytes(opt) == planned * elem + 4 * n_params  # + one float32 step counter each
    rank = 16 if name == "apollo" else 1  # hidden/4, or APOLLO-Mini's 1
    matrices = [p for n, p in model.named_parameters() if "proj" in n]
    others = [p for n, p in model.named_parameters() if "proj" not in n]
    # moments 2*max*r, basis min*r, one stored norm per matrix; AdamW moments elsewhere
    expected = sum(rank * min(p.shape) + 2 * rank * max(p.shape) + 1 for p in matrices)
    expected += sum(2 * p.numel() for p in others)
    assert planned == expected
    with torch.device("meta"):
        meta = tiny_llama()
    assert planned_state_numel(build_optimizer(name, meta)) == planned


def test_registered_defaults_are_the_papers():
    def matrices(name):
        opt = build_optimizer(name, tiny_llama())
        return next(g for g in opt.param_groups if g["name"] == "matrices")

    apollo, mini = matrices("apollo"), matrices("apollo_mini")
    assert (apollo["rank"], apollo["scale_type"], apollo["alpha"]) == (16, "channel", 1.0)
    assert (mini["rank"], mini["scale_type"], mini["alpha"]) == (1, "tensor", 128.0)
    assert apollo["update_proj_gap"] == mini["update_proj_gap"] == 200
    assert apollo["eps"] == 1e-6 and apollo["norm_growth_limit"] == 1.01


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale_type": "row"}, "scale_type"),
        ({"norm_growth_limit": 0.5}, "norm_growth_limit"),
        ({"rank": 1.5}, "rank"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        APOLLO(random_params(SHAPES, dtype=torch.float32), **kwargs)
