"""foam.baselines.ldadam.LDAdamW and foam.baselines.gwt.GWT against golden trajectories of their GitHub-only references.

The references are not on PyPI, so (baselines.md section 13) they were run once outside the
project and their trajectories stored in ``tests/data/`` (float64; 10 steps; ``init`` params,
gradients as low-rank ``a @ b`` factors, final params and states):

* ``ldadamw_golden.pt``: ``LDAdamW`` of IST-DASLab/LDAdam ``ldadamw_torch`` (read through the
  saharsamr/LDAdam fork: ``ldadamw.py`` at ``bc64d6e``, whose second-moment transport uses
  ``R o R`` as baselines.md section 8.2 describes; an older version of that file squares ``R``
  twice), with the original block power iteration and float32 QR/SVD. Shapes (24,16) (right),
  (16,24) (left), (12,12) (square: left) at rank 4 plus a full-rank vector; lr 1e-2, betas
  (0.9, 0.95), wd 0.1, rho 0.908; error feedback on/off, power iteration and SVD. Gradients are
  accumulated into ``.grad`` and the optimizer's ``zero_grad`` is called before each step.
* ``gwt_golden.pt``: ``WaveAdamW`` of zqOuO/GWT ``galore_torch/waveadamw.py`` run with upstream
  ``ptwt`` 1.0.1 + PyWavelets 1.9 in place of the repo's vendored ``ptwt1`` (which cannot be
  installed; upstream's Haar ``wavedec``/``waverec`` in ``"zero"`` mode agree with the
  description in baselines.md section 9.1, odd widths included, to 1e-15). Shapes (8,64),
  (8,30), (4,22), (2,517) plus a plain vector; levels 1, 2, 3 and "mini" (ceil(log2 n) per
  matrix); alpha 0.25, lr 1e-3, betas (0.9, 0.95), wd 0.1; smooth rows with a 5x gradient
  spike at step 7 to trip the norm-growth limiter.
"""

import math
from pathlib import Path

import pytest
import torch

import foam.baselines.gwt
import foam.baselines.ldadam
from foam import build_optimizer, planned_state_numel, state_bytes
from foam.baselines.gwt import GWT, haar_dwt, haar_idwt
from foam.baselines.ldadam import LDAdamW
from tests.helpers.optim import random_grads, step_with, tiny_llama

DATA = Path(__file__).resolve().parents[2] / "data"


def golden(name):
    return torch.load(DATA / name, weights_only=False)


def grads_of(step):
    return [a.clone() if b is None else a @ b for a, b in step]


def max_relative(x, y):
    return ((x - y).abs().max() / y.abs().max()).item()


def add_grads(params, grads):
    """What backward does: add into ``.grad`` (which LDAdamW uses to carry its error)."""
    for p, g in zip(params, grads, strict=True):
        p.grad = g if p.grad is None else p.grad + g


def accumulate_grads(model, seed):
    """Add one step of ``random_grads(model, 1, seed=seed)`` into the model's ``.grad``."""
    add_grads(model.parameters(), random_grads(model, 1, seed=seed)[0])


# -- LDAdamW ----------------------------------------------------------------------------------


