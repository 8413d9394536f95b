"""The suite's order: its longest file first.

``make test`` shares the test files between two processes (pytest-xdist, ``--dist loadfile``),
handing each the next file in collection order as it frees up. A long file late in that order
runs alone at the end while the other process sits idle, so ``tests/e2e/test_train_cli.py`` (a
trainer subprocess per test, about half of one process's share) goes first, beside the rest.
"""

from __future__ import annotations

import pytest

LONGEST_FIRST = ("test_train_cli.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable: the rest keep theirs
