"""Peak transient memory of a function, on any device, by watching every allocation it makes.

CUDA has allocator statistics; CPU has none that are exact. This tracker intercepts each aten
op below autograd, counts the storages its outputs newly allocate, and releases them when
the tensor dies, so the peak is deterministic and comparable across devices and runs.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class _AllocationTracker(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def _free(self, ptr: int) -> None:
        self.current -= self.live.pop(ptr, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        seen = {
            t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if _is_tensor(t)
        }
        for tensor in tree_leaves(out):
            if not _is_tensor(tensor):
                continue
            ptr = tensor.untyped_storage().data_ptr()
            if ptr in seen or ptr in self.live or ptr == 0:
                continue  # in place, a view, or nothing allocated
            self.live[ptr] = tensor.untyped_storage().nbytes()
            self.current += self.live[ptr]
            self.peak = max(self.peak, self.current)
            weakref.finalize(tensor, self._free, ptr)
        return out


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type != "meta"


def peak_transient_bytes(fn: Callable[[], Any]) -> tuple[int, int]:
    """Run ``fn``; return (peak bytes of memory it allocated at once, bytes still held after).

    The second number is what ``fn`` kept (new optimizer state on a first step); the first minus
    the second is the transient peak.
    """
    tracker = _AllocationTracker()
    with tracker:
        fn()
    return tracker.peak, tracker.current
