"""The CPU study's slots: a fixed number of runs at a time, each freed slot going to the waiting
run with the smallest priority (``repro.cpu_study.study.run_priority``), where a semaphore would
serve them in the order they asked."""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


class PrioritySlots:
    """``jobs`` slots, each freed one handed to the waiting run with the smallest priority (the
    earliest to ask among equals), where a semaphore serves them in the order they asked.

    A run may name a ``lane`` with a limit (``lane_limits``): while a run of another lane waits,
    that lane holds no more slots than its limit, so long runs cannot take every slot from
    short ones for hours; when only its own runs wait, it takes any free slot (none idles).

    A freed slot may wait ``handover_s`` before it is handed out: the runs a finished run leads
    to (a walk's next points, the seeds at its end) are asked for only after it ends, and without
    the wait a run already waiting would take the slot before them, whatever their priority."""

    def __init__(
        self, jobs: int, lane_limits: Mapping[str, int] | None = None, handover_s: float = 0.0
    ) -> None:
        self._free = jobs
        self._limits = dict(lane_limits or {})
        self._handover_s = handover_s
        self._handing_over_until = 0.0  # time.monotonic() before which no freed slot is handed out
        self._held: Counter[str] = Counter()
        self._paused = False
        self._waiting: list[tuple[tuple[int, ...], int, str]] = []
        self._arrivals = itertools.count()
        self._changed = threading.Condition()

    @property
    def waiting(self) -> int:
        with self._changed:
            return len(self._waiting)

    def _next(self) -> tuple[tuple[int, ...], int, str]:
        """The waiting ticket a free slot goes to: the first by priority of the lanes under their
        limit, or of all when none is."""
        under = [t for t in self._waiting if self._held[t[2]] < self._limits.get(t[2], math.inf)]
        return min(under or self._waiting)

    @contextmanager
    def hold(self, priority: tuple[int, ...], lane: str = "") -> Iterator[None]:
        with self._changed:
            ticket = (priority, next(self._arrivals), lane)
            self._waiting.append(ticket)
            self._changed.wait_for(
                lambda: (
                    not self._paused
                    and self._free > 0
                    and time.monotonic() >= self._handing_over_until
                    and self._next() == ticket
                )
            )
            self._waiting.remove(ticket)
            self._free -= 1
            self._held[lane] += 1
            self._changed.notify_all()  # a slot may still be free for the next in line
        try:
            yield
        finally:
            with self._changed:
                self._free += 1
                self._held[lane] -= 1
                if self._handover_s > 0:
                    self._handing_over_until = time.monotonic() + self._handover_s
                    # wakes the waiting runs once the wait is over (a little after, so that
                    # the clock has passed it when they look)
                    wake = threading.Timer(self._handover_s + 0.01, self._wake)
                    wake.daemon = True
                    wake.start()
                self._changed.notify_all()

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No slot is handed out inside: the runs asking meanwhile queue, to start by priority."""
        with self._changed:
            self._paused = True
        try:
            yield
        finally:
            with self._changed:
                self._paused = False
                self._changed.notify_all()
