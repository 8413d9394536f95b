"""Resuming across a precision change (fp32 <-> bf16) for every registered optimizer.

A run saved with ``trainer.precision=fp32`` and resumed in bf16 (or back) loads an optimizer
state whose tensors have the other dtype; the first step must work and the states must have the
dtypes a fresh optimizer would create for the new parameters.
"""

import copy

import pytest
import torch

import foam
from tests.helpers.optim import random_grads, step_with, tiny_llama

NAMES = sorted(foam.available_optimizers())
EIGHT_BIT = {"adamw8bit", "foam8bit", "galore8bit"}


def dtypes(optimizer, model):
    """Per parameter name, the dtype of each state tensor."""
    return {
        name: {k: v.dtype for k, v in optimizer.state[p].items() if isinstance(v, torch.Tensor)}
        for name, p in model.named_parameters()
    }


@pytest.mark.parametrize(
    ("saved", "resumed"), [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)]
)
@pytest.mark.parametrize("name", NAMES)
def test_resume_in_another_precision(name, saved, resumed):
    if name in EIGHT_BIT:
        pytest.importorskip("bitsandbytes")
    model = tiny_llama(saved)
    before = foam.build_optimizer(name, model)
    step_with(before, model, random_grads(model, 2), to_param_dtype=True)
    state = copy.deepcopy(before.state_dict())

    fresh_model = copy.deepcopy(model).to(resumed)
    model.to(resumed)
    after = foam.build_optimizer(name, model)
    after.load_state_dict(state)
    grads = random_grads(model, 1, seed=2)
    step_with(after, model, grads, to_param_dtype=True)
    assert all(torch.isfinite(p).all() for p in model.parameters())

    fresh = foam.build_optimizer(name, fresh_model)
    step_with(fresh, fresh_model, grads, to_param_dtype=True)
    assert dtypes(after, model) == dtypes(fresh, fresh_model)


def test_an_explicit_state_dtype_survives_the_change():
    """float32 states asked for with ``state_dtype`` stay float32 for bf16 parameters."""
    model = tiny_llama(torch.float32)
    before = foam.build_optimizer("foam", model, state_dtype="float32")
    step_with(before, model, random_grads(model, 1))
    model.to(torch.bfloat16)
    after = foam.build_optimizer("foam", model, state_dtype="float32")
    after.load_state_dict(before.state_dict())
    step_with(after, model, random_grads(model, 1), to_param_dtype=True)
    moments = [t for s in after.state.values() for k, t in s.items() if k.startswith("exp_avg")]
    assert moments and all(t.dtype == torch.float32 for t in moments)
