"""foam.FOAM against torch's AdamW, a naive restatement of FOAM_SPEC section 2, and exact cases."""

import copy
import math

import pytest
import torch

from foam import FOAM, OptionError, state_bytes
from tests.helpers.optim import SpecFold, random_grads, random_params, step_with

SHAPES = [(6, 12), (10, 3), (4, 2, 5), (7,)]  # divisible, tall + non-divisible, 3-d, 1-d


def run(optimizer, params, grads):
    """``step_with``, casting the (float32) gradients to each parameter's dtype."""
    step_with(optimizer, params, grads, to_param_dtype=True)


class NaiveFOAM:
    """FOAM_SPEC section 2 written as plainly as possible, in float64, with A and E as the dense
    matrices of ``SpecFold`` (not ``foam.folding``: a folding bug must show here)."""

    def __init__(
        self,
        params,
        *,
        lr,
        betas,
        eps,
        weight_decay,
        level,
        alpha,
        residual=1.0,
        residual_in_second_moment=True,
        second_moment="square_of_mean",
        bias_correction=True,
        fold_axis="larger",
    ):
        self.params, self.lr, self.betas, self.eps, self.wd = params, lr, betas, eps, weight_decay
        self.level, self.alpha, self.rho = level, alpha, float(residual)
        self.r_in_v, self.second_moment = residual_in_second_moment, second_moment
        self.bias_correction, self.fold_axis, self.t, self.state = bias_correction, fold_axis, 0, {}

    def step(self):
        self.t += 1
        b1, b2 = self.betas
        bc1 = 1 - b1**self.t if self.bias_correction else 1.0
        bc2 = 1 - b2**self.t if self.bias_correction else 1.0
        for i, p in enumerate(self.params):
            with torch.no_grad():
                G = p.grad.double()
                if p.dim() < 2:  # plain AdamW, no alpha
                    m, v = self.state.get(i, (torch.zeros_like(G), torch.zeros_like(G)))
                    m, v = b1 * m + (1 - b1) * G, b2 * v + (1 - b2) * G * G
                    self.state[i] = (m, v)
                    u = (m / bc1) / ((v / bc2).sqrt() + self.eps)
                    p.mul_(1 - self.lr * self.wd).sub_(self.lr * u.to(p.dtype))
                    continue
                spec = SpecFold(p.shape, self.level, self.fold_axis)
                G = G.reshape(spec.shape)
                A, E = spec.A, spec.E
                m, v = self.state.get(i, (0.0, 0.0))
                g_tilde = A(G)
                m = b1 * m + (1 - b1) * g_tilde
                v_in = g_tilde**2 if self.second_moment == "square_of_mean" else A(G * G)
                v = b2 * v + (1 - b2) * v_in
                self.state[i] = (m, v)
                R = G - E(g_tilde)
                m_hat = E(m / bc1) + self.rho * R
                v_hat = E(v / bc2) + (self.rho**2 * R**2 if self.r_in_v else 0.0)
                u = m_hat / (v_hat.sqrt() + self.eps)
                p.mul_(1 - self.lr * self.wd)
                p.sub_(self.lr * self.alpha * u.reshape(p.shape).to(p.dtype))


def test_level_zero_with_alpha_one_is_torch_adamw():
    ours, ref = random_params(SHAPES), random_params(SHAPES)
    hp = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    # fused_adamw=False: the 1-d tensor takes the per-tensor path too (the fused kernel is
    # compared with AdamW(fused=True) below)
    foam = FOAM(ours, level=0, alpha=1.0, fused_adamw=False, **hp)
    adamw = torch.optim.AdamW(ref, foreach=False, **hp)
    for step_grads in random_grads(SHAPES, 10):
        run(foam, ours, [step_grads])
        run(adamw, ref, [step_grads])
        for a, b in zip(ours, ref, strict=True):
            assert torch.equal(a, b)  # bit for bit: the identity fold uses AdamW's own formula
    for a, b in zip(ours, ref, strict=True):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(foam.state[a][key].view(b.shape), adamw.state[b][key])


OPTION_CASES = [
    {},
    {"level": 0},  # the identity fold with alpha = 0.25
    {"level": 1},
    {"level": 1, "fold_axis": "last"},
    {"level": "mini"},
    {"second_moment": "mean_of_squares"},
    {"residual": False},
    {"residual": 0.5},
    {"residual": 2.0},
    {"residual_in_second_moment": False},
    {"bias_correction": False},
]


