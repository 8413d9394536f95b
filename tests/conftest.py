"""The suite's order: its longest file first.

``make test`` shares the test files between two processes (pytest-xdist, ``--dist loadfile``),
handing each the next file in collection order as it frees up. ``test_train_cli.py`` (a trainer
subprocess per test, about half of one process's share) came late in that order, so it ran
alone at the end while the other process sat idle; first, it runs beside all the other files.
"""

from __future__ import annotations

import pytest

LONGEST_FIRST = ("test_train_cli.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the rest keep theirs
