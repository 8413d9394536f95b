"""Data parallelism: DDP (replicate the model) or FSDP2 (shard parameters, gradients and states).

``trainer.parallelism=ddp`` wraps the model in ``DistributedDataParallel`` (several ranks only).
``trainer.parallelism=fsdp`` applies ``torch.distributed.fsdp.fully_shard`` to every decoder layer
and then the root on a 1-d device mesh, so a rank holds ``1/N`` of each parameter, its gradient and
its optimizer state, and all-gathers one layer's weights at a time. Each matrix is sharded along the
dim FOAM does not fold where FSDP2 can (``foam.sharding.shard_dim``: a dim > 0 only when the
ranks divide it), so FOAM folds every shard locally at any level; otherwise, and for the rest, by
rows. A method with its own layout rule (the 8-bit ones: shards of whole 256-entry blocks) whose
rule refuses that dim gets the other one where FSDP2 can shard it and the rule accepts it (the
tall MLP matrices by rows, e.g. LLaMA-7B's gate/up on 64 ranks: 172 rows x 4096 each); the
choice is ``foam.registry.shard_dims``, which the memory estimator shares. Precision:

* ``bf16`` (the paper's pure bf16): parameters are stored in bf16, gradients are reduced in bf16;
* ``bf16_mixed``: fp32 parameters, computed in bf16 and reduced in fp32 through FSDP2's
  ``MixedPrecisionPolicy`` (DDP uses ``torch.autocast`` instead, see ``uses_autocast``; how the
  two differ is documented with ``trainer.precision`` in ``train/schema.py``);
* ``fp32``: everything in fp32.

With one rank there is nothing to shard or replicate: the model trains unwrapped either way.

Under FSDP2 no rank holds the whole model on its device, and only rank 0 builds it at all: the
model is built on the meta device, sharded, then ``fill_from_rank0`` gives each rank its shards
of the weights rank 0 initialises (the ones a one-rank run starts from). For LLaMA-7B that saves
every other rank 27 GB of host memory and 13.5 GB on its GPU at start-up. Rank 0's build takes
minutes there, so the other ranks wait for it on the slow-I/O group (a gloo barrier with a
timeout sized for it), not in the broadcast that follows, which NCCL's 10-minute watchdog would
end. A resumed run's checkpoint holds every weight, so there no rank builds the whole model: the
shards are allocated for it (``models.allocate_for_loading``).

``trainer.compile`` (by default on a CUDA GPU only: ``compiles_layers``) compiles each decoder
layer in place (``nn.Module.compile``: parameter and checkpoint names stay the same), after
activation checkpointing and before ``fully_shard``, as torchtitan orders them (``apply_compile``
in its ``parallelize``): one block's graph is built once and reused by every layer, and FSDP2's
all-gathers stay outside it.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Shard

import foam
from foam.registry import shard_dims
from train.distributed import barrier_for_slow_io, wrap_ddp


def uses_autocast(parallelism: str, precision: str, world_size: int) -> bool:
    """bf16_mixed computes in bf16 under ``torch.autocast`` with DDP, and on one rank, where
    ``parallelize`` leaves the model unwrapped whatever the parallelism; FSDP2 casts on its own."""
    return precision == "bf16_mixed" and (parallelism == "ddp" or world_size == 1)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: the classes transformers lists in ``_no_split_modules``."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class to shard by")
    return layers


def compile_decoder_layers(model: nn.Module) -> None:
    """``trainer.compile``: ``torch.compile`` each decoder layer in place (names unchanged)."""
    for layer in decoder_layers(model):
        layer.compile()


def compiles_layers(setting: bool | None, device: torch.device) -> bool:
    """``trainer.compile`` resolved: null compiles on a CUDA GPU that inductor can build for, the
    only device where it pays (see the key's docstring in ``train/schema.py``)."""
    if setting is not None:
        return setting
    return device.type == "cuda" and inductor_builds_for(device)


def inductor_builds_for(device: torch.device) -> bool:
    """Inductor's GPU kernels are Triton's, which need Triton installed and a GPU of compute
    capability 7.0 or newer: on an older card the default stays eager rather than fail at the
    first forward."""
    if importlib.util.find_spec("triton") is None:
        return False
    return torch.cuda.get_device_capability(device) >= (7, 0)


def shards_parameters(parallelism: str, world_size: int) -> bool:
    """Whether ``parallelize`` shards the model (FSDP2 over several ranks), so that it is built
    on the meta device and filled by ``fill_from_rank0``."""
    return parallelism == "fsdp" and world_size > 1


def parallelize(
    model: nn.Module,
    *,
    sharded: bool,
    precision: str,
    device: torch.device,
    world_size: int,
    optimizer: str = "foam",
    hparams: Mapping[str, Any] | None = None,
    compile_layers: bool = False,
) -> nn.Module:
    """The module that trains: ``model`` itself (one rank, or ``sharded`` in place by FSDP2 over
    ``world_size`` ranks), or its DDP wrapper. ``sharded`` and ``compile_layers`` are the run
    plan's (``train/plan.py``: ``shards_parameters``, ``compiles_layers``); ``optimizer`` and its
    ``hparams`` (the resolved ``optim`` config's) pick each matrix's sharded dim
    (``foam.registry.shard_dims``)."""
    if compile_layers:
        compile_decoder_layers(model)
    if not sharded:
        return model if world_size == 1 else wrap_ddp(model, device)
    mesh = init_device_mesh(device.type, (world_size,))
    policy = MixedPrecisionPolicy()
    if precision == "bf16_mixed":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    matrices = {id(p) for _, p in foam.split_params(model).matrices}
    dim_of = shard_dims(optimizer, hparams or {})

    def placement(p: nn.Parameter) -> Shard:
        return Shard(dim_of(tuple(p.shape), world_size) if id(p) in matrices else 0)

    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=policy, shard_placement_fn=placement)
    fully_shard(model, mesh=mesh, mp_policy=policy, shard_placement_fn=placement)
    return model


