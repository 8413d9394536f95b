"""The masked-LM objective (DeBERTa): batches masked as transformers' ``DataCollatorForLanguageModeling``
masks them, scored on the masked positions only.

Causal LMs are scored on every next token (``train/step.py``); an encoder is scored on the 15 %
of tokens it must restore. Each eligible token (not padding, not EOS) is chosen with probability
``MLM_PROBABILITY``; of those, 80 % become the mask token, 10 % a random id and 10 % stay, with
the collator's draws in the collator's order, one generator per row. The masked batch carries
``MLM_LABELS`` (the original id at each chosen position, -100 elsewhere) instead of ``labels``,
and ``train/step.py`` scores a batch by which of the two it carries, so training and evaluation
need no other change.

Each row's generator is seeded from a base seed and the row's own tokens, so a row is masked
the same way whatever the batch, micro-batch size or world size it lands in. Validation uses one
fixed base seed: every evaluation of every run is scored on the same masked tokens, so runs
compare. Training draws a new base seed per batch from (run seed, rank, batches handed out), and
checkpoints the count with the loader's position: a resumed run masks as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sized
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from models import ModelSpec, is_masked_lm, model_fields

MLM_LABELS = "mlm_labels"
IGNORE_INDEX = -100
MLM_PROBABILITY = 0.15  # BERT's and the collator's default
MASK_REPLACE_PROB = 0.8
RANDOM_REPLACE_PROB = 0.1
VALIDATION_MASK_SEED = 42
_COUNT_KEY = "masked_batches"  # the train loader's position gains this count

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Masking:
    """What masking needs from the model config."""

    mask_token_id: int
    vocab_size: int
    special_ids: tuple[int, ...]
    """Ids never masked (EOS, padding), as the collator's special-tokens mask."""

    @classmethod
    def of(cls, model_cfg: ModelSpec) -> Masking | None:
        """The masking of a masked-LM model config; ``None`` for a causal LM."""
        if not is_masked_lm(model_cfg):
            return None
        model_cfg = model_fields(model_cfg)
        special = (int(model_cfg["eos_token_id"]), int(model_cfg["pad_token_id"]))
        return cls(int(model_cfg["mask_token_id"]), int(model_cfg["vocab_size"]), special)


def derived_seed(*parts: object) -> int:
    """A 63-bit seed from any values, stable across processes and Python versions."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def mask_row(
    ids: torch.Tensor, eligible: torch.Tensor, masking: Masking, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, labels)`` of one row: ``DataCollatorForLanguageModeling.torch_mask_tokens``'s
    draws, in its order, on ``generator`` (``tests/train/test_objective.py`` checks it bit for bit)."""
    labels = ids.clone()
    probability = torch.full(ids.shape, MLM_PROBABILITY).masked_fill_(~eligible, 0.0)
    chosen = torch.bernoulli(probability, generator=generator).bool()
    labels[~chosen] = IGNORE_INDEX
    inputs = ids.clone()
    replaced = torch.bernoulli(torch.full(ids.shape, MASK_REPLACE_PROB), generator=generator)
    replaced = replaced.bool() & chosen
    inputs[replaced] = masking.mask_token_id
    scaled = RANDOM_REPLACE_PROB / (1 - MASK_REPLACE_PROB)
    randomised = torch.bernoulli(torch.full(ids.shape, scaled), generator=generator).bool()
    randomised &= chosen & ~replaced
    words = torch.randint(masking.vocab_size, ids.shape, dtype=torch.long, generator=generator)
    inputs[randomised] = words[randomised]
    return inputs, labels


def mask_batch(batch: Batch, masking: Masking, seed: int) -> Batch:
    """The masked-LM form of a causal batch (``input_ids``, ``labels``, ``attention_mask``):
    each row masked with a generator seeded from ``seed`` and its tokens."""
    ids, attention = batch["input_ids"], batch["attention_mask"]
    eligible = attention.bool() & ~torch.isin(ids, torch.tensor(masking.special_ids))
    inputs, labels = torch.empty_like(ids), torch.empty_like(ids)
    for r in range(ids.shape[0]):
        content = ids[r, : int(attention[r].sum())].tolist()
        generator = torch.Generator().manual_seed(derived_seed(seed, content))
        inputs[r], labels[r] = mask_row(ids[r], eligible[r], masking, generator)
    return {"input_ids": inputs, MLM_LABELS: labels, "attention_mask": attention}


def masked_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of each masked position predicting its own original id (float32)."""
    return F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
    )


def count_masked(batch: Batch) -> int:
    return int((batch[MLM_LABELS] != IGNORE_INDEX).sum())


class MaskedTrainLoader:
    """The train loader with each batch masked (base seed from run seed, rank and batch count);
    its position (``state_dict``) is the wrapped loader's plus the count."""

    def __init__(self, loader: Any, masking: Masking, *, seed: int, rank: int, world_size: int):
        self.loader, self.masking = loader, masking
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.batches = 0

    def __iter__(self) -> MaskedTrainLoader:
        return self

    def __next__(self) -> Batch:
        batch = next(self.loader)
        self.batches += 1
        return mask_batch(batch, self.masking, derived_seed(self.seed, self.rank, self.batches))

    def __getattr__(self, name: str) -> Any:  # stats, close, check_one_pass_fills, ...
        return getattr(self.loader, name)

    def state_dict(self) -> dict:
        return {**self.loader.state_dict(), _COUNT_KEY: self.batches}

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)
        self.batches = int(state.get(_COUNT_KEY, 0))

    def load_positions(self, positions: list[dict]) -> None:
        """A checkpoint of another world size re-derives the data position; the count, which
        only seeds the masks, starts again from 0 there."""
        self.loader.load_positions(positions)
        same = len(positions) == self.world_size
        self.batches = int(positions[self.rank].get(_COUNT_KEY, 0)) if same else 0


class MaskedValBatches:
    """The fixed validation set, masked with ``VALIDATION_MASK_SEED``: the same masked tokens at
    every evaluation of every run."""

    def __init__(self, batches: Sized, masking: Masking):
        self.batches, self.masking = batches, masking

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.batches:
            yield mask_batch(batch, self.masking, VALIDATION_MASK_SEED)
