"""``OptionError``: the one error an optimizer of the library raises for a keyword value it refuses."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


class OptionError(ValueError):
    """A keyword argument (``key``) whose value an optimizer refuses.

    The key travels with the error, so a caller that knows where the value came from (the
    trainer: ``optim.<key>``) can point at it without reading the message.
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def require_choice(key: str, value: Any, choices: Collection[Any]) -> None:
    """Refuse a ``value`` of ``key`` that is not one of ``choices``."""
    if value not in choices:
        raise OptionError(key, f"{key} must be one of {tuple(choices)}, got {value!r}")