@pytest.mark.parametrize("options", OPTION_CASES, ids=lambda o: ",".join(map(str, o.items())))
def test_matches_naive_restatement_of_the_spec(options):
    settings = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05, level=2, alpha=0.25)
    settings.update(options)
    ours, ref = (
        random_params(SHAPES, dtype=torch.float64),
        random_params(SHAPES, dtype=torch.float64),
    )
    foam, naive = FOAM(ours, **settings), NaiveFOAM(ref, **settings)
    for step_grads in random_grads(SHAPES, 10, dtype=torch.float64):
        run(foam, ours, [step_grads])
        run(naive, ref, [step_grads])
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_first_step_reconstructs_the_gradient():
    """At t = 1 with bias correction, E(M~/bc1) + R equals G exactly, as Adam's m_hat."""
    p = torch.zeros(4, 10, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(4, 10, dtype=torch.float64)
    p.grad = grad.clone()
    foam = FOAM([p], lr=1.0, level=2, alpha=1.0, eps=0.0)
    foam.step()
    spec = SpecFold(p.shape, 2)
    A, E = spec.A, spec.E
    m_hat = E(foam.state[p]["exp_avg"] / (1 - 0.9)) + grad - E(A(grad))
    torch.testing.assert_close(m_hat, grad)
    # and the update divides it by sqrt(E(V~/bc2) + R^2), computed here by hand
    v_hat = E(A(grad) ** 2) + (grad - E(A(grad))) ** 2
    torch.testing.assert_close(-p.detach(), grad / v_hat.sqrt())


def test_without_residual_updates_are_constant_within_blocks():
    p = torch.zeros(3, 16, requires_grad=True)
    foam = FOAM([p], lr=0.1, level=2, residual=False)
    for _ in range(3):
        p.grad = torch.randn(3, 16)
        foam.step()
    blocks = p.detach().view(3, 4, 4)
    assert torch.equal(blocks, blocks[..., :1].expand_as(blocks))
    assert p.detach().abs().sum() > 0


@pytest.mark.parametrize(
    ("shape", "level"), [((8, 32), 2), ((8, 30), 3), ((48, 16), 4), ((5, 9), 1)]
)
def test_state_size_is_two_rows_times_blocks(shape, level):
    p = torch.zeros(shape, requires_grad=True)
    foam = FOAM([p], level=level)
    p.grad = torch.ones(shape)
    foam.step()
    rows, n = min(shape), max(shape)
    expected = 2 * rows * math.ceil(n / 2**level)
    numel = sum(foam.state[p][k].numel() for k in ("exp_avg", "exp_avg_sq"))
    assert numel == expected == foam.planned_state_numel()
    assert state_bytes(foam) == expected * 4 + 4  # fp32 moments + the fp32 step counter


@pytest.mark.parametrize("shape", [(8, 32), (40, 6)])
def test_mini_state_is_two_per_row_of_the_smaller_dim(shape):
    p = torch.zeros(shape, requires_grad=True)
    foam = FOAM([p], level="mini")
    p.grad = torch.randn(shape)
    foam.step()
    assert foam.planned_state_numel() == 2 * min(shape)
    assert foam.state[p]["exp_avg"].numel() == min(shape)


def test_level_none_groups_and_vectors_take_adamw_without_alpha():
    ours = random_params(SHAPES)
    ref = random_params(SHAPES)
    foam = FOAM([{"params": ours[:3], "level": None}, {"params": ours[3:]}], lr=1e-2, alpha=0.25)
    adamw = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0)
    grads = random_grads(SHAPES, 5)
    run(foam, ours, grads)
    run(adamw, ref, grads)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)


def test_per_group_overrides():
    a, b = torch.zeros(4, 16, requires_grad=True), torch.zeros(4, 16, requires_grad=True)
    foam = FOAM([{"params": [a], "level": 1}, {"params": [b], "level": 3, "alpha": 1.0}], level=2)
    a.grad, b.grad = torch.ones(4, 16), torch.ones(4, 16)
    foam.step()
    assert foam.state[a]["exp_avg"].shape == (4, 8) and foam.state[b]["exp_avg"].shape == (4, 2)
    # a constant gradient has no residual: the first update is lr * alpha * sign
    torch.testing.assert_close(a.detach(), torch.full((4, 16), -1e-3 * 0.25))
    torch.testing.assert_close(b.detach(), torch.full((4, 16), -1e-3))


