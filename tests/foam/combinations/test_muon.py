"""muon and foam_muon against torch.optim.Muon (Moonlight scale) + torch AdamW, and exact cases."""

import copy

import pytest
import torch

import foam
import foam.combinations.foam_muon
from foam.combinations.foam_muon import FoldedMuon
from foam.param_groups import split_params
from foam.registry import build_optimizer
from foam.state import planned_state_numel, state_bytes
from tests.helpers.optim import SpecFold, random_grads, step_with, tiny_llama

STEPS = 10


def ns_fp64(grad, ns_coefficients, ns_steps, eps):
    """Newton-Schulz quintic (baselines.md 6.1) in float64, so both sides agree to ~1e-15."""
    a, b, c = ns_coefficients
    x = grad.double()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return (x.T if tall else x).to(grad.dtype)


@pytest.fixture
def fp64_ns(monkeypatch):
    monkeypatch.setattr(torch.optim._muon, "_zeropower_via_newtonschulz", ns_fp64)


def moment_bytes(opt):
    """State bytes without the step counters (which planned_state_numel does not count)."""
    steps = sum(s["step"].numel() * 4 for s in opt.state.values() if "step" in s)
    return state_bytes(opt) - steps


@pytest.mark.usefixtures("fp64_ns")
def test_muon_matches_torch_muon_and_adamw():
    """Matrices: torch Muon(match_rms_adamw) at lr*alpha; the rest: torch AdamW at lr."""
    model = tiny_llama(torch.float64)
    ref = copy.deepcopy(model)
    hp = dict(lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, alpha=0.5)
    opt = build_optimizer("muon", model, **hp)
    split = split_params(ref)
    matrices, others = [p for _, p in split.matrices], [p for _, p in split.others]
    ref_muon = torch.optim.Muon(matrices, lr=1e-3, weight_decay=0.1, adjust_lr_fn="match_rms_adamw")
    ref_adam = torch.optim.AdamW(others, lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    grads = random_grads(model, STEPS)
    step_with(opt, model, grads)
    step_with([ref_muon, ref_adam], ref, grads)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-12, msg=name)


def test_muon_update_rms_matches_adamw_scale():
    """Moonlight scale: an orthogonalised update has RMS about 0.2 * lr (baselines.md 6.4.3)."""
    model = tiny_llama()
    opt = build_optimizer("muon", model, lr=1e-2)
    q = model.model.layers[0].self_attn.q_proj.weight
    before = q.detach().clone()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    rms = (q - before).pow(2).mean().sqrt().item()
    assert 0.6 * 0.2e-2 < rms < 1.2 * 0.2e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_foam_muon_level0_is_muon_bit_for_bit(dtype):
    """Level 0 folds nothing: same op sequence as torch's Muon, bf16 Newton-Schulz included."""
    model = tiny_llama(dtype)
    ref = copy.deepcopy(model)
    opt = build_optimizer("foam_muon", model, level=0, lr=3e-3, weight_decay=0.1)
    ref_opt = build_optimizer("muon", ref, lr=3e-3, weight_decay=0.1)
    grads = random_grads(model, STEPS)
    step_with(opt, model, grads)
    step_with(ref_opt, ref, grads)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("nesterov", [True, False])
def test_foam_muon_hands_unfolded_momentum_plus_residual_to_newton_schulz(monkeypatch, nesterov):
    """Hand-computed: B~ = EMA of A(G), NS input = lerp(G, E(B~) + G - E(A(G)), mu)."""
    seen = []

    def capture(grad, coefficients, steps, eps):
        seen.append(grad.clone())
        return ns_fp64(grad, coefficients, steps, eps)

    monkeypatch.setattr(torch.optim._muon, "_zeropower_via_newtonschulz", capture)
    w = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    mu = 0.5
    opt = FoldedMuon([w], lr=0.1, momentum=mu, nesterov=nesterov, level=1)
    g1 = torch.tensor([[1.0, 3.0, 0.0, 2.0], [4.0, 4.0, -1.0, 1.0], [0.0, 2.0, 5.0, 7.0]])
    g2 = torch.tensor([[2.0, 0.0, 1.0, 1.0], [0.0, -2.0, 3.0, 3.0], [1.0, 1.0, 1.0, 1.0]])
    b = torch.zeros(3, 2, dtype=torch.float64)
    spec = SpecFold((3, 4), 1)  # the spec's A and E as matrices
    for g in (g1, g2):
        w.grad = g.double()
        opt.step()
        b = mu * b + (1 - mu) * spec.A(w.grad)
        full = spec.E(b) + w.grad - spec.E(spec.A(w.grad))
        expected = (1 - mu) * w.grad + mu * full if nesterov else full
        torch.testing.assert_close(seen[-1], expected, rtol=0, atol=1e-15)
        torch.testing.assert_close(opt.state[w]["momentum_buffer"], b, rtol=0, atol=1e-15)
    # the block means of step 1 written out: rows (2, 1), (4, 0), (1, 6)
    torch.testing.assert_close(
        spec.A(g1.double()), torch.tensor([[2.0, 1.0], [4.0, 0.0], [1.0, 6.0]]).double()
    )


@pytest.mark.parametrize(("name", "extra"), [("muon", {}), ("foam_muon", {"level": 2})])
def test_state_bytes_match_plan_and_keep_param_dtype(name, extra):
    model = tiny_llama(torch.bfloat16)
    opt = build_optimizer(name, model, **extra)
    step_with(opt, model, random_grads(model, 1))
    assert moment_bytes(opt) == 2 * planned_state_numel(opt)
    states = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
    assert all(v.dtype == torch.bfloat16 for v in states)


def test_foam_muon_state_is_folded_and_plannable_on_meta():
    model = tiny_llama()
    opt = build_optimizer("foam_muon", model, level=2)
    q = model.model.layers[0].self_attn.q_proj.weight
    step_with(opt, model, random_grads(model, 1))
    assert opt.state[q]["momentum_buffer"].shape == (64, 16)
    with torch.device("meta"):
        meta = tiny_llama(seed=None)
    assert planned_state_numel(build_optimizer("foam_muon", meta)) == planned_state_numel(opt)


@pytest.mark.parametrize("name", ["muon", "foam_muon"])
def test_lambda_lr_drives_every_part(name):
    model = tiny_llama()
    opt = build_optimizer(name, model, lr=1e-2, alpha=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.1 * (step + 1))
    step_with(opt, model, random_grads(model, 1))
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-3, 2e-3])
    for part in opt.parts:
        for group in part.param_groups:
            assert any(group is g for g in opt.param_groups)


def test_bad_level_fails_at_construction():
    with pytest.raises(ValueError, match="level"):
        build_optimizer("foam_muon", tiny_llama(), level=-1)


@pytest.mark.parametrize(
    ("option", "value"),
    [("momentum", 1.0), ("momentum", float("inf")), ("ns_steps", 0), ("ns_steps", -1)],
)
def test_momentum_and_newton_schulz_steps_are_checked_by_name(option, value):
    """torch's Muon checks neither: momentum 1 or more grows the buffer without bound, and without
    a Newton-Schulz step the update is not orthogonalised while the step's scale assumes it is."""
    for name in ("muon", "foam_muon"):
        with pytest.raises(foam.OptionError, match=rf"{option} must be") as err:
            build_optimizer(name, tiny_llama(), **{option: value})
        assert err.value.key == option
    with pytest.raises(foam.OptionError, match=rf"{option} must be"):
        FoldedMuon([torch.zeros(8, 8, requires_grad=True)], **{option: value})
