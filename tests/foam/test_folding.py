"""Fold and unfold against hand-computed cases (FOAM_SPEC section 1)."""

import pytest
import torch

from foam.folding import fold, make_plan, unfold, unfold_with_residual
from tests.helpers.optim import SpecFold


def test_divisible_fold_is_block_mean_along_last_axis():
    x = torch.tensor([[1.0, 3.0, 5.0, 7.0], [2.0, 2.0, 0.0, 4.0]])
    plan = make_plan(x.shape, level=1, fold_axis="larger")
    assert (plan.axis, plan.block, plan.folded_shape) == (1, 2, (2, 2))
    assert torch.equal(fold(x, plan), torch.tensor([[2.0, 6.0], [2.0, 2.0]]))
    assert torch.equal(unfold(fold(x, plan), plan), torch.tensor([[2.0, 2, 6, 6], [2, 2, 2, 2]]))


def test_non_divisible_tail_is_mean_of_real_entries():
    # The release zero-pads: its last block would be (9 + 10) / 4 = 4.75. Ours is 9.5.
    x = torch.arange(1.0, 11.0).unsqueeze(0)  # 1 x 10, blocks of 4
    plan = make_plan(x.shape, level=2, fold_axis="larger")
    assert plan.num_blocks == 3 and plan.tail == 2
    assert torch.equal(fold(x, plan), torch.tensor([[2.5, 6.5, 9.5]]))
    expected = torch.tensor([[2.5] * 4 + [6.5] * 4 + [9.5] * 2])
    assert torch.equal(unfold(fold(x, plan), plan), expected)


def test_fold_then_unfold_is_an_orthogonal_projection():
    x = torch.randn(3, 11, dtype=torch.float64)
    plan = make_plan(x.shape, level=2, fold_axis="larger")
    projected = unfold(fold(x, plan), plan)
    assert torch.allclose(unfold(fold(projected, plan), plan), projected)  # idempotent
    assert torch.allclose((x - projected).mul(projected).sum(), torch.tensor(0.0, dtype=x.dtype))


def test_larger_axis_folds_rows_of_a_tall_matrix():
    x = torch.tensor([[1.0, 10.0], [3.0, 20.0], [5.0, 30.0]])  # 3 x 2: rows are the larger dim
    plan = make_plan(x.shape, level=1, fold_axis="larger")
    assert (plan.axis, plan.folded_shape) == (0, (2, 2))
    assert torch.equal(fold(x, plan), torch.tensor([[2.0, 15.0], [5.0, 30.0]]))
    last = make_plan(x.shape, level=1, fold_axis="last")
    assert (last.axis, last.folded_shape) == (1, (3, 1))


def test_mini_keeps_one_value_per_row_of_the_smaller_dim():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 6.0, 8.0]])
    plan = make_plan(x.shape, level="mini", fold_axis="larger")
    assert torch.equal(fold(x, plan), torch.tensor([[2.0], [6.0]]))
    tall = make_plan((7, 3), level="mini", fold_axis="larger")
    assert tall.folded_shape == (1, 3)


def test_tensors_with_more_dims_are_viewed_as_first_dim_by_the_rest():
    plan = make_plan((4, 3, 8), level=3, fold_axis="larger")
    assert (plan.rows, plan.cols, plan.folded_shape) == (4, 24, (4, 3))


def test_level_zero_is_the_identity():
    x = torch.randn(3, 5)
    plan = make_plan(x.shape, level=0, fold_axis="larger")
    assert torch.equal(fold(x, plan), x) and torch.equal(unfold(x, plan), x)


@pytest.mark.parametrize(
    ("shape", "level", "message"),
    [((4, 8), "foo", "int >= 0"), ((4, 8), -1, "int >= 0"), ((8,), 1, "two dims")],
)
def test_bad_plans_raise(shape, level, message):
    with pytest.raises(ValueError, match=message):
        make_plan(shape, level, "larger")


def test_square_matrices_fold_the_last_axis():
    x = torch.tensor([[1.0, 3.0], [5.0, 9.0]])
    plan = make_plan(x.shape, level=1, fold_axis="larger")
    assert plan.axis == 1
    assert torch.equal(fold(x, plan), torch.tensor([[2.0], [7.0]]))


@pytest.mark.parametrize("rho", [1.0, 0.5, 2.0])
@pytest.mark.parametrize(("shape", "level"), [((3, 10), 2), ((11, 4), 3)])
def test_unfold_with_residual_against_the_spec_matrices(shape, level, rho):
    """E(Y) + rho (G - E(A(G))) with the dense A and E of FOAM_SPEC section 1 (tail included)."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(shape, generator=gen, dtype=torch.float64)
    spec = SpecFold(shape, level)
    y = torch.randn(spec.folded_shape, generator=gen, dtype=torch.float64)
    plan = make_plan(shape, level, "larger")
    got = unfold_with_residual(g, fold(g, plan), y, plan, rho)
    expected = spec.E(y) + rho * (g - spec.E(spec.A(g)))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(fold(g, plan), spec.A(g), rtol=1e-12, atol=1e-14)
