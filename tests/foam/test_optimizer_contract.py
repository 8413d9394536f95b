"""The contract every registered optimizer keeps, whoever wrote it (DESIGN.md).

Built by name from a model; a ``torch.optim.Optimizer`` that LR schedulers and closures drive;
pure-bf16 states; a state-dict round trip that continues bit for bit; a plan of its state that
needs no allocation; unknown keywords rejected with the accepted ones listed. Per-method
behaviour (agreement with the reference implementations) lives in each method's own test file.
"""

import copy

import pytest
import torch

import foam
from foam import planned_state_numel
from tests.helpers.optim import TINY_LLAMA, build, random_grads, step_with, tiny_llama

NAMES = sorted(foam.available_optimizers())
# Block-wise int8 states: uint8 codes and float32 scales (their own tests check dtypes).
QUANTISED = {"adamw8bit", "foam8bit", "galore8bit"}


@pytest.mark.parametrize("name", NAMES)
def test_unknown_keywords_raise_listing_the_accepted_ones(name):
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['no_such_option'\].*'lr'"):
        build(name, tiny_llama(), no_such_option=1)


@pytest.mark.parametrize("name", [n for n in NAMES if "alpha" in foam.available_optimizers()[n]])
def test_a_negative_alpha_is_refused_naming_it(name):
    """Every method's alpha scales the matrices' step or lr: below 0 it would train them uphill,
    so it is refused like a negative lr; 0 (frozen matrices) is a valid setting, as lr=0 is."""
    with pytest.raises(foam.OptionError, match=r"alpha must be >= 0 and finite, got -0.5") as err:
        build(name, tiny_llama(), alpha=-0.5)
    assert err.value.key == "alpha"
    build(name, tiny_llama(), alpha=0.0)


@pytest.mark.parametrize("name", NAMES)
def test_bf16_training_under_a_scheduler_and_a_closure(name):
    model = tiny_llama(torch.bfloat16)
    opt = build(name, model, lr=1e-2)
    assert isinstance(opt, torch.optim.Optimizer)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: [1.0, 0.0][min(step, 1)])
    tokens = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 8))

    def closure():
        opt.zero_grad()
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        return loss

    start = [p.detach().clone() for p in model.parameters()]
    assert torch.isfinite(opt.step(closure))
    sched.step()  # every group's lr factor is 0 from now on: the next step changes nothing
    assert all(g["lr"] == 0 for g in opt.param_groups)
    moved = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(start, moved, strict=True))
    opt.step(closure)
    assert all(torch.equal(a, b) for a, b in zip(moved, model.parameters(), strict=True))
    if name not in QUANTISED:
        floats = [
            v
            for s in opt.state.values()
            for k, v in s.items()
            if k != "step" and isinstance(v, torch.Tensor) and v.is_floating_point()
        ]
        assert floats and all(v.dtype == torch.bfloat16 for v in floats)


# bf16 parameters with states in their dtype, and with float32 states where a method offers them.
ROUND_TRIPS = [(n, None) for n in NAMES] + [
    (n, "float32") for n in NAMES if "state_dtype" in foam.available_optimizers()[n]
]


@pytest.mark.parametrize(("name", "state_dtype"), ROUND_TRIPS)
def test_state_dict_round_trip_continues_bit_for_bit(name, state_dtype):
    model = tiny_llama(torch.bfloat16)
    dtype = {} if state_dtype is None else {"state_dtype": state_dtype}
    opt = build(name, model, weight_decay=0.1, **dtype)
    grads = random_grads(model, 4)
    step_with(opt, model, grads[:3])
    saved = copy.deepcopy(opt.state_dict())
    clone = copy.deepcopy(model)
    restored = build(name, clone, weight_decay=0.1, **dtype)
    restored.load_state_dict(saved)
    for p, q in zip(model.parameters(), clone.parameters(), strict=True):
        assert opt.state[p].keys() == restored.state[q].keys()
        for key, value in opt.state[p].items():
            if isinstance(value, torch.Tensor):
                assert restored.state[q][key].dtype == value.dtype, key
    step_with(opt, model, grads[3:])
    step_with(restored, clone, grads[3:])
    for p, q in zip(model.parameters(), clone.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("name", NAMES)
def test_state_is_planned_on_a_meta_model_without_allocating(name):
    with torch.device("meta"):
        meta = tiny_llama(seed=None)
    planned = planned_state_numel(build(name, meta))
    assert planned > 0 and foam.state_bytes(build(name, meta)) == 0
    assert planned == planned_state_numel(build(name, tiny_llama()))
