"""`make demo` reads each training token at most once (it used to loop ~9 times over the corpus)."""

from pathlib import Path

import yaml

import models
from repro.demo import OVERRIDES
from train.corpus import open_source
from train.tokenizer import build_tokenizer

REPO = Path(__file__).resolve().parents[1]


def setting(key: str) -> str:
    (value,) = [o.split("=", 1)[1] for o in OVERRIDES if o.startswith(f"{key}=")]
    return value


def test_the_demo_run_fits_in_one_pass_over_the_training_split():
    assert setting("data") == "embedded" and setting("data.pack") == "true"  # no padding rows
    data = yaml.safe_load((REPO / "configs" / "data" / "embedded.yaml").read_text())
    data.update(tokenizer=setting("data.tokenizer"), spm_vocab_size=setting("data.spm_vocab_size"))
    vocab = models.load_model_config(setting("+model"))["vocab_size"]
    tokenizer = build_tokenizer(data, vocab)
    texts = [record["text"] for record in open_source(data, "train")]
    available = sum(len(ids) for ids in tokenizer.encode_batch(texts))
    read = (
        int(setting("trainer.max_steps"))
        * int(setting("trainer.global_batch_size"))
        * int(setting("data.seq_len"))
    )
    assert 0.8 * available < read <= available