def test_bf16_parameters_keep_bf16_states_and_follow_the_float64_reference():
    """Pure bf16 (weights, grads and states in bf16) against the float64 reference started from
    the same bf16-representable weights and fed the same bf16 gradients. The lr is large enough
    that the update is many times the bf16 rounding the tolerance allows for, so weights that
    did not move, or moved the wrong way, fail."""
    settings = dict(lr=0.05, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, level=2, alpha=1.0)
    start = [(0.25 * p.detach()).bfloat16() for p in random_params(SHAPES)]
    ours = [p.clone().requires_grad_() for p in start]
    ref = [p.double().requires_grad_() for p in start]
    foam, naive = FOAM(ours, **settings), NaiveFOAM(ref, **settings)
    grads = [[g.bfloat16() for g in step] for step in random_grads(SHAPES, 5)]
    run(foam, ours, grads)
    run(naive, ref, grads)
    assert all(s["exp_avg"].dtype == torch.bfloat16 for s in foam.state.values())
    tolerance = 1e-2  # 5 roundings to bf16 of weights below 1 (half an ulp <= 2**-9 each)
    for a, b, a0 in zip(ours, ref, start, strict=True):
        movement = b - a0.double()
        assert movement.abs().max() > 10 * tolerance  # measured: 0.24 .. 0.29
        torch.testing.assert_close(a.double(), b, rtol=0, atol=tolerance)  # measured: <= 0.004
        assert (a.double() - b).norm() < 0.05 * movement.norm()  # measured: < 0.02


def test_float64_parameters_compute_in_float64():
    ours = random_params(SHAPES, dtype=torch.float64)
    foam = FOAM(ours, lr=1e-3)
    run(foam, ours, random_grads(SHAPES, 2, dtype=torch.float64))
    assert all(s["exp_avg"].dtype == torch.float64 for s in foam.state.values())


@pytest.mark.parametrize("state_dtype", [None, "float32"])
def test_state_dict_round_trip_gives_the_identical_next_step(state_dtype):
    params = [p.detach().bfloat16().requires_grad_() for p in random_params(SHAPES)]
    foam = FOAM(params, lr=1e-2, state_dtype=state_dtype)
    grads = random_grads(SHAPES, 4)
    run(foam, params, grads[:3])
    saved = copy.deepcopy(foam.state_dict())
    clones = [p.detach().clone().requires_grad_() for p in params]
    restored = FOAM(clones, lr=1e-2, state_dtype=state_dtype)
    restored.load_state_dict(saved)
    expected = torch.float32 if state_dtype else torch.bfloat16
    assert all(s["exp_avg"].dtype == expected for s in restored.state.values())
    run(foam, params, grads[3:])
    run(restored, clones, grads[3:])
    for a, b in zip(params, clones, strict=True):
        assert torch.equal(a, b)