def fill_from_rank0(
    model: nn.Module, build_whole: Callable[[], nn.Module], device: torch.device, *, is_main: bool
) -> None:
    """Allocate ``model``, sharded by ``parallelize`` while on the meta device, on ``device`` and
    give every rank its shards of the model rank 0 builds in full with ``build_whole`` (the other
    ranks build nothing). Collective. The others wait for rank 0's build on the slow-I/O group
    (minutes for 7B); the broadcasts then wait only for the transfers. Buffers (the rotary
    frequencies, which no state dict holds) are broadcast whole, as FSDP2 keeps them unsharded."""
    whole = build_whole() if is_main else None
    barrier_for_slow_io()
    model.to_empty(device=device)
    set_model_state_dict(
        model,
        whole.state_dict() if whole is not None else {},
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            source = whole.get_buffer(name).to(device) if whole is not None else buffer
            dist.broadcast(source, src=0)
            buffer.copy_(source)


@contextlib.contextmanager
def no_gradient_sync(model: nn.Module) -> Iterator[None]:
    """Around every micro-batch of a step but the last. DDP accumulates the gradients locally
    (``no_sync``) and all-reduces once per step: its gradients are whole on every rank anyway.
    FSDP2 still reduce-scatters every micro-batch and accumulates into the sharded gradient:
    skipping the sync (``set_requires_gradient_sync(False)``) would keep every layer's unsharded
    gradient (fp32 under ``bf16_mixed``) until the last micro-batch, about 13.5-27 GB per GPU
    for LLaMA-7B, undoing the sharding of gradients for one collective per step instead of one
    per micro-batch. The sum is the same: each micro-batch's loss is already scaled for the
    ranks' average (``train/step.py``). Nothing to do with one rank."""
    if hasattr(model, "no_sync"):  # DDP (and stand-ins for it)
        with model.no_sync():
            yield
    else:
        yield
