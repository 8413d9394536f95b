"""Model families other than LLaMA pretrain through the trainer's CLI: tiny GPT-2 (causal) and
DeBERTa (masked LM), each scored on the tokens its objective predicts."""

import json

import pytest
import torch

from tests.helpers.cli import TINY, command, run


@pytest.mark.parametrize(("model", "objective"), [("gpt2_tiny", "causal"), ("deberta_tiny", "mlm")])
def test_tiny_gpt2_and_deberta_pretrain_through_the_cli(tmp_path, model, objective):
    run_dir = tmp_path / "run"
    tiny = [o for o in TINY if not o.startswith("+model")]
    overrides = ("trainer.max_steps=2", "trainer.eval_every=0", "trainer.save_every=0")
    run([*command(run_dir, *overrides, tiny=False), f"+model={model}", *tiny])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["model"] == model
    env = summary["environment"]  # what a bit-for-bit repeat of the run needs to match
    assert env["torch"] == torch.__version__ and env["threads"] >= 1
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and env["cpu"]
    evaluated = summary["eval_history"][-1]
    assert 100 < evaluated["val_ppl"] < 1e6  # near chance on 32000 ids after two steps
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    val_tokens = [json.loads(line).get("val_tokens") for line in lines]
    scored = next(t for t in val_tokens if t)
    if objective == "mlm":  # ~15 % of the 2000 validation tokens are scored
        assert 150 < scored < 600
    else:
        assert scored > 1500