def test_works_with_lr_schedulers_closures_and_zero_grad():
    p = torch.nn.Parameter(torch.randn(4, 8))
    foam = FOAM([p], lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(foam, lambda step: 0.5**step)

    def closure():
        foam.zero_grad()
        loss = p.square().sum()
        loss.backward()
        return loss

    loss = foam.step(closure)
    scheduler.step()
    assert loss is not None and foam.param_groups[0]["lr"] == pytest.approx(5e-3)
    foam.zero_grad()
    assert p.grad is None


def test_converges_on_least_squares():
    torch.manual_seed(0)
    x, w_true = torch.randn(256, 32), torch.randn(32, 16)
    y = x @ w_true
    w = torch.nn.Parameter(torch.zeros(32, 16))
    foam = FOAM([w], lr=0.05, level=2, alpha=1.0)
    for _ in range(500):
        foam.zero_grad()
        loss = (x @ w - y).square().mean()
        loss.backward()
        foam.step()
    assert loss.item() < 1e-3 * y.square().mean().item()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"level": -1}, "level must be"),
        ({"level": "max"}, "level must be"),
        ({"level": 6}, "level 6 makes blocks of 64 entries"),
        ({"fold_axis": "first"}, "fold_axis"),
        ({"second_moment": "max"}, "second_moment"),
        ({"lr": -1.0}, "lr"),
        ({"alpha": -1.0}, "alpha must be >= 0"),
        ({"betas": (0.9, 1.0)}, "betas"),
        ({"state_dtype": "int8"}, "state_dtype"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FOAM([torch.zeros(4, 32, requires_grad=True)], **kwargs)
    # also in a later param group, and in a group of vectors (which are never folded)
    with pytest.raises(ValueError, match=message):
        FOAM(
            [
                {"params": [torch.zeros(4, 32, requires_grad=True)]},
                {"params": [torch.zeros(4, 32, requires_grad=True)], **kwargs},
            ]
        )
    if kwargs != {"level": 6}:  # a level too large for a matrix is not one for a vector
        with pytest.raises(ValueError, match=message):
            FOAM([torch.zeros(4, requires_grad=True)], **kwargs)


def test_a_level_beyond_every_axis_of_a_matrix_is_refused_naming_the_largest_that_fits():
    """Level 6 (blocks of 64) fits a 3 x 128 matrix but not a 6 x 36 one (36 < 64), so the group
    is refused; level 5 (32 <= 36) is the largest both allow."""
    shapes = [(6, 36), (3, 128)]
    with pytest.raises(OptionError, match=r"level 6 .* 6 x 36 .* largest level .* is 5") as err:
        FOAM(random_params(shapes), level=6)
    assert err.value.key == "level"
    assert FOAM(random_params(shapes), level=5).planned_state_numel() == 2 * (6 * 2 + 3 * 4)
    FOAM(random_params([(16, 4)]), level=3, fold_axis="last")  # 8 > 4 columns, but <= 16 rows


def test_options_are_checked_once_per_group_not_per_step(monkeypatch):
    """The level rule runs when a group is added, never while stepping."""
    import foam.folding
    import foam.fused

    foam.fused.kernel_available("cpu")  # its probe plans a matrix of its own, once per process
    calls = []
    check = foam.folding.check_level
    monkeypatch.setattr(
        foam.folding, "check_level", lambda level: calls.append(level) or check(level)
    )
    params = random_params([(8, 16), (16, 8)])
    optimizer = FOAM([{"params": params[:1]}, {"params": params[1:], "level": 1}], level=2)
    assert calls == [2, 1]
    run(optimizer, params, random_grads([(8, 16), (16, 8)], 3))
    assert calls == [2, 1]


def test_transient_memory_of_a_step_is_a_few_copies_of_the_largest_parameter():
    """Parameters are processed one at a time: the peak must not grow with the model."""
    from foam.profiling import peak_transient_bytes

    def peak_for(n_matrices):
        params = [torch.nn.Parameter(torch.randn(64, 256)) for _ in range(n_matrices)]
        foam = FOAM(params, level=2)
        for p in params:
            p.grad = torch.randn_like(p)
        foam.step()  # allocates the states
        peak, kept = peak_transient_bytes(foam.step)
        assert kept == 0
        return peak

    one_param = 64 * 256 * 4
    assert peak_for(8) == peak_for(1)
    assert peak_for(8) <= 3 * one_param


@pytest.mark.parametrize(
    ("dtype", "fused", "reference"),
    [
        (torch.float32, True, {"fused": True}),
        (torch.bfloat16, True, {"fused": True}),
        (torch.float32, False, {"foreach": False}),  # torch's for-loop does bf16 maths in bf16
    ],
)
def test_unfolded_tensors_take_torchs_adamw_bit_for_bit(dtype, fused, reference):
    """Plain-AdamW tensors run torch's fused kernel (fp32 arithmetic on bf16 tensors, no
    temporaries) by default, and the per-tensor path with ``fused_adamw=False``."""
    ours = [p.detach().to(dtype).requires_grad_() for p in random_params(SHAPES)]
    ref = [p.detach().to(dtype).requires_grad_() for p in random_params(SHAPES)]
    hp = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    foam = FOAM(ours, level=None, fused_adamw=fused, **hp)
    adamw = torch.optim.AdamW(ref, **hp, **reference)
    grads = random_grads(SHAPES, 5)
    run(foam, ours, grads)
    run(adamw, ref, grads)
    for a, b in zip(ours, ref, strict=True):
        assert torch.equal(a, b)
        assert torch.equal(foam.state[a]["exp_avg_sq"], adamw.state[b]["exp_avg_sq"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_step_leaves_the_gradients_untouched(dtype):
    """The residual is computed in a temporary, never in ``p.grad`` (which callers may still
    read, e.g. to log a norm)."""
    params = [p.detach().to(dtype).requires_grad_() for p in random_params(SHAPES)]
    foam = FOAM(params, lr=1e-2)
    grads = [g.to(dtype) for g in random_grads(SHAPES, 1)[0]]
    for p, g in zip(params, grads, strict=True):
        p.grad = g.clone()
    foam.step()
    for p, g in zip(params, grads, strict=True):
        assert torch.equal(p.grad, g)


def test_boundary_settings_are_accepted_and_lr_zero_moves_nothing():
    params = random_params(SHAPES)
    before = [p.detach().clone() for p in params]
    foam = FOAM(params, lr=0.0, betas=(0.0, 0.0), eps=0.0, weight_decay=0.0, residual=0.0)
    run(foam, params, random_grads(SHAPES, 2))
    for p, b in zip(params, before, strict=True):
        assert torch.equal(p.detach(), b)
