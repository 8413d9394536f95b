"""The CPU study's slots (repro/cpu_study/scheduler.py): a freed slot goes to the run with the
smallest priority, never idles while a run waits, and a lane at its limit leaves room."""

import contextlib
import threading
import time

import pytest

from repro.cpu_study.scheduler import PrioritySlots
from repro.cpu_study.study import run_priority


@pytest.mark.parametrize("start", ["cores busy", "paused at the start"])
def test_freed_slots_go_to_the_runs_later_runs_wait_on(start):
    """A search run asking last starts before the seeds that asked first."""
    slots = PrioritySlots(2)
    started: list[tuple[str, int]] = []
    asked = [("final", 2), ("final", 1), ("final", 0), ("search", 0)]

    def run(stage: str, seed: int) -> None:
        with slots.hold(run_priority(stage, seed)):
            started.append((stage, seed))

    with contextlib.ExitStack() as stack:
        if start == "paused at the start":
            stack.enter_context(slots.paused())
        else:
            stack.enter_context(slots.hold((0, 0)))
            stack.enter_context(slots.hold((0, 0)))
        threads = []
        for stage, seed in asked:
            threads.append(threading.Thread(target=run, args=(stage, seed)))
            threads[-1].start()
            while slots.waiting + len(started) < len(threads):  # each asks before the next
                time.sleep(0.001)
    for thread in threads:
        thread.join(timeout=10)
    assert started == [("search", 0), ("final", 0), ("final", 1), ("final", 2)]


def test_every_slot_is_used_when_runs_wait():
    slots = PrioritySlots(2)
    inside, most = 0, 0
    guard = threading.Lock()

    def run() -> None:
        nonlocal inside, most
        with slots.hold((1, 1)):
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.02)
            with guard:
                inside -= 1

    threads = [threading.Thread(target=run) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert most == 2 and slots.waiting == 0


def test_a_freed_slot_waits_for_the_runs_its_run_leads_to():
    """A walk's seeds are asked for only after its last run ends: with a handover wait they
    take its slot before a run of lower priority that has waited for hours; without it, not."""

    def order(handover_s: float) -> list[str]:
        slots = PrioritySlots(1, handover_s=handover_s)
        started: list[str] = []

        def run(name: str, priority: tuple[int, ...]) -> None:
            with slots.hold(priority):
                started.append(name)

        def walk() -> None:
            with slots.hold((0,)):
                while slots.waiting < 1:  # the next row's run waits
                    time.sleep(0.001)
            time.sleep(0.05)  # the walk reads its summaries
            run("seed", (1,))  # what the walk's end leads to, asked for after its slot is free

        threads = [threading.Thread(target=walk), threading.Thread(target=run, args=("next", (2,)))]
        for thread in threads:
            thread.start()
            time.sleep(0.01)
        for thread in threads:
            thread.join(timeout=10)
        return started

    assert order(handover_s=0.5) == ["seed", "next"]
    assert order(handover_s=0.0) == ["next", "seed"]


def test_a_lane_at_its_limit_leaves_a_slot_to_the_other_lane_but_never_an_idle_one():
    """v4's 10,000-step runs hold one slot of two while a 1,000-step run waits, whatever their
    priority; with none waiting they take both."""
    slots = PrioritySlots(2, lane_limits={"long": 1})
    started: list[str] = []
    release = {name: threading.Event() for name in ("long0", "long1", "long2", "short0")}

    def run(name: str, lane: str, priority: tuple[int, ...]) -> None:
        with slots.hold(priority, lane=lane):
            started.append(name)
            release[name].wait(timeout=10)

    with slots.paused():
        threads = [
            threading.Thread(target=run, args=args)
            for args in (("long0", "long", (0,)), ("long1", "long", (0,)), ("short0", "", (1,)))
        ]
        for thread in threads:
            thread.start()
        while slots.waiting < 3:
            time.sleep(0.001)
    while len(started) < 2:
        time.sleep(0.001)
    assert sorted(started) == ["long0", "short0"]  # long1 is first by priority, yet waits
    release["short0"].set()
    while len(started) < 3:  # nothing else waits: the long lane takes the freed slot
        time.sleep(0.001)
    assert started[-1] == "long1"
    threads.append(threading.Thread(target=run, args=("long2", "long", (0,))))
    threads[-1].start()
    while slots.waiting < 1:
        time.sleep(0.001)
    release["long0"].set()
    while len(started) < 4:
        time.sleep(0.001)
    assert started[-1] == "long2"
    for name in ("long1", "long2"):
        release[name].set()
    for thread in threads:
        thread.join(timeout=10)