@pytest.mark.parametrize("config", ["ef_power", "noef_power", "ef_svd"])
def test_ldadamw_matches_reference_golden_trajectory(config):
    data = golden("ldadamw_golden.pt")
    error_feedback, method = data["configs"][config]
    params = [x.clone() for x in data["init"]]
    opt = LDAdamW(
        [{"params": params[:3]}, {"params": params[3:], "rank": None}],
        **data["hp"],
        rank=data["rank"],
        rho=data["rho"],
        proj_method=method,
        error_feedback=error_feedback,
    )
    for step in data["factors"]:
        opt.zero_grad()
        add_grads(params, grads_of(step))
        opt.step()
    expected = data["results"][config]
    # The QR and SVD run in float32, as in the reference, so the trajectory carries float32
    # rounding that depends on the CPU's LAPACK kernels: 1.4e-16 on the machine that made the
    # golden, up to 6.2e-8 (params) and 3.2e-6 (states) on an AVX-512 Xeon, where perturbing the
    # float64 inputs by 1e-15 moves the result by 2e-15 only. A 0.1% change of rho moves the
    # params by 6e-5 and the states by 7e-3, one of beta2 the params by 1.5e-5.
    for i, p in enumerate(params):
        assert max_relative(p, expected["params"][i]) < 1e-6
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt.state[p][key].shape == expected[key][i].shape
            assert max_relative(opt.state[p][key], expected[key][i]) < 1e-4
    for i, p in enumerate(params[:3]):
        assert max_relative(opt.state[p]["basis"], expected["basis"][i]) < 1e-4
        if error_feedback:  # .grad holds the error after step()
            assert max_relative(p.grad, expected["grad"][i]) < 1e-4
    assert opt.state[params[2]]["exp_avg"].shape == (4, 12)  # square: projected on the left


def test_ldadamw_error_feedback_keeps_what_the_projection_lost():
    gen = torch.Generator().manual_seed(0)
    p = torch.zeros(12, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(12, 8, generator=gen, dtype=torch.float64)
    opt = LDAdamW([p], lr=0.0, rank=3)
    p.grad = g.clone()
    opt.step()
    basis = opt.state[p]["basis"]  # right projection: 3 x 8, the top right singular vectors
    torch.testing.assert_close(p.grad, g - g @ basis.T @ basis)  # first step: no momentum error
    opt.zero_grad()
    assert p.grad is not None  # the error survives zero_grad ...
    opt = LDAdamW([p], lr=0.0, rank=3, error_feedback=False)
    p.grad = g.clone()
    opt.step()
    torch.testing.assert_close(p.grad, g)  # ... and without error feedback nothing is written
    opt.zero_grad()
    assert p.grad is None


@pytest.mark.parametrize("others", ["adamw", "reference"])  # inside a Composite, and alone
@pytest.mark.parametrize("set_to_none", [True, False])  # False: the trainer's choice under DDP
def test_the_registry_ldadamw_keeps_its_error_feedback_across_zero_grad(others, set_to_none):
    model = tiny_llama()
    opt = build_optimizer("ldadamw", model, lr=1e-2, others=others)
    step_with(opt, model, random_grads(model, 1))
    matrix, embedding = model.model.layers[0].self_attn.q_proj.weight, model.lm_head.weight
    error = matrix.grad.clone()
    assert error.abs().sum() > 0
    opt.zero_grad(set_to_none=set_to_none)
    assert torch.equal(matrix.grad, error)  # kept for the next step
    assert embedding.grad is None if set_to_none else not embedding.grad.any()


# -- GWT ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("others", ["adamw", "reference"])
def test_the_registry_ldadamw_checkpoints_its_error_feedback(others):
    """The feedback lives in p.grad, which model checkpoints do not save: the optimizer's must."""
    model, clone = tiny_llama(seed=0), tiny_llama(seed=0)
    opt = build_optimizer("ldadamw", model, lr=1e-2, others=others)
    (grads,) = random_grads(model, 1)
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g.clone()
    opt.step()
    opt.zero_grad()
    saved = opt.state_dict()
    carried = [p for p in model.parameters() if p.grad is not None]
    assert carried and all(p.dim() == 2 for p in carried)  # the low-rank matrices only
    assert sum("error" in entry for entry in saved["state"].values()) == len(carried)
    restored = build_optimizer("ldadamw", clone, lr=1e-2, others=others)
    restored.load_state_dict(saved)
    for p, q in zip(model.parameters(), clone.parameters(), strict=True):
        assert (q.grad is None) == (p.grad is None)
        if p.grad is not None:
            assert torch.equal(q.grad, p.grad)
        assert "error" not in restored.state[q]


def test_haar_transform_exact_cases():
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)  # odd: padded with one zero
    approx, (detail,) = haar_dwt(x, 1)
    r = math.sqrt(0.5)
    torch.testing.assert_close(approx, torch.tensor([[3 * r, 3 * r]], dtype=torch.float64))
    torch.testing.assert_close(detail, torch.tensor([[-r, 3 * r]], dtype=torch.float64))
    y = torch.randn(3, 37, dtype=torch.float64)
    for level in (1, 2, 3, foam.baselines.gwt.mini_level(37)):
        approx, details = haar_dwt(y, level)
        assert approx.shape == (3, foam.baselines.gwt.approx_width(37, level))
        torch.testing.assert_close(haar_idwt(approx, details)[:, :37], y)
    approx, _ = haar_dwt(
        y, foam.baselines.gwt.mini_level(37)
    )  # 6 levels: 37 -> 19 -> 10 -> 5 -> 3 -> 2 -> 1
    torch.testing.assert_close(approx[:, 0], y.sum(1) / 8.0)  # one coefficient, sum / 2**(6/2)


