"""The tolerance at which a fused FOAM step agrees with the eager one, in one place for every
test that compares them (the C++ and Triton kernels in tests/foam/test_fused.py, the Triton step
on a GPU in tests/test_gpu.py, the fused step on FSDP2 shards in tests/e2e/test_fsdp.py): the two
sum in different orders, so they agree to rounding, not bit for bit."""

from __future__ import annotations

import torch


def assert_agree(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """fp32: 1e-6 relative; bf16: one bf16 unit in the last place; both plus 1e-6 of the
    tensor's largest entry, for entries that cancel to almost nothing."""
    actual, expected = actual.float(), expected.float()
    scale = expected.abs().max().item()
    if dtype == torch.float32:
        bound = 1e-6 * expected.abs() + 1e-6 * scale
    else:
        magnitude = expected.abs().clamp_min(torch.finfo(torch.float32).tiny)
        bound = torch.exp2(torch.floor(torch.log2(magnitude)) - 7) + 2**-8 * scale
    excess = (actual - expected).abs() - bound
    assert excess.max() <= 0, f"off by {(actual - expected).abs().max().item():.3g}"
