"""Validation loss: token-weighted over every target of the validation set, whatever the
micro-batch size, against a loss computed by hand one unpadded document at a time."""

import math

import pytest
import torch

import models
from train.evaluate import evaluate

VOCAB = 128
CPU = torch.device("cpu")
LENGTHS = [3, 16, 5, 12, 2, 9, 14]  # very different lengths: a mean of per-batch means differs
TOLERANCE = 1e-5  # relative; float32 logits of the padded batch against the unpadded documents


def tiny_model() -> torch.nn.Module:
    cfg = {**models.load_model_config("llama_tiny"), "vocab_size": VOCAB, "num_hidden_layers": 2}
    torch.manual_seed(0)
    return models.build_model(cfg)


def documents() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(1, VOCAB, (n,), generator=gen) for n in LENGTHS]


def micro_batches(docs: list[torch.Tensor], size: int) -> list[dict[str, torch.Tensor]]:
    """Right-padded micro-batches of ``size`` documents (the last one may be smaller); padding
    has label -100 and attention mask 0, as the data pipeline writes it."""
    out = []
    for start in range(0, len(docs), size):
        group = docs[start : start + size]
        width = max(len(d) for d in group)
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for row, doc in enumerate(group):
            ids[row, : len(doc)], mask[row, : len(doc)] = doc, 1
        out.append(
            {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        )
    return out


@torch.no_grad()
def hand_computed_loss(model: torch.nn.Module, docs: list[torch.Tensor]) -> tuple[float, int]:
    """Mean over every next-token target of every document, each run alone without padding."""
    total, targets = 0.0, 0
    for doc in docs:
        logits = model(input_ids=doc[None]).logits[0].double()
        log_probs = torch.log_softmax(logits[:-1], dim=-1)
        total -= float(log_probs[torch.arange(len(doc) - 1), doc[1:]].sum())
        targets += len(doc) - 1
    return total / targets, targets


@pytest.mark.parametrize("size", [1, 3, 4, 7])
def test_loss_is_token_weighted_over_the_whole_set_for_any_micro_batch_size(size):
    model, docs = tiny_model(), documents()
    expected, targets = hand_computed_loss(model, docs)
    result = evaluate(model, micro_batches(docs, size), device=CPU)
    assert result["val_tokens"] == targets == sum(LENGTHS) - len(LENGTHS)
    assert result["val_loss"] == pytest.approx(expected, rel=TOLERANCE)
    assert result["val_ppl"] == pytest.approx(math.exp(expected), rel=TOLERANCE)
    if size < len(docs):  # the case tells the token-weighted loss from a mean of batch means
        means = [
            hand_computed_loss(model, docs[i : i + size])[0] for i in range(0, len(docs), size)
        ]
        assert abs(sum(means) / len(means) - expected) > 10 * TOLERANCE * expected


def test_model_is_evaluated_in_eval_mode_and_handed_back_as_it_was():
    model = tiny_model()
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    model.train()
    evaluate(model, micro_batches(documents(), 4), device=CPU)
    assert seen == [False, False] and model.training
    model.eval()
    evaluate(model, micro_batches(documents(), 4), device=CPU)
    assert not model.training


def test_single_target_and_empty_validation_sets():
    model, doc = tiny_model(), documents()[4]  # 2 tokens: one target
    expected, targets = hand_computed_loss(model, [doc])
    result = evaluate(model, micro_batches([doc], 1), device=CPU)
    assert targets == result["val_tokens"] == 1
    assert result["val_loss"] == pytest.approx(expected, rel=1e-5)
    assert evaluate(model, [], device=CPU) == {
        "val_loss": 0.0,
        "val_ppl": 1.0,
        "val_tokens": 0,
        "val_loss_paper": 0.0,
        "val_ppl_paper": 1.0,
    }


class ConfidentlyWrong(torch.nn.Module):
    """Puts a logit of 1000 on token 0 everywhere: a loss of about 1000 nats per target."""

    def forward(self, input_ids, attention_mask):
        logits = torch.zeros(*input_ids.shape, VOCAB)
        logits[..., 0] = 1000.0
        return type("Output", (), {"logits": logits})()


def test_perplexity_of_a_diverged_model_is_capped_not_an_overflow():
    result = evaluate(ConfidentlyWrong(), micro_batches(documents(), 4), device=CPU)
    assert result["val_loss"] == pytest.approx(1000.0, rel=1e-3)
    assert result["val_ppl"] == math.exp(700.0)


class FavoursTokenZero(torch.nn.Module):
    """Logit ln 3 on token 0, 0 on the other three of a 4-token vocabulary: a target 0 costs
    ln(6/3) = ln 2 nats, any other target ln 6, whatever the context."""

    def forward(self, input_ids, attention_mask):
        logits = torch.zeros(*input_ids.shape, 4)
        logits[..., 0] = math.log(3.0)
        return type("Output", (), {"logits": logits})()


def test_the_papers_figure_is_the_mean_of_batch_means_over_n_plus_one_beside_ours():
    """Two hand-made batches: targets (0, 0), then (2, 3, 0) and a padded slot. The harnesses
    (benchmark_protocol.md, "Evaluation") add each batch's mean loss and divide by n + 1 = 3."""
    first = {"input_ids": torch.tensor([[1, 0, 0]]), "attention_mask": torch.ones(1, 3)}
    second_ids = torch.tensor([[1, 2, 3, 0, 0]])
    second = {"input_ids": second_ids, "attention_mask": torch.tensor([[1, 1, 1, 1, 0]])}
    first["labels"] = first["input_ids"]
    second["labels"] = second_ids.masked_fill(second["attention_mask"] == 0, -100)
    ln2, ln6 = math.log(2.0), math.log(6.0)
    result = evaluate(FavoursTokenZero(), [first, second], device=CPU, split="test")
    assert result["test_tokens"] == 5
    assert result["test_loss"] == pytest.approx((3 * ln2 + 2 * ln6) / 5, rel=1e-6)
    assert result["test_loss_paper"] == pytest.approx((ln2 + (ln2 + 2 * ln6) / 3) / 3, rel=1e-6)
    assert result["test_ppl_paper"] == pytest.approx(math.exp(result["test_loss_paper"]))
