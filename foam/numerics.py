"""Numerics every optimizer of the library shares: state dtypes, the wide compute dtype, EMAs."""

from __future__ import annotations

import torch

from foam.errors import OptionError


def resolve_dtype(value: torch.dtype | str | None, fallback: torch.dtype) -> torch.dtype:
    """``None`` -> ``fallback``; ``"float32"``/``"bfloat16"``/... (config files) -> the torch dtype."""
    if value is None:
        return fallback
    dtype = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise OptionError(
            "state_dtype", f"state_dtype must be a floating torch dtype or its name, got {value!r}"
        )
    return dtype


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or the parameter's dtype when it is wider (float64 parameters stay float64)."""
    return torch.promote_types(dtype, torch.float32)


def ema_(state: torch.Tensor, value: torch.Tensor, beta: float, *, square: bool) -> torch.Tensor:
    """Update an EMA state in place in wide arithmetic; return the wide updated value.

    ``square=True`` accumulates ``value**2``. The lerp / mul-addcmul forms are the ones
    ``torch.optim.AdamW`` uses, so level 0 reproduces it to rounding.
    """
    wide = state.to(value.dtype)
    if square:
        wide.mul_(beta).addcmul_(value, value, value=1 - beta)
    else:
        wide.lerp_(value, 1 - beta)
    if wide is not state:
        state.copy_(wide)
    return wide
