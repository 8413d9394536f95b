"""Save and resume in-process: a restored run continues exactly where the saved one was."""

from __future__ import annotations

import contextlib
import copy
import random
import time

import pytest
import torch

import foam
import models
from train.checkpoint import Resumable, restore_training_state, save_training_state
from train.data.loader import build_train_loader
from train.data.tokenizer import build_tokenizer
from train.errors import ConfigError
from train.schedule import build_scheduler
from train.schema import DataConfig
from train.state import TrainState
from train.step import train_step

CPU = torch.device("cpu")
MAX_STEPS = 6


@pytest.fixture(scope="module")
def data_cfg(tmp_path_factory) -> DataConfig:
    cache = tmp_path_factory.mktemp("tokenizers")
    return DataConfig(
        name="embedded",
        val_fraction=0.1,
        seq_len=32,
        tokenizer="spm",
        spm_vocab_size=512,
        tokenizer_cache_dir=str(cache),
        shuffle_buffer=64,
        num_workers=0,
    )


@pytest.fixture(scope="module")
def tokenizer(data_cfg):
    return build_tokenizer(data_cfg, 512)


def build(data_cfg, tokenizer, seed: int) -> Resumable:
    """A tiny run's live objects; ``seed`` decides the initial weights."""
    torch.manual_seed(seed)
    model_cfg = {**models.load_model_config("llama_tiny"), "vocab_size": 512}
    model = models.build_model(model_cfg)
    optimizer = foam.build_optimizer("foam", model, lr=1e-2, level=2)
    scheduler = build_scheduler(optimizer, max_steps=MAX_STEPS, warmup_ratio=0.2, min_lr_ratio=0.1)
    loader = build_train_loader(
        data_cfg, tokenizer, micro_batch_size=2, rank=0, world_size=1, seed=0
    )
    return Resumable(model, optimizer, scheduler, loader)


def steps(run: Resumable, state: TrainState, n: int) -> list[float]:
    losses = []
    for _ in range(n):
        result, _, _ = train_step(
            run.model,
            run.optimizer,
            run.scheduler,
            run.loader,
            accumulation=2,
            device=CPU,
            world_size=1,
            autocast=contextlib.nullcontext,
            grad_clip=1.0,
        )
        state.step += 1
        tokens, slots = int(result.counts[1]), int(result.counts[2])
        state.add_interval(tokens, slots, seconds=0.01, steady=state.step > 1)
        losses.append(result.loss.item())
    return losses


def state_dicts(run: Resumable) -> dict:
    return {
        name: getattr(run, name).state_dict()
        for name in ("model", "optimizer", "scheduler", "loader")
    }


def assert_equal_trees(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_equal_trees(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_equal_trees(x, y)
    else:
        assert a == b


def test_restore_equals_the_saved_run_and_continues_it(tmp_path, data_cfg, tokenizer):
    saved_run, state = build(data_cfg, tokenizer, seed=0), TrainState(run_id="abc")
    steps(saved_run, state, 2)
    state.record_eval({"val_loss": 5.0, "val_ppl": 148.4})
    path = save_training_state(tmp_path, saved_run, state, rank=0, keep_last=0)
    at_save = copy.deepcopy(state_dicts(saved_run))
    draws = (random.random(), torch.rand(3))
    continued = steps(saved_run, state, 3)

    resumed, resumed_state = build(data_cfg, tokenizer, seed=1), TrainState()
    restore_training_state(path, resumed, resumed_state, rank=0)
    assert_equal_trees(state_dicts(resumed), at_save)
    assert (random.random(), torch.rand(3)) == (draws[0], pytest.approx(draws[1]))
    assert (resumed_state.step, resumed_state.run_id, resumed_state.eval_history) == (
        2,
        "abc",
        [{"step": 2, "tokens": resumed_state.tokens, "val_loss": 5.0, "val_ppl": 148.4}],
    )
    assert resumed_state.tokens > 0 and resumed_state.train_time_s > 0
    assert steps(resumed, resumed_state, 3) == continued
    for p, q in zip(saved_run.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert resumed_state.state_dict().keys() == state.state_dict().keys()
    assert (resumed_state.step, resumed_state.tokens) == (state.step, state.tokens)


def test_resume_on_two_ranks_of_a_source_split_by_files_is_refused(tmp_path, data_cfg, tokenizer):
    """The embedded corpus has an even number of files: two ranks read whole files, one rank
    all of them in another order, so a position cannot be carried from one to the other."""
    run, state = build(data_cfg, tokenizer, seed=0), TrainState()
    steps(run, state, 1)
    path = save_training_state(tmp_path, run, state, rank=0, keep_last=0)
    run.loader = build_train_loader(
        data_cfg, tokenizer, micro_batch_size=2, rank=1, world_size=2, seed=0
    )
    with pytest.raises(ConfigError, match=r"1 rank\(s\), this run has 2.*by whole files"):
        restore_training_state(path, run, TrainState(world_size=2), rank=1)


def test_resume_with_other_data_settings_is_a_config_error(tmp_path, data_cfg, tokenizer):
    run = build(data_cfg, tokenizer, seed=0)
    path = save_training_state(tmp_path, run, TrainState(), rank=0, keep_last=0)
    run.loader = build_train_loader(
        data_cfg, tokenizer, micro_batch_size=4, rank=0, world_size=1, seed=0
    )
    with pytest.raises(ConfigError, match=r"trainer\.resume: .*micro_batch_size"):
        restore_training_state(path, run, TrainState(), rank=0)


def test_train_state_times_add_up_over_segments():
    first = TrainState(world_size=2, step=1)
    first.add_interval(tokens=10, token_slots=12, seconds=0.5, steady=False)
    time.sleep(0.01)
    saved = first.state_dict()
    assert saved["wall_time_s"] >= 0.01 and saved["train_time_s"] == 0.5
    second = TrainState(world_size=2)
    second.load_state_dict(saved)
    assert second.wall_time() >= saved["wall_time_s"]
    second.step += 1
    second.add_interval(tokens=5, token_slots=8, seconds=0.25, steady=True)
    assert (second.step, second.tokens, second.train_time_s) == (2, 15, 0.75)
    assert second.token_slots == 20
    assert (second.steady_tokens, second.steady_token_slots, second.steady_time_s) == (5, 8, 0.25)
    assert second.last_eval() is None
    entry = second.record_eval({"val_loss": 3.0, "val_ppl": 20.1})
    assert (
        second.record_eval({"val_loss": 3.0, "val_ppl": 20.1}) == entry
        and len(second.eval_history) == 1
    )
    assert second.last_eval() == entry
