"""FOAM inside transformers.Trainer: trains, checkpoints, and resumes with its optimizer state."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

import foam
from foam.integrations.transformers import trainer_optimizers
from foam.schedule import lr_multiplier

MAX_STEPS = 4


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def token_data(n: int = 32, length: int = 16) -> list[dict[str, torch.Tensor]]:
    """Counting sequences (each token is the previous one plus one): learnable in a few steps."""
    starts = torch.randint(0, 64, (n, 1), generator=torch.Generator().manual_seed(1))
    ids = (starts + torch.arange(length)) % 64
    return [{"input_ids": row, "labels": row} for row in ids]


def args(out, **kw) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out),
        max_steps=MAX_STEPS,
        per_device_train_batch_size=4,
        save_steps=2,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
        **kw,
    )


def foam2_trainer(out) -> Trainer:
    model = tiny_llama()
    optimizers = trainer_optimizers(
        model, "foam", max_steps=MAX_STEPS, lr=1e-2, level=2, alpha=0.25
    )
    return Trainer(model=model, args=args(out), train_dataset=token_data(), optimizers=optimizers)


class OptimizerStateAtStart(TrainerCallback):
    """The optimizer's state when training (re)starts, i.e. after the Trainer loaded it."""

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        optimizer = getattr(optimizer, "optimizer", optimizer)  # under accelerate's wrapper
        state = optimizer.state_dict()["state"]
        self.state = {k: {n: v.clone() for n, v in s.items()} for k, s in state.items()}


def test_trainer_trains_saves_and_resumes_with_foam_state(tmp_path):
    trainer = foam2_trainer(tmp_path)
    trainer.train()
    optimizer = trainer.optimizer.optimizer  # the Trainer wraps it for accelerate
    assert isinstance(optimizer, foam.FOAM)
    assert [g["level"] for g in optimizer.param_groups] == [2, None]
    lrs = [r["learning_rate"] for r in trainer.state.log_history if "learning_rate" in r]
    # the paper's schedule (no warmup step in 4): each logged step ran at its own lr
    assert lrs == pytest.approx(
        [1e-2 * lr_multiplier(k, max_steps=4, warmup=0, min_lr_ratio=0.1) for k in range(4)]
    )
    losses = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    assert losses[-1] < losses[0]
    final = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    saved = torch.load(tmp_path / "checkpoint-2" / "optimizer.pt", weights_only=True)
    assert saved["state"] and saved["param_groups"][0]["level"] == 2

    resumed = foam2_trainer(tmp_path / "resumed")
    probe = OptimizerStateAtStart()
    resumed.add_callback(probe)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert probe.state.keys() == saved["state"].keys()
    for key, entry in saved["state"].items():
        for name, value in entry.items():
            torch.testing.assert_close(probe.state[key][name], value, rtol=0, atol=0)
    for name, p in resumed.model.named_parameters():  # resume == uninterrupted
        torch.testing.assert_close(p, final[name], rtol=0, atol=0)


def test_target_modules_choose_the_folded_matrices():
    model = tiny_llama()
    optimizer, _ = trainer_optimizers(model, "foam", max_steps=10, target_modules=[r".*\.mlp\..*"])
    folded = {id(p) for p in optimizer.param_groups[0]["params"]}
    names = sorted(n for n, p in model.named_parameters() if id(p) in folded)
    assert names == sorted(
        f"model.layers.{i}.mlp.{m}_proj.weight" for i in range(2) for m in ("gate", "up", "down")
    )
    default, _ = trainer_optimizers(model, "foam", max_steps=10)
    assert len(default.param_groups[0]["params"]) == 2 * 7  # q, k, v, o, gate, up, down


def test_bad_input_fails_with_a_message():
    model = tiny_llama()
    with pytest.raises(ValueError, match=r"selects no nn\.Linear"):
        trainer_optimizers(model, "foam", max_steps=10, target_modules="attn")
    with pytest.raises(ValueError, match="max_steps must be a positive"):
        trainer_optimizers(model, "foam", max_steps=0)
