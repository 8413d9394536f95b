"""The masked-LM objective (train/objective.py): transformers' collator's masking bit for bit,
the loss on the masked positions only, resumable training masks and fixed validation masks
(tiny GPT-2 and DeBERTa runs through the trainer's CLI: tests/e2e/test_model_families.py)."""

import contextlib

import pytest
import torch
from tokenizers import Tokenizer, pre_tokenizers
from tokenizers.models import WordLevel
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

import models
from train.objective import (
    MLM_LABELS,
    MaskedTrainLoader,
    MaskedValBatches,
    Masking,
    mask_batch,
    mask_row,
)
from train.step import count_targets, forward_loss_sum

VOCAB = 50
MASK = VOCAB - 1


def collator(seed: int) -> DataCollatorForLanguageModeling:
    """transformers' collator over a word-level tokenizer of ``VOCAB`` ids, the last [MASK]."""
    words = {f"w{i}": i for i in range(VOCAB - 1)} | {"[MASK]": MASK}
    backend = Tokenizer(WordLevel(words, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, mask_token="[MASK]")
    tokenizer.pad_token = "w0"
    out = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    out.generator = torch.Generator().manual_seed(seed)
    return out


def test_a_row_is_masked_as_the_collator_masks_it():
    masking = Masking(MASK, VOCAB, special_ids=(1, 0))
    ids = torch.randint(2, VOCAB - 1, (400,), generator=torch.Generator().manual_seed(0))
    eligible = torch.ones(400, dtype=torch.bool)
    eligible[-30:] = False  # padding
    reference = collator(seed=7)
    expected_inputs, expected_labels = reference.torch_mask_tokens(
        ids[None].clone(), special_tokens_mask=~eligible[None]
    )
    inputs, labels = mask_row(ids, eligible, masking, torch.Generator().manual_seed(7))
    assert torch.equal(inputs, expected_inputs[0]) and torch.equal(labels, expected_labels[0])
    chosen = labels != -100
    assert 30 < int(chosen.sum()) < 80  # 15 % of 370 eligible tokens is 55.5
    assert not chosen[-30:].any()
    assert torch.equal(labels[chosen], ids[chosen])  # the originals are the targets
    assert (inputs[chosen] == MASK).float().mean() > 0.6  # 80 % masked, 10 % random, 10 % kept


def batch_of(rows: list[list[int]], length: int = 12) -> dict[str, torch.Tensor]:
    """A causal batch as the data pipeline makes it (pad 0, EOS 1 last)."""
    ids = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, : len(row)], mask[r, : len(row)] = torch.tensor(row), 1
    return {"input_ids": ids, "labels": ids.masked_fill(mask == 0, -100), "attention_mask": mask}


def test_a_rows_masks_follow_its_tokens_not_its_batch():
    masking = Masking(MASK, VOCAB, special_ids=(1, 0))
    rows = [[5 + (i * 7 + j) % 40 for j in range(10)] + [1] for i in range(6)]
    alone = mask_batch(batch_of(rows[2:3]), masking, seed=3)
    together = mask_batch(batch_of(rows), masking, seed=3)
    assert torch.equal(together["input_ids"][2], alone["input_ids"][0])
    assert torch.equal(together[MLM_LABELS][2], alone[MLM_LABELS][0])
    assert "labels" not in together  # scored as a masked batch by train/step.py
    other_seed = mask_batch(batch_of(rows), masking, seed=4)
    assert not torch.equal(other_seed[MLM_LABELS], together[MLM_LABELS])
    eos_or_pad = batch_of(rows)["input_ids"] <= 1
    assert (together[MLM_LABELS][eos_or_pad] == -100).all()  # EOS and padding never masked
    assert count_targets(together) == int((together[MLM_LABELS] != -100).sum())


def test_the_loss_is_the_models_own_masked_lm_loss_summed():
    torch.manual_seed(0)
    cfg = models.load_model_config("deberta_tiny")
    model = models.build_model(cfg).eval()
    rows = [[5 + (i * 11 + j) % 300 for j in range(40 - i)] + [1] for i in range(4)]
    batch = mask_batch(batch_of(rows, length=48), Masking.of(cfg), seed=0)
    with torch.no_grad():
        ours = forward_loss_sum(model, batch, contextlib.nullcontext)
        theirs = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch[MLM_LABELS],
        ).loss
    assert ours.item() == pytest.approx(theirs.item() * count_targets(batch), rel=1e-5)


class Counting:
    """A stand-in train loader: batch k holds the rows k, k+1 (a position to save and load)."""

    def __init__(self):
        self.k = 0

    def __next__(self):
        self.k += 1
        return batch_of([[5 + self.k, 6, 7, 8, 9, 10, 11, 1], [9, 8, 7, 6, 5 + self.k, 1]])

    def state_dict(self):
        return {"k": self.k}

    def load_state_dict(self, state):
        self.k = state["k"]

    def load_positions(self, positions):
        self.load_state_dict(positions[0])


def test_a_resumed_loader_masks_as_the_uninterrupted_one():
    masking = Masking(MASK, VOCAB, special_ids=(1, 0))
    straight = MaskedTrainLoader(Counting(), masking, seed=1, rank=0, world_size=1)
    expected = [next(straight)[MLM_LABELS] for _ in range(6)]
    first = MaskedTrainLoader(Counting(), masking, seed=1, rank=0, world_size=1)
    for _ in range(3):
        next(first)
    resumed = MaskedTrainLoader(Counting(), masking, seed=1, rank=0, world_size=1)
    resumed.load_positions([first.state_dict()])
    assert all(torch.equal(next(resumed)[MLM_LABELS], e) for e in expected[3:])
    # the same rows at another step get other masks (dynamic masking)
    assert not all(torch.equal(expected[0], e) for e in expected[1:])


def test_every_evaluation_scores_the_same_masked_tokens():
    masking = Masking(MASK, VOCAB, special_ids=(1, 0))
    rows = [[5 + (i + j) % 40 for j in range(11)] + [1] for i in range(8)]
    validation = MaskedValBatches([batch_of(rows[:4]), batch_of(rows[4:])], masking)
    first, again = list(validation), list(validation)
    assert len(validation) == 2
    assert all(torch.equal(a[MLM_LABELS], b[MLM_LABELS]) for a, b in zip(first, again, strict=True))
