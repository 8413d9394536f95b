"""`make demo`: it reads each training token at most once (a demo that loops over its corpus
reports memorisation as learning), and its command line takes Hydra overrides but refuses flags
before any training."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import models
from repro.demo import OVERRIDES, RUN_DIR, run_dir_of
from train.data.corpus import open_source
from train.data.tokenizer import build_tokenizer
from train.schema import data_config

REPO = Path(__file__).resolve().parents[2]
DEMO = [sys.executable, str(REPO / "scripts" / "demo.py")]


def setting(key: str) -> str:
    (value,) = [o.split("=", 1)[1] for o in OVERRIDES if o.startswith(f"{key}=")]
    return value


def test_the_demo_run_fits_in_one_pass_over_the_training_split():
    assert setting("data") == "embedded" and setting("data.pack") == "true"  # no padding rows
    data = yaml.safe_load((REPO / "configs" / "data" / "embedded.yaml").read_text())
    data.update(tokenizer=setting("data.tokenizer"), spm_vocab_size=setting("data.spm_vocab_size"))
    vocab = models.load_model_config(setting("+model"))["vocab_size"]
    data = data_config(data)
    tokenizer = build_tokenizer(data, vocab)
    texts = [record["text"] for record in open_source(data, "train")]
    available = sum(len(ids) for ids in tokenizer.encode_batch(texts))
    read = (
        int(setting("trainer.max_steps"))
        * int(setting("trainer.global_batch_size"))
        * int(setting("data.seq_len"))
    )
    assert 0.8 * available < read <= available


def demo(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*DEMO, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_help_describes_the_demo_and_trains_nothing():
    """``--help`` went on to Hydra's help, then printed the previous demo's perplexity."""
    shown = demo("--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: demo.py")
    assert "embedded offline corpus" in " ".join(shown.stdout.split()) and "$ " not in shown.stdout


def test_an_unknown_flag_is_refused_by_the_demo_itself():
    refused = demo("--steps", "10")
    assert refused.returncode == 2 and not refused.stdout
    assert refused.stderr.splitlines()[-1] == "demo.py: error: unrecognized arguments: --steps"


def test_the_last_run_dir_override_wins_as_in_hydra(tmp_path):
    assert run_dir_of(OVERRIDES) == RUN_DIR
    moved = run_dir_of([*OVERRIDES, "hydra.run.dir=runs/elsewhere"])
    assert moved == REPO / "runs" / "elsewhere"
    assert run_dir_of([*OVERRIDES, f"hydra.run.dir={tmp_path}"]) == tmp_path


@pytest.mark.slow
def test_the_demo_reports_the_run_it_made_where_it_was_told(tmp_path):
    done = demo(
        "trainer.max_steps=4", "trainer.eval_every=2", f"hydra.run.dir={tmp_path}", timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "after 4 steps" in done.stdout and f"run directory {tmp_path}" in done.stdout
    assert (tmp_path / "summary.json").is_file() and (tmp_path / "curves.png").is_file()