@pytest.mark.parametrize("level", ["1", "2", "3", "mini"])
def test_gwt_matches_reference_golden_trajectory(level):
    data = golden("gwt_golden.pt")
    params = [x.clone() for x in data["init"]]
    opt = GWT(
        [{"params": params[:-1]}, {"params": params[-1:], "level": None}],
        **data["hp"],
        level=level if level == "mini" else int(level),
        alpha=data["alpha"],
    )
    step_with(opt, params, map(grads_of, data["factors"]))
    expected = data["results"][level]
    for i, p in enumerate(params):
        assert max_relative(p, expected["params"][i]) < 1e-12  # measured <= 5.5e-16
        for key in ("exp_avg", "exp_avg_sq"):
            assert opt.state[p][key].shape == expected[key][i].shape
            assert max_relative(opt.state[p][key], expected[key][i]) < 1e-12
        if expected["grad_norm"][i] is not None:
            assert max_relative(opt.state[p]["grad_norm"], expected["grad_norm"][i]) < 1e-12
    if level == "mini":
        assert all(opt.state[p]["exp_avg"].shape[1] == 1 for p in params[:-1])


def test_gwt_level_beyond_the_row_width_fails_at_construction():
    with pytest.raises(ValueError, match="level"):
        GWT([torch.zeros(4, 8, requires_grad=True)], level=4)


# -- library contracts, all three -----------------------------------------------------------


def expected_numel(name, model):
    matrices = [p for n, p in model.named_parameters() if "proj" in n]
    total = sum(2 * p.numel() for n, p in model.named_parameters() if "proj" not in n)
    for p in matrices:
        rows, cols = p.shape
        if name == "ldadamw":  # rank 16 = hidden/4: moments 2*max*r, basis min*r
            total += 16 * min(rows, cols) + 2 * 16 * max(rows, cols)
        else:  # rows x ceil(cols / 2**level) per moment, plus one stored norm
            level = foam.baselines.gwt.mini_level(cols) if name == "gwt_mini" else 2
            total += 2 * rows * foam.baselines.gwt.approx_width(cols, level) + 1
    return total


@pytest.mark.parametrize("name", ["ldadamw", "gwt", "gwt_mini"])
def test_state_bytes_equal_the_plan_on_a_llama(name):
    model = tiny_llama(torch.bfloat16)
    opt = build_optimizer(name, model)
    planned = planned_state_numel(opt)
    assert planned == expected_numel(name, model)
    opt.zero_grad()
    accumulate_grads(model, 0)
    opt.step()
    n_params = len(list(model.parameters()))
    assert state_bytes(opt) == planned * 2 + 4 * n_params  # bf16 states + float32 step counters
    with torch.device("meta"):
        meta = tiny_llama()
    assert planned_state_numel(build_optimizer(name, meta)) == planned
