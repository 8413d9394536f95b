"""Deterministic fault injection: the tests (and a user rehearsing a cluster's failures) name one
fault in the environment, and the trainer's few injection points act on it.

``FOAM_FAULT=<point>@<rank>:<action>``, for example::

    FOAM_FAULT=step:12@1:sigkill            # rank 1 kills itself as optimizer step 12 begins
    FOAM_FAULT=save:after_shards@0:io_error # rank 0's save fails after the shards are written
    FOAM_FAULT=step:5@*:spike:1000          # step 5's loss (and gradients) x1000 on every rank
    FOAM_FAULT=save:before_publish@1:stop   # rank 1 freezes (SIGSTOP) before the publish

Points: ``step:K`` (as optimizer step K begins, K counted from 1), ``save:after_shards`` (every
rank has written its shards, before the barrier that precedes publishing), ``save:before_publish``
(rank 0 is about to write ``meta.json`` and rename), ``eval`` (as an evaluation begins). A save
point may carry a step (``save:after_shards:20``) to fire at that step's save only.

Actions that end or hold the process (``exit`` (status 1, no clean-up), ``sigkill``, ``stop``
(SIGSTOP itself), ``sleep:S``) and ``io_error`` (an ``OSError`` with ``EIO``, as a full or failing
disk raises) are carried out by :func:`hit`; ``nan`` and ``spike:X`` change a step's loss and are
read by the step through :func:`loss_scale`.

A fault fires only in the first attempt of a torchrun job (``TORCHELASTIC_RESTART_COUNT`` unset
or 0), so a restarted job runs clean and the test sees the recovery; separate launches read the
variable afresh. Unset, every call is one cached ``None`` test.
"""

from __future__ import annotations

import errno
import functools
import os
import signal
import time
from dataclasses import dataclass

from train.errors import ConfigError

ENV = "FOAM_FAULT"

POINTS = ("step", "save:after_shards", "save:before_publish", "eval")
PROCESS_ACTIONS = ("exit", "sigkill", "stop", "sleep", "io_error")
LOSS_ACTIONS = ("nan", "spike")
ACTIONS = PROCESS_ACTIONS + LOSS_ACTIONS


class FaultSpecError(ValueError):
    """``FOAM_FAULT`` does not parse; the message is the one line to show."""


@dataclass(frozen=True)
class Fault:
    point: str
    """One of :data:`POINTS`."""
    step: int | None
    """The step it fires at (required for ``step``; ``None`` elsewhere means every occurrence)."""
    rank: int | None
    """The rank it fires on; ``None`` (``*``) for every rank."""
    action: str
    """One of :data:`ACTIONS`."""
    arg: float | None = None
    """``sleep``'s seconds, ``spike``'s factor."""

    def matches(self, point: str, step: int | None, rank: int) -> bool:
        return (
            self.point == point
            and (self.step is None or self.step == step)
            and (self.rank is None or self.rank == rank)
        )


def parse(spec: str) -> Fault:
    """The fault ``spec`` names, or :class:`FaultSpecError` saying what is wrong with it."""
    where, at, rest = spec.partition("@")
    rank_text, colon, action_text = rest.partition(":")
    if not at or not colon:
        raise FaultSpecError(f"{ENV}={spec!r}: expected <point>@<rank>:<action>")
    point, step = _parse_point(spec, where)
    action, _, arg_text = action_text.partition(":")
    if action not in ACTIONS:
        raise FaultSpecError(
            f"{ENV}={spec!r}: action {action!r} is not one of {', '.join(ACTIONS)}"
        )
    if point == "step" and step is None:
        raise FaultSpecError(f"{ENV}={spec!r}: the step point needs its step (step:K)")
    if action in LOSS_ACTIONS and point != "step":
        raise FaultSpecError(f"{ENV}={spec!r}: {action} changes a step's loss; use step:K")
    arg = None
    if action in ("sleep", "spike"):
        try:
            arg = float(arg_text)
        except ValueError:
            raise FaultSpecError(f"{ENV}={spec!r}: {action} needs a number ({action}:X)") from None
    try:
        rank = None if rank_text == "*" else int(rank_text)
    except ValueError:
        raise FaultSpecError(f"{ENV}={spec!r}: rank {rank_text!r} is not a number or *") from None
    return Fault(point, step, rank, action, arg)


def _parse_point(spec: str, where: str) -> tuple[str, int | None]:
    for point in POINTS:
        if where == point:
            return point, None
        if where.startswith(point + ":"):
            try:
                return point, int(where[len(point) + 1 :])
            except ValueError:
                break
    raise FaultSpecError(f"{ENV}={spec!r}: point {where!r} is not one of {', '.join(POINTS)}[:K]")


@functools.cache
def planned() -> Fault | None:
    """The fault this process was launched with (parsed once), or ``None``."""
    spec = os.environ.get(ENV)
    if not spec or int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0:
        return None
    return parse(spec)


def check_spec() -> None:
    """Raise ``ConfigError`` with :class:`FaultSpecError`'s line if ``FOAM_FAULT`` does not parse:
    the trainer calls it before any step, so a typo is refused, not met mid-run as a traceback."""
    try:
        planned()
    except FaultSpecError as err:
        raise ConfigError(str(err)) from None


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def hit(point: str, *, step: int | None = None, path: str | os.PathLike | None = None) -> None:
    """Carry out the planned process fault if it is at ``point`` (and ``step``) on this rank.

    ``path`` is what an ``io_error`` names (the file a failing write would have been writing).
    """
    fault = planned()
    if fault is None or fault.action in LOSS_ACTIONS or not fault.matches(point, step, _rank()):
        return
    if fault.action == "exit":
        os._exit(1)
    if fault.action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if fault.action == "sleep":
        time.sleep(fault.arg or 0.0)
    if fault.action == "io_error":
        raise OSError(errno.EIO, f"injected I/O error ({ENV})", None if path is None else str(path))


def loss_scale(step: int) -> float | None:
    """What step ``step``'s loss is multiplied by on this rank (NaN for ``nan``), or ``None``."""
    fault = planned()
    if (
        fault is None
        or fault.action not in LOSS_ACTIONS
        or not fault.matches("step", step, _rank())
    ):
        return None
    return float("nan") if fault.action == "nan" else fault.arg
