"""The warmup-cosine schedule: non-zero first step, peak at the end of warmup, min lr at the end."""

import itertools
import math

import pytest
import torch

from foam.errors import OptionError
from foam.schedule import check_schedule
from train.schedule import build_scheduler, lr_multiplier, warmup_steps


def lrs_of_run(max_steps: int, warmup_ratio: float = 0.1, min_lr_ratio: float = 0.1) -> list[float]:
    """The lr each of the run's optimizer steps actually uses."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = build_scheduler(
        opt, max_steps=max_steps, warmup_ratio=warmup_ratio, min_lr_ratio=min_lr_ratio
    )
    used = []
    for _ in range(max_steps):
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return used


def test_first_step_is_not_zero_and_warmup_is_linear():
    lrs = lrs_of_run(100)
    assert lrs[0] == pytest.approx(0.1)  # 1 / 10 warmup steps
    assert lrs[:10] == pytest.approx([(k + 1) / 10 for k in range(10)])


def test_peak_then_cosine_to_min_at_the_last_step():
    lrs = lrs_of_run(100)
    assert max(lrs) == pytest.approx(1.0) and lrs[9] == pytest.approx(1.0)
    assert lrs[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert min(lrs) == pytest.approx(0.1)


def test_min_lr_ratio_and_midpoint():
    assert lrs_of_run(21, warmup_ratio=0.0, min_lr_ratio=0.0)[-1] == pytest.approx(0.0, abs=1e-12)
    mid = lr_multiplier(55, max_steps=100, warmup=10, min_lr_ratio=0.1)
    assert mid == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 46 / 90)))


@pytest.mark.parametrize(
    ("max_steps", "warmup"), [(1, 0), (2, 0), (7, 1), (10, 1), (15, 2), (10_000, 1000)]
)
def test_warmup_is_a_tenth_rounded_and_every_step_moves(max_steps, warmup):
    assert warmup_steps(max_steps, 0.1) == warmup
    lrs = lrs_of_run(max_steps)
    assert all(lr > 0 for lr in lrs)
    if warmup:
        assert lrs[warmup - 1] == pytest.approx(1.0) and lrs[0] == pytest.approx(1 / warmup)
    assert lrs[-1] == pytest.approx(0.1)  # min_lr_ratio, also when there is no room to warm up


def test_warmup_never_takes_the_whole_run():
    assert warmup_steps(3, 1.0) == 2 and warmup_steps(5, 0.0) == 0


def test_scheduler_state_dict_is_plain_numbers():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = build_scheduler(opt, max_steps=10, warmup_ratio=0.1, min_lr_ratio=0.1)
    assert sched.state_dict()["lr_lambdas"] == [None]


def test_multiplier_stays_at_the_floor_after_the_last_step():
    """The scheduler is stepped once more after the last update; the lr it leaves in the
    optimizer (and in the final checkpoint) is the floor, not a cosine coming back up."""
    for step in (100, 101, 150):
        assert lr_multiplier(step, max_steps=100, warmup=10, min_lr_ratio=0.1) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("max_steps", "warmup_ratio", "min_lr_ratio", "key"),
    [
        (0, 0.1, 0.1, "max_steps"),
        (10.0, 0.1, 0.1, "max_steps"),  # a step count, not a float
        (True, 0.1, 0.1, "max_steps"),
        (10, 1.0, 0.1, "warmup_ratio"),  # the whole run warming up: no decay at all
        (10, -0.1, 0.1, "warmup_ratio"),
        (10, math.nan, 0.1, "warmup_ratio"),
        (10, 0.1, 1.5, "min_lr_ratio"),  # a "floor" above the peak
        (10, 0.1, -0.1, "min_lr_ratio"),  # a negative lr at the end
    ],
)
def test_a_schedule_outside_its_rules_is_refused_naming_the_key(
    max_steps, warmup_ratio, min_lr_ratio, key
):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(OptionError, match=f"^{key} must") as err:
        build_scheduler(
            optimizer, max_steps=max_steps, warmup_ratio=warmup_ratio, min_lr_ratio=min_lr_ratio
        )
    assert err.value.key == key
    check_schedule(10, 0.0, 1.0)  # the edges the rules allow: no warmup, a constant lr
