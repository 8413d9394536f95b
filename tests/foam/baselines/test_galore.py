"""foam.baselines.galore.GaLore against the reference galore_torch.GaLoreAdamW, and its library contracts."""

import itertools
import warnings

import pytest
import torch

import foam
import foam.baselines.galore
from foam import build_optimizer, planned_state_numel, state_bytes
from foam.baselines.galore import GaLore
from tests.helpers.optim import random_grads, random_params, step_with, tiny_llama

SHAPES = [(48, 32), (32, 48), (32,)]  # tall (right basis), wide (left basis), a vector
HP = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.1)
LOW = dict(rank=8, update_proj_gap=3)  # refreshes at steps 1, 4, 7, 10


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_matches_reference_galore_adamw_across_refreshes(dtype, tol):
    reference_module = pytest.importorskip("galore_torch")
    ours_p, ref_p = random_params(SHAPES, dtype=dtype), random_params(SHAPES, dtype=dtype)
    ours = GaLore(
        [{"params": ours_p[:2]}, {"params": ours_p[2:], "rank": None}], **HP, **LOW, alpha=0.25
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        ref = reference_module.GaLoreAdamW(
            [
                {"params": ref_p[:2], **LOW, "scale": 0.25, "proj_type": "std"},
                {"params": ref_p[2:]},
            ],
            **HP,
        )
    grads = random_grads(SHAPES, 10, dtype=dtype)
    for step_grads in grads:
        step_with(ours, ours_p, [step_grads])
        step_with(ref, ref_p, [step_grads])
        for a, b in zip(ours_p, ref_p, strict=True):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    for a, b in zip(ours_p, ref_p, strict=True):
        mine, theirs = ours.state[a], ref.state[b]
        for key in ("exp_avg", "exp_avg_sq"):
            assert mine[key].shape == theirs[key].shape
            torch.testing.assert_close(mine[key], theirs[key], rtol=tol, atol=tol)
        if "projector" in theirs:
            torch.testing.assert_close(mine["basis"], theirs["projector"].ortho_matrix)
    # The smaller side is projected: moments are max(m, n) x rank, the basis rank x min(m, n).
    assert ours.state[ours_p[0]]["exp_avg"].shape == (48, 8)
    assert ours.state[ours_p[1]]["exp_avg"].shape == (8, 48)
    assert ours.state[ours_p[1]]["basis"].shape == (32, 8)


def test_basis_refreshes_every_gap_steps_and_moments_carry_over():
    params = random_params(SHAPES, dtype=torch.float64)
    opt = GaLore([params[0]], **HP, **LOW)
    bases, moments = [], []
    grads = random_grads(SHAPES, 5, dtype=torch.float64)
    for step_grads in grads:
        step_with(opt, params[:1], [step_grads[:1]])
        bases.append(opt.state[params[0]]["basis"].clone())
        moments.append(opt.state[params[0]]["exp_avg"].clone())
    changed = [not torch.equal(a, b) for a, b in itertools.pairwise(bases)]
    assert changed == [False, False, True, False]  # new basis at step 4 only
    assert foam.projections_computed(opt) == 2  # steps 1 and 4
    b1 = HP["betas"][0]
    low = grads[3][0] @ bases[3].T
    torch.testing.assert_close(moments[3], b1 * moments[2] + (1 - b1) * low)  # not reset


def test_alpha_scales_the_projected_step_but_not_weight_decay():
    def displacement(alpha, weight_decay):
        params = random_params(SHAPES, dtype=torch.float64)[:1]
        start = params[0].detach().clone()
        opt = GaLore(params, **{**HP, "weight_decay": weight_decay}, **LOW, alpha=alpha)
        step_with(opt, params, [random_grads(SHAPES, 1, dtype=torch.float64)[0][:1]])
        return params[0].detach() - start, start

    d1, _ = displacement(1.0, 0.0)
    d_quarter, _ = displacement(0.25, 0.0)
    torch.testing.assert_close(d_quarter, 0.25 * d1)
    d_wd, start = displacement(0.25, 0.1)
    torch.testing.assert_close(
        d_wd, d_quarter - HP["lr"] * 0.1 * (start + d_quarter)
    )  # decay after the update, with the unscaled lr


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_state_bytes_equal_the_plan_on_a_llama(dtype):
    model = tiny_llama(dtype)
    opt = build_optimizer("galore", model)
    planned = planned_state_numel(opt)
    step_with(opt, model, random_grads(model, 1, seed=0))
    n_params = len(list(model.parameters()))
    elem = torch.finfo(dtype).bits // 8
    assert state_bytes(opt) == planned * elem + 4 * n_params  # + one float32 step counter each
    # rank = hidden/4 = 16 everywhere; the paper's m*r + 2*n*r per matrix (m <= n), Adam elsewhere.
    matrices = [p for n, p in model.named_parameters() if "proj" in n]
    others = [p for n, p in model.named_parameters() if "proj" not in n]
    expected = sum(16 * min(p.shape) + 2 * 16 * max(p.shape) for p in matrices)
    expected += sum(2 * p.numel() for p in others)
    assert planned == expected


def test_registered_defaults_are_the_papers():
    assert foam.baselines.galore.GaLore is GaLore
    opt = build_optimizer("galore", tiny_llama())
    matrices = next(g for g in opt.param_groups if g["name"] == "matrices")
    assert (matrices["rank"], matrices["alpha"], matrices["update_proj_gap"]) == (16, 0.25, 200)
    assert matrices["eps"] == 1e-6 and matrices["proj_type"] == "std"
    others = next(g for g in opt.param_groups if g["name"] == "others")
    assert (others["level"], others["eps"], others["lr"]) == (None, 1e-8, matrices["lr"])
    reference = build_optimizer("galore", tiny_llama(), others="reference")
    others = next(g for g in reference.param_groups if g["name"] == "others")
    assert (others["rank"], others["eps"]) == (None, 1e-6)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 0}, "rank"),
        ({"update_proj_gap": 0}, "update_proj_gap"),
        ({"proj_type": "full"}, "proj_type"),
        ({"eps": -1.0}, "eps"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GaLore(random_params(SHAPES, dtype=torch.float32), **kwargs)


@pytest.mark.parametrize("name", ["galore", "apollo", "ldadamw"])
@pytest.mark.parametrize("fraction", [0.0, -0.25, 1.5])
def test_a_rank_fraction_outside_0_1_is_refused_by_name(name, fraction):
    """A fraction of the hidden size: 0 or less has no rank (it became rank 1 without a word), more
    than 1 a rank beyond the matrices."""
    with pytest.raises(foam.OptionError, match="rank_fraction must be in") as err:
        build_optimizer(name, tiny_llama(), rank_fraction=fraction)
    assert err.value.key == "rank_fraction"
