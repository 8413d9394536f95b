"""A run's model leaves as a transformers checkpoint that loads, scores and generates as trained."""

import json
import re
import runpy
import textwrap

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer

import models
from tests.helpers.cli import REPO, command, run
from train.checkpoint import load_model_weights
from train.data.tokenizer import HFTokenizer
from train.data.val_batches import build_val_batches
from train.evaluate import evaluate
from train.schema import data_config

export_hf_main = runpy.run_path(str(REPO / "scripts" / "export_hf.py"))["main"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 3-step tiny LLaMA run; its tokenizer is the SentencePiece fallback (no hub here)."""
    path = tmp_path_factory.mktemp("export") / "run"
    run(command(path, "trainer.max_steps=3", "trainer.eval_every=0", "data.tokenizer=spm"))
    return path


def checkpoint_model(run_dir):
    cfg = OmegaConf.load(run_dir / "config.yaml")
    model = load_model_weights(
        run_dir / "checkpoints" / "step_00000003", models.build_model(cfg.model)
    )
    return cfg, model.eval()


def test_export_loads_with_auto_classes_and_scores_as_the_trainer(run_dir):
    hf = run_dir / "hf"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in hf.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(hf)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    cfg, trained = checkpoint_model(run_dir)

    ids = torch.randint(
        0, cfg.model.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, trained(ids).logits, rtol=0, atol=0)

    # the validation loss the trainer reported, with the exported tokenizer doing the encoding
    val = build_val_batches(
        data_config(cfg.data),
        HFTokenizer(tokenizer, "exported", cfg.model.vocab_size),
        micro_batch_size=cfg.trainer.micro_batch_size,
        rank=0,
        world_size=1,
        max_tokens=cfg.trainer.eval_tokens,
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    loss = evaluate(model, val, device=torch.device("cpu"))["val_loss"]
    assert loss == pytest.approx(summary["final_val_loss"], rel=1e-6)

    prompt = tokenizer("The for statement", add_special_tokens=False, return_tensors="pt")
    out = model.generate(**prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 6
    assert tokenizer.decode(out[0, -6:], skip_special_tokens=True).strip()


def test_export_script_converts_a_checkpoint_to_bf16(run_dir, tmp_path):
    out = tmp_path / "bf16"
    checkpoint = run_dir / "checkpoints" / "step_00000003"
    assert export_hf_main([str(checkpoint), str(out), "--dtype", "bf16"]) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    _, trained = checkpoint_model(run_dir)
    for name, p in trained.state_dict().items():
        assert torch.equal(model.state_dict()[name], p.to(torch.bfloat16)), name
    assert AutoTokenizer.from_pretrained(out).eos_token_id == 1


def test_export_script_rejects_a_path_that_is_not_a_checkpoint(tmp_path, capsys):
    assert export_hf_main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert "not a checkpoint directory" in capsys.readouterr().err


def test_the_readme_loading_example_runs_on_an_exported_run(run_dir, capsys):
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    (block,) = [textwrap.dedent(b) for b in blocks if "AutoModelForCausalLM" in b]
    exec(block.replace("runs/demo/hf", str(run_dir / "hf")), {})
    assert capsys.readouterr().out.startswith("The for statement")


def test_a_tokenizer_that_cannot_convert_leaves_the_model_with_a_warning(tmp_path, caplog):
    import io

    import sentencepiece as spm

    from train.data.tokenizer import SentencePieceTokenizer
    from train.export.hf import export_hf

    proto = io.BytesIO()  # SentencePiece's default layout: unk 0, bos 1, eos 2, no pad
    lines = [f"line {i} of a small corpus with some words" for i in range(200)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=proto, vocab_size=40, minloglevel=2
    )
    tokenizer = SentencePieceTokenizer(proto.getvalue(), "user.model", 64)
    model = models.build_model(models.load_model_config("llama_tiny"))
    export_hf(model, tokenizer, tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert not (tmp_path / "tokenizer.json").exists()
    assert "without a tokenizer" in caplog.text and "T5's layout" in caplog.text
