"""train/faults.py: the injection spec parses as documented, fires only where it names, and only in
a torchrun job's first attempt."""

from __future__ import annotations

import errno
import math

import pytest

from train import faults


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(faults.ENV, raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    faults.planned.cache_clear()
    yield
    faults.planned.cache_clear()


def plan(monkeypatch: pytest.MonkeyPatch, spec: str, **env: str) -> None:
    monkeypatch.setenv(faults.ENV, spec)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    faults.planned.cache_clear()


def test_parse_points_ranks_actions():
    assert faults.parse("step:12@1:sigkill") == faults.Fault("step", 12, 1, "sigkill")
    assert faults.parse("save:after_shards@0:io_error") == faults.Fault(
        "save:after_shards", None, 0, "io_error"
    )
    assert faults.parse("save:before_publish:20@*:sleep:2.5") == faults.Fault(
        "save:before_publish", 20, None, "sleep", 2.5
    )
    assert faults.parse("step:5@*:spike:1000") == faults.Fault("step", 5, None, "spike", 1000.0)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("step:3", "expected <point>@<rank>:<action>"),
        ("step@0:exit", "needs its step"),
        ("stepp:3@0:exit", "point 'stepp:3'"),
        ("step:3@0:explode", "action 'explode'"),
        ("eval@0:nan", "use step:K"),
        ("step:3@0:sleep:x", "sleep needs a number"),
        ("step:3@one:exit", "rank 'one'"),
    ],
)
def test_bad_specs_say_what_is_wrong_in_one_line(spec: str, says: str):
    with pytest.raises(faults.FaultSpecError, match=says) as error:
        faults.parse(spec)
    assert "\n" not in str(error.value)


def test_unset_does_nothing():
    assert faults.planned() is None
    faults.hit("step", step=1)
    assert faults.loss_scale(1) is None


def test_io_error_fires_at_its_point_and_rank_only(monkeypatch):
    plan(monkeypatch, "save:after_shards@1:io_error", RANK="1")
    faults.hit("save:before_publish")
    faults.hit("step", step=1)
    with pytest.raises(OSError) as error:
        faults.hit("save:after_shards", step=40, path="/ckpt/x")
    assert error.value.errno == errno.EIO and error.value.filename == "/ckpt/x"
    plan(monkeypatch, "save:after_shards@1:io_error", RANK="0")
    faults.hit("save:after_shards", step=40)


def test_step_faults_fire_at_their_step(monkeypatch):
    plan(monkeypatch, "step:4@*:spike:100", RANK="3")
    assert [faults.loss_scale(s) for s in (3, 4, 5)] == [None, 100.0, None]
    plan(monkeypatch, "step:2@0:nan", RANK="0")
    assert math.isnan(faults.loss_scale(2))
    faults.hit("step", step=2)  # a loss fault is not a process fault


def test_sleep_waits(monkeypatch):
    slept = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    plan(monkeypatch, "eval@*:sleep:7")
    faults.hit("eval")
    assert slept == [7.0]


def test_a_restarted_torchrun_attempt_runs_clean(monkeypatch):
    plan(monkeypatch, "step:2@0:io_error", TORCHELASTIC_RESTART_COUNT="1")
    assert faults.planned() is None
    faults.hit("step", step=2)
