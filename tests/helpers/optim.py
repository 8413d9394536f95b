"""Shared helpers of the optimizer tests: a tiny LLaMA, seeded random params and gradients, and a
loop that feeds the same gradients to one or more optimizers.

Not a test module (pytest collects ``test_*.py`` only): the test files import it as
``tests.helpers.optim``.

Every draw comes from its own ``torch.Generator`` seeded here, so a test's numbers do not depend
on which tests ran before it; only ``tiny_llama`` touches torch's global RNG (as model init does).
"""

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import foam

TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=172,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=256,
)
"""The tiny LLaMA's config: 2 layers, hidden 64, MLP 172 (not a power of two), vocab 256."""


def tiny_llama(
    dtype: torch.dtype = torch.float32, seed: int | None = 0, **config_overrides
) -> LlamaForCausalLM:
    """A 2-layer LLaMA of ``TINY_LLAMA`` (updated by ``config_overrides``), cast to ``dtype``.

    ``seed`` seeds torch's global RNG before the weights are initialised, so two calls give the
    same weights; ``seed=None`` leaves the global RNG as it is (for fixtures whose values do not
    matter, and for models built on the meta device).
    """
    if seed is not None:
        torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, **config_overrides})).to(dtype)


def build(name: str, model: nn.Module, **hparams) -> torch.optim.Optimizer:
    """``foam.build_optimizer(name, model)`` with the tiny LLaMA's head layout where the method
    takes one (Adam-mini; the trainer passes the model's config the same way)."""
    model_keywords = {
        "dim": TINY_LLAMA["hidden_size"],
        "n_heads": TINY_LLAMA["num_attention_heads"],
    }
    accepted = foam.available_optimizers()[name]
    extra = {k: v for k, v in model_keywords.items() if k in accepted}
    return foam.build_optimizer(name, model, **extra, **hparams)


def _entries(like):
    """A model's parameters, or the given tensors/shapes, as a list."""
    if isinstance(like, nn.Module):
        return list(like.parameters())
    return list(like)


def random_grads(
    params_or_model: nn.Module | Sequence[torch.Tensor | Sequence[int]],
    n_steps: int,
    *,
    dtype: torch.dtype | None = None,
    seed: int = 1,
    scale: Mapping[int, float] | None = None,
) -> list[list[torch.Tensor]]:
    """``n_steps`` lists of standard-normal gradients, one per tensor, from one seeded generator.

    ``params_or_model``: a model (its ``parameters()``), or a sequence of tensors and/or shapes.
    Draws go step by step, tensor by tensor, in that order.

    ``dtype``: how values are drawn, which changes the numbers, not just their precision:

    * ``None``: drawn in torch's default dtype (float32), then cast to each tensor's dtype
      (shapes stay float32);
    * a dtype: drawn directly in it (float64 draws are not float32 draws cast up).

    ``scale``: optional ``{step index (from 0): factor}``; every gradient of a listed step is
    multiplied by its factor (gradient spikes), the other steps by 1.0.
    """
    entries = _entries(params_or_model)
    gen = torch.Generator().manual_seed(seed)
    steps = []
    for t in range(n_steps):
        step = []
        for entry in entries:
            shape = entry.shape if isinstance(entry, torch.Tensor) else tuple(entry)
            if dtype is not None:
                g = torch.randn(shape, generator=gen, dtype=dtype)
            else:
                g = torch.randn(shape, generator=gen)
                if isinstance(entry, torch.Tensor):
                    g = g.to(entry.dtype)
            if scale is not None:
                g = scale.get(t, 1.0) * g
            step.append(g)
        steps.append(step)
    return steps


def random_params(
    shapes: Sequence[Sequence[int]], *, dtype: torch.dtype = torch.float32, seed: int = 0
) -> list[torch.Tensor]:
    """Standard-normal leaf tensors (``requires_grad``) of ``shapes``, drawn directly in ``dtype``
    from a generator seeded with ``seed``: the same draws as ``random_grads(shapes, 1, ...)``."""
    (values,) = random_grads(shapes, 1, dtype=dtype, seed=seed)
    return [v.requires_grad_() for v in values]


def step_with(
    optimizers,
    params_or_model: nn.Module | Sequence[torch.Tensor],
    grads: Iterable[Sequence[torch.Tensor]],
    *,
    to_param_dtype: bool = False,
) -> None:
    """For each step of ``grads``: set every ``p.grad`` to a clone of its gradient, then call
    ``step()`` on each optimizer, in order (one optimizer, or a list/tuple of them that share the
    params, e.g. a reference Muon for the matrices and an AdamW for the rest).

    ``to_param_dtype``: cast each clone to its parameter's dtype (float32 gradients for bf16
    params); by default the dtypes must already match, as torch requires of ``.grad``.
    """
    if not isinstance(optimizers, list | tuple):
        optimizers = [optimizers]
    params = _entries(params_or_model)
    for step_grads in grads:
        for p, g in zip(params, step_grads, strict=True):
            g = g.clone()
            p.grad = g.to(p.dtype) if to_param_dtype else g
        for opt in optimizers:
            opt.step()


class SpecFold:
    """FOAM_SPEC section 1's fold A and unfold E written out as dense matrices, independently of
    ``foam.folding``, so that the reference optimizers of the tests can catch a folding bug.

    The 2-d view is ``(shape[0], prod(rest))``; the fold axis is the larger dim (ties: the last)
    or always the last; a block is ``2**level`` consecutive entries (``"mini"``: the whole axis).
    ``averaging`` (nb x n) has ``1 / size`` on each block's entries, where ``size`` counts only
    the real entries of a shorter last block; ``repeat`` (n x nb) has a 1 where entry i lies in
    block j. A(X) multiplies the fold axis by ``averaging``, E(Y) by ``repeat``.
    """

    def __init__(self, shape: Sequence[int], level: int | str, fold_axis: str = "larger"):
        rows, cols = shape[0], 1
        for d in shape[1:]:
            cols *= d
        self.shape = (rows, cols)
        self.axis = 1 if fold_axis == "last" or cols >= rows else 0
        n = self.shape[self.axis]
        block = n if level == "mini" else 2**level
        n_blocks = -(-n // block)
        self.repeat = torch.zeros(n, n_blocks, dtype=torch.float64)
        for i in range(n):
            self.repeat[i, i // block] = 1.0
        self.averaging = (self.repeat / self.repeat.sum(dim=0)).T  # 1 / (real entries of block)

    @property
    def folded_shape(self) -> tuple[int, int]:
        rows, cols = self.shape
        n_blocks = self.repeat.shape[1]
        return (rows, n_blocks) if self.axis == 1 else (n_blocks, cols)

    def A(self, x: torch.Tensor) -> torch.Tensor:
        x = x.double()
        return x @ self.averaging.T if self.axis == 1 else self.averaging @ x

    def E(self, y: torch.Tensor) -> torch.Tensor:
        y = y.double()
        return y @ self.repeat.T if self.axis == 1 else self.repeat @ y
