"""Whole-matrix owners: the sharded (FSDP2) step of a method whose update needs a whole matrix
(Newton-Schulz, an SVD) does that work once, on one rank per matrix, not on every rank.

Each sharded matrix gets an owner rank. ``Owners.gather`` sends every rank's piece of each matrix
to its owner (one ``all_to_all`` for the whole step, whatever the shapes), which concatenates the
pieces into the whole matrix; the owner computes; ``Owners.scatter`` sends each rank its piece of
each result (one ``all_to_all`` back). Per rank and direction that moves ``(W-1)/W`` of its share
of the matrices, so both together cost about ``2/W`` of the gradients' reduce-scatter.

* Owners are assigned by cost (``m * n * min(m, n)``, Newton-Schulz's and an SVD's flops), the
  largest matrix first to the least-loaded rank: matrices of one shape go round-robin, and a step
  with more matrices than ranks spreads them evenly. Every rank computes the same assignment from
  the global shapes, so nothing about it is communicated.
* Pieces travel with their exact sizes (``all_to_all_single``'s split sizes): a rank whose shard
  is empty (dim 0 splits as ``torch.chunk`` does, so the last ranks may hold no row) sends and
  receives nothing for that matrix but still joins the collective, so no rank waits for it.
* A layout is cut as FSDP2 cuts it (``torch.chunk`` pieces along the sharded dim, by dim 0 or a
  dim > 0), or whole on every rank (``dim=None``: a result every rank needs, such as a basis that
  lies along the unsharded side).

Nothing here is persistent: a method keeps its state in the parameter's own placement (so a DCP
checkpoint reshards it N -> M), and only the step's transient whole matrices live on the owner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard


@dataclass(frozen=True)
class Layout:
    """How a global 2-d tensor of ``shape`` lies on ``ranks`` ranks: ``torch.chunk`` pieces along
    ``dim`` (FSDP2's ``Shard(dim)``), or the whole of it on every rank (``dim=None``)."""

    shape: tuple[int, int]
    dim: int | None
    ranks: int

    def piece_shape(self, rank: int) -> tuple[int, int]:
        if self.dim is None:
            return self.shape
        n = self.shape[self.dim]
        chunk = math.ceil(n / self.ranks)
        size = max(0, min(chunk, n - rank * chunk))
        return (size, self.shape[1]) if self.dim == 0 else (self.shape[0], size)

    def piece_numel(self, rank: int) -> int:
        return math.prod(self.piece_shape(rank))

    def cut(self, whole: torch.Tensor, rank: int) -> torch.Tensor:
        """``rank``'s piece of ``whole`` (a view)."""
        if self.dim is None:
            return whole
        n = self.shape[self.dim]
        start = min(rank * math.ceil(n / self.ranks), n)  # past the end: an empty piece
        return whole.narrow(self.dim, start, self.piece_shape(rank)[self.dim])

    @property
    def cost(self) -> int:
        """Flops of the whole-matrix work, up to a constant (Newton-Schulz, an SVD)."""
        rows, cols = self.shape
        return rows * cols * min(rows, cols)


def layout_of(p: torch.Tensor) -> Layout | None:
    """The layout of a 2-d DTensor (on a mesh of one rank too, whose states are DTensors as
    well, so that DCP reshards a one-rank checkpoint); ``None`` for a plain tensor, whose
    whole-matrix work is local."""
    if not isinstance(p, DTensor):
        return None
    if p.device_mesh.ndim != 1 or p.dim() != 2:
        raise ValueError(
            f"whole-matrix owners take 2-d parameters on a 1-d mesh, got a {p.dim()}-d one on a "
            f"{p.device_mesh.ndim}-d mesh"
        )
    placement = p.placements[0]
    dim = placement.dim if isinstance(placement, Shard) else None
    return Layout((p.shape[0], p.shape[1]), dim, p.device_mesh.size())


def assign_owners(layouts: Sequence[Layout], ranks: int) -> list[int]:
    """An owner rank per layout: the costliest first, each to the least-loaded rank (the lowest
    on a tie), so equal shapes go round-robin; the same on every rank."""
    load = [0] * ranks
    owners = [0] * len(layouts)
    for i in sorted(range(len(layouts)), key=lambda i: (-layouts[i].cost, i)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owners[i] = rank
        load[rank] += layouts[i].cost
    return owners


class Owners:
    """The owners of the matrices whose layouts are ``layouts`` (the same list, in the same order,
    on every rank of ``group``) and the two exchanges between their pieces and the owners."""

    def __init__(self, layouts: Sequence[Layout], group: dist.ProcessGroup) -> None:
        self.layouts = list(layouts)
        self.group = group
        self.rank = dist.get_rank(group)
        self.ranks = dist.get_world_size(group)
        self.owner = assign_owners(self.layouts, self.ranks)
        self.mine = [i for i, owner in enumerate(self.owner) if owner == self.rank]
        """Indices of the matrices this rank owns, in order."""

    def gather(self, pieces: Sequence[torch.Tensor], dtype: torch.dtype) -> dict[int, torch.Tensor]:
        """The whole matrices this rank owns, by index, from every rank's ``pieces`` (this rank's
        piece of each matrix, shaped as its layout says), sent as ``dtype``."""
        send = [[] for _ in range(self.ranks)]
        for i, piece in enumerate(pieces):
            send[self.owner[i]].append(piece.reshape(-1).to(dtype))
        sizes_from = [
            sum(self.layouts[i].piece_numel(src) for i in self.mine) for src in range(self.ranks)
        ]
        received = self._exchange(send, sizes_from, dtype, pieces[0].device)
        wholes: dict[int, torch.Tensor] = {}
        parts: dict[int, list[torch.Tensor]] = {i: [] for i in self.mine}
        for src, flat in enumerate(received):
            offset = 0
            for i in self.mine:
                shape = self.layouts[i].piece_shape(src)
                parts[i].append(flat[offset : offset + math.prod(shape)].view(shape))
                offset += math.prod(shape)
        for i in self.mine:
            layout = self.layouts[i]
            wholes[i] = parts[i][0] if layout.dim is None else torch.cat(parts[i], dim=layout.dim)
        return wholes

    def scatter(
        self,
        wholes: dict[int, torch.Tensor],
        layouts: Sequence[Layout],
        dtype: torch.dtype,
        device: torch.device,
    ) -> list[torch.Tensor]:
        """This rank's piece (per ``layouts``, one per matrix) of every owner's result ``wholes``
        (the results this rank owns, by index), sent as ``dtype``."""
        send = [
            [layouts[i].cut(wholes[i], dst).reshape(-1).to(dtype) for i in self.mine]
            for dst in range(self.ranks)
        ]
        sizes_from = [
            sum(
                layouts[i].piece_numel(self.rank)
                for i in range(len(layouts))
                if self.owner[i] == src
            )
            for src in range(self.ranks)
        ]
        received = self._exchange(send, sizes_from, dtype, device)
        pieces: list[torch.Tensor | None] = [None] * len(layouts)
        for src, flat in enumerate(received):
            offset = 0
            for i in (i for i in range(len(layouts)) if self.owner[i] == src):
                shape = layouts[i].piece_shape(self.rank)
                pieces[i] = flat[offset : offset + math.prod(shape)].view(shape)
                offset += math.prod(shape)
        return pieces  # type: ignore[return-value]

    def _exchange(
        self,
        send: list[list[torch.Tensor]],
        sizes_from: list[int],
        dtype: torch.dtype,
        device: torch.device,
    ) -> list[torch.Tensor]:
        """One ``all_to_all_single``: ``send[dst]`` to each rank; returns what each rank sent
        here (``sizes_from[src]`` elements). Every rank calls it, whatever it has to send."""
        sizes_to = [sum(t.numel() for t in parts) for parts in send]
        flat = [t for parts in send for t in parts]
        inp = torch.cat(flat) if flat else torch.empty(0, dtype=dtype, device=device)
        if self.ranks == 1:
            return [inp]
        out = torch.empty(sum(sizes_from), dtype=dtype, device=device)
        dist.all_to_all_single(out, inp, sizes_from, sizes_to, group=self.group)
        return list(out.split(sizes_from))


def zeros_like_layout(
    p: DTensor, shape: tuple[int, ...], dim: int | None, dtype: torch.dtype
) -> DTensor:
    """A zero state of global ``shape`` on ``p``'s mesh: ``Shard(dim)`` in FSDP2's pieces, or
    replicated (``dim=None``), so DCP saves it with its global shape and reshards it."""
    layout = Layout((shape[0], shape[1]), dim, p.device_mesh.size())
    rank = p.device_mesh.get_local_rank()
    piece = torch.zeros(layout.piece_shape(rank), dtype=dtype, device=p.to_local().device)
    placement = Replicate() if dim is None else Shard(dim)
    return DTensor.from_local(
        piece,
        p.device_mesh,
        (placement,),
        run_check=False,
        shape=torch.Size(shape),
        stride=(shape[1], 1),
    )
