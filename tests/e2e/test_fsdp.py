"""FSDP2 (``trainer.parallelism=fsdp``) on CPU with gloo: sharded training equals unsharded
training, FOAM's states are sharded with the weights, a method's layout rule picks another dim
where FOAM's would cut its states (GWT-Mini's wavelet pairs), and a layout no dim serves (8-bit
Adam's blocks on llama_tiny) is refused before any compute."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from foam import fused
from foam.sharding import shard_dim
from tests.helpers.cli import TINY, command, run, torchrun, train_losses
from tests.helpers.fsdp_parity import ENV, REPO, sharded_and_single
from train.distributed import shutdown
from train.parallelism import compiles_layers, uses_autocast

PARITY = ["adamw", "foam", "foam_mini"]
REFUSED = "adamw8bit"
"""A layout no dim takes: llama_tiny's 172 x 64 gate/up on 2 ranks are 86 rows or 32 columns of
64 a rank, neither whole 256-entry blocks of 8-bit Adam's state."""


@pytest.fixture(scope="module")
def runs() -> tuple[dict[str, dict], dict[str, dict]]:
    return sharded_and_single(*PARITY, REFUSED)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", PARITY)
def test_two_rank_fsdp_equals_one_rank(runs, name):
    sharded, single = runs
    assert len(single[name]["losses"]) == 5
    assert sharded[name]["losses"] == pytest.approx(single[name]["losses"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", ["foam", "foam_mini"])
def test_foam_steps_its_shards_with_the_fused_kernel(runs, name):
    """Each rank's shards take the fused CPU step, as the unsharded matrices do."""
    sharded, single = runs
    if not fused.kernel_available("cpu"):
        pytest.fail("the fused CPU kernel did not build (see the log)")
    assert sharded[name]["foam_steps"] == single[name]["foam_steps"] == {"matrices": "cpp"}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", PARITY)
def test_accumulated_gradients_stay_sharded_between_micro_batches(runs, name):
    """Each micro-batch is reduce-scattered into the sharded gradients: holding the whole
    gradient until the last one (``set_requires_gradient_sync(False)``) leaves them None."""
    sharded, _ = runs
    assert sharded[name]["sharded_grads_between_micro_batches"] == [True] * 5


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", PARITY)
def test_each_rank_holds_half_of_the_moments(runs, name):
    sharded, single = runs
    assert 2 * sharded[name]["moment_bytes"] == single[name]["moment_bytes"] > 0


@pytest.mark.slow
@pytest.mark.distributed
def test_a_layout_the_method_cannot_take_is_refused_under_fsdp(runs):
    sharded, single = runs
    assert "losses" in single[REFUSED]
    message = sharded[REFUSED]["refused"]
    assert "adamw8bit under FSDP2" in message and "would straddle two ranks" in message
    assert "trainer.parallelism=ddp" in message


# -- through the CLI: checkpoints of sharded runs --------------------------------------------


RUN = (
    "trainer.max_steps=6",
    "trainer.save_every=2",
    "trainer.eval_every=0",
    # At the default init (std 0.02) attention is near uniform and the loss moves by 5e-6 when
    # the rotary frequencies change: a resume that got them wrong would pass for exact.
    "model.initializer_range=0.2",
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[str, ...]:
    """One local file, so the stream is split among ranks one record each, the same documents
    make a step on 1 or 2 ranks, and a data position carries over between world sizes."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text(
        "".join(
            json.dumps({"text": f"document {i} " + "word " * (i % 40)}) + "\n" for i in range(600)
        )
    )
    return ("data=local", f"data.path={path}", "trainer.global_batch_size=8", *RUN)


@pytest.fixture(scope="module")
def curves(tmp_path_factory, corpus) -> dict[str, Path]:
    """A 1-rank run and a 2-rank FSDP2 run of the same 6 steps, checkpointed every 2."""
    root = tmp_path_factory.mktemp("curves")
    dirs = {"one": root / "one", "fsdp": root / "fsdp"}
    part = "trainer.eval_tokens=60"  # a part of the split: the same on 1 or 2 ranks
    run(command(dirs["one"], *corpus, part))
    run(torchrun(command(dirs["fsdp"], *corpus, part, "trainer.parallelism=fsdp")))
    return dirs


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_run_follows_the_one_rank_curve(curves):
    one, fsdp = train_losses(curves["one"]), train_losses(curves["fsdp"])
    assert sorted(fsdp) == list(range(1, 7))
    for step, loss in one.items():
        assert fsdp[step] == pytest.approx(loss, rel=1e-5)
    # and is scored on the same validation tokens, split among the ranks
    one_eval, fsdp_eval = final_evaluation(curves["one"]), final_evaluation(curves["fsdp"])
    assert fsdp_eval["val_tokens"] == one_eval["val_tokens"]
    assert fsdp_eval["val_loss"] == pytest.approx(one_eval["val_loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
def test_compiled_fsdp_run_follows_the_uncompiled_curve(tmp_path, curves, corpus):
    """``trainer.compile=true`` compiles each decoder layer, then FSDP2 shards it (torchtitan's
    order): it trains, and makes the uncompiled run's losses."""
    compiled = tmp_path / "compiled"
    part = "trainer.eval_tokens=60"
    run(
        torchrun(
            command(compiled, *corpus, part, "trainer.parallelism=fsdp", "trainer.compile=true")
        )
    )
    plain, losses = train_losses(curves["fsdp"]), train_losses(compiled)
    assert sorted(losses) == sorted(plain) == list(range(1, 7))
    for step, loss in plain.items():
        assert losses[step] == pytest.approx(loss, rel=1e-4)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_tied_model_built_by_rank_0_alone_follows_the_one_rank_curve(tmp_path, corpus):
    """Under FSDP2 the ranks build the model on the meta device and rank 0 alone builds it whole,
    then scatters weights and buffers (``fill_from_rank0``). Qwen's head is tied to its
    embeddings: the tie must survive, and the run must start from the one-rank weights."""
    qwen = [a.replace("+model=llama_tiny", "+model=qwen_tiny") for a in TINY]
    one, fsdp = tmp_path / "one", tmp_path / "fsdp"
    run(command(one, *qwen, *corpus, tiny=False))
    run(torchrun(command(fsdp, *qwen, *corpus, "trainer.parallelism=fsdp", tiny=False)))
    one_losses, fsdp_losses = train_losses(one), train_losses(fsdp)
    assert sorted(fsdp_losses) == list(range(1, 7))
    for step, loss in one_losses.items():
        assert fsdp_losses[step] == pytest.approx(loss, rel=1e-5)


def final_evaluation(run_dir: Path) -> dict:
    records = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r for r in records if "val_tokens" in r][-1]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    ("source", "layout", "ranks"), [("fsdp", "one", 1), ("one", "fsdp", 2), ("fsdp", "ddp", 2)]
)
def test_checkpoint_resumed_under_another_layout_continues_the_curve(
    tmp_path, curves, corpus, source, layout, ranks
):
    """A step-4 checkpoint carries over between world sizes and between FSDP2 and DDP: the
    resumed run makes the source run's steps 5-6."""
    step4 = curves[source] / "checkpoints" / "step_00000004"
    resumed = tmp_path / "resumed"
    cmd = command(resumed, *corpus, f"trainer.resume={step4}")
    if layout != "one":
        cmd = torchrun([*cmd, f"trainer.parallelism={layout}"])
    out = run(cmd)
    written_by = 1 if source == "one" else 2
    carried = f"checkpoint of {written_by} rank(s) resumed on {ranks}"
    assert (carried in out.stdout + out.stderr) == (written_by != ranks)
    losses, reference = train_losses(resumed), train_losses(curves[source])
    assert sorted(losses) == [5, 6]
    for step, loss in losses.items():
        assert loss == pytest.approx(reference[step], rel=1e-5)


def kill_with_its_ranks(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and its ranks, as a crashed node would lose them, and wait until they are
    gone. Each rank runs in a session of its own: killing torchrun's process group would leave
    the ranks training (and writing checkpoints beside the run that resumes)."""
    try:
        job = psutil.Process(proc.pid)
        processes = [*job.children(recursive=True), job]
    except psutil.NoSuchProcess:  # torchrun has ended, and its ranks before it
        processes = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(processes, timeout=60)
    proc.wait()


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_run_killed_and_resumed_equals_the_uninterrupted_run(tmp_path, curves, corpus):
    broken = tmp_path / "broken"
    cmd = torchrun(command(broken, *corpus, "trainer.parallelism=fsdp"))
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 300
        while not (broken / "checkpoints" / "step_00000004").exists() and proc.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
    finally:
        kill_with_its_ranks(proc)
    assert not (broken / "summary.json").exists(), "the run finished before it could be killed"
    for later in (broken / "checkpoints").glob("step_*"):  # as if killed right after step 4
        if later.name > "step_00000004":  # a fast run's step 6 would leave nothing to redo
            shutil.rmtree(later)
    resumed = run(cmd)
    assert "step_00000004 at step 4" in resumed.stdout + resumed.stderr
    losses, reference = train_losses(broken), train_losses(curves["fsdp"])
    assert sorted(losses) == list(range(1, 7))
    for step, loss in reference.items():
        assert losses[step] == pytest.approx(loss, rel=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
def test_gwt_mini_trains_under_fsdp_with_gate_and_up_by_rows(tmp_path, corpus):
    """llama_tiny's 172 x 64 gate/up on 2 ranks: FOAM's 32 columns a rank would cut GWT-Mini's
    pairs of 64 (it was refused); the trainer shards them by rows (86 a rank) and the run follows
    its DDP run's losses (2e-7 apart at most, measured)."""
    from foam.registry import shard_dims

    assert shard_dims("gwt_mini", {})((172, 64), 2) == 0
    steps = ("trainer.max_steps=3", "trainer.save_every=0", "trainer.eval_every=0")
    losses = {}
    for layout in ("ddp", "fsdp"):
        cmd = command(tmp_path / layout, *corpus[:3], *steps, f"trainer.parallelism={layout}")
        run(torchrun([*cmd[:2], "+optim=gwt_mini", *cmd[3:]]))
        losses[layout] = train_losses(tmp_path / layout)
    assert sorted(losses["fsdp"]) == [1, 2, 3]
    assert losses["fsdp"] == pytest.approx(losses["ddp"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
def test_refused_method_stops_the_run_before_any_step(tmp_path, corpus):
    cmd = torchrun(command(tmp_path / "run", *corpus, "trainer.parallelism=fsdp", optim=REFUSED))
    proc = run(cmd, expect_rc=1)  # torchrun reports the ranks' exit status 2 as 1
    assert "trainer.parallelism=fsdp: adamw8bit under FSDP2" in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(("precision", "dtype"), [("bf16", "bfloat16"), ("bf16_mixed", "float32")])
def test_fsdp_trains_in_bf16_with_checkpointing_and_accumulation(tmp_path, precision, dtype):
    """Pure bf16 keeps bf16 weights, bf16_mixed fp32 ones (computed in bf16 by FSDP2's policy);
    two micro-batches per rank and activation checkpointing on."""
    run_dir = tmp_path / "run"
    overrides = (
        f"trainer.precision={precision}",
        "trainer.grad_checkpointing=true",
        "trainer.global_batch_size=8",
        "trainer.micro_batch_size=2",
        "trainer.max_steps=3",
        "trainer.save_every=0",
        "trainer.eval_every=0",
        "trainer.parallelism=fsdp",
    )
    out = run(torchrun(command(run_dir, *overrides, optim="foam_mini")))
    assert "2 rank(s) x 2 micro-batch x 2 accumulation" in out.stdout + out.stderr
    losses = train_losses(run_dir)
    assert sorted(losses) == [1, 2, 3] and losses[3] < losses[1]
    assert f"params: {dtype}" in (run_dir / "pretrain.log").read_text()
    hf = json.loads((run_dir / "hf" / "config.json").read_text())
    assert hf.get("torch_dtype", hf.get("dtype")) == dtype


@pytest.mark.slow
@pytest.mark.distributed
def test_consolidated_fsdp_checkpoint_equals_the_exported_model(tmp_path, curves):
    """The 2-rank checkpoint's shards, consolidated in one process, are the model the run
    gathered and exported at its end."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    step6 = curves["fsdp"] / "checkpoints" / "step_00000006"
    out = tmp_path / "model.safetensors"
    script = [sys.executable, "scripts/consolidate_checkpoint.py", str(step6), str(out)]
    subprocess.run(script, cwd=REPO, env=ENV, check=True, capture_output=True, timeout=300)
    weights = load_file(out)
    exported = AutoModelForCausalLM.from_pretrained(curves["fsdp"] / "hf").state_dict()
    assert weights.keys() <= exported.keys() and len(weights) > 10
    for key, value in weights.items():
        assert torch.equal(value, exported[key]), key


# -- three ranks that do not divide the hidden size -------------------------------------------

UNEVEN = (
    "trainer.parallelism=fsdp",
    "trainer.global_batch_size=6",
    "trainer.micro_batch_size=1",
    "trainer.max_steps=1",
    "trainer.save_every=0",
    "trainer.eval_every=0",
)


def test_matrix_is_sharded_by_rows_when_the_ranks_do_not_divide_its_columns():
    """FSDP2 shards a dim > 0 only evenly, dim 0 any way."""
    assert shard_dim((172, 64), "larger", ranks=2) == 1  # fold along rows, shard the columns
    assert shard_dim((172, 64), "larger", ranks=3) == 0
    assert shard_dim((64, 172), "larger", ranks=3) == 0  # fold along the columns: rows anyway


@pytest.mark.parametrize(
    ("parallelism", "precision", "world_size", "expected"),
    [
        ("ddp", "bf16_mixed", 2, True),
        ("fsdp", "bf16_mixed", 2, False),  # MixedPrecisionPolicy casts instead
        ("fsdp", "bf16_mixed", 1, True),  # one rank trains the unwrapped model: it must autocast
        ("ddp", "bf16", 2, False),
        ("fsdp", "fp32", 1, False),
    ],
)
def test_bf16_mixed_autocasts_wherever_fsdp2_does_not_cast(
    parallelism, precision, world_size, expected
):
    assert uses_autocast(parallelism, precision, world_size) is expected


def pretend_gpu(monkeypatch, capability: tuple[int, int], triton: bool) -> None:
    """What ``compiles_layers`` asks of a CUDA machine, answered without one."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability)
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *rest: (
            (object() if triton else None) if name == "triton" else find_spec(name, *rest)
        ),
    )


@pytest.mark.parametrize(
    ("setting", "device", "expected"),
    [
        (None, "cuda", True),  # the default compiles where it pays (results/bench/train_compile_*)
        (None, "cpu", False),  # and not where it does not
        (True, "cpu", True),
        (False, "cuda", False),
    ],
)
def test_trainer_compile_null_compiles_on_a_gpu_only(setting, device, expected, monkeypatch):
    pretend_gpu(monkeypatch, (9, 0), triton=True)
    assert compiles_layers(setting, torch.device(device)) is expected


@pytest.mark.parametrize(("capability", "triton"), [((6, 1), True), ((9, 0), False)])
def test_trainer_compile_null_stays_eager_where_inductor_cannot_build(
    capability, triton, monkeypatch
):
    """A Pascal card, or no Triton: the default must not fail at the first forward."""
    pretend_gpu(monkeypatch, capability, triton)
    assert compiles_layers(None, torch.device("cuda")) is False
    assert compiles_layers(True, torch.device("cuda")) is True  # asked for: it tries


@pytest.fixture(scope="module")
def hidden_not_divisible_by_three() -> None:
    """llama_tiny's gate/up projections (172 x 64) fold along their 172 rows, so they would be
    sharded by their 64 columns, which FSDP2 refuses over 3 ranks (uneven on a dim > 0): they
    are sharded by rows instead, 58 per rank."""
    from models.config import load_model_config

    cfg = load_model_config("llama_tiny")
    assert cfg["hidden_size"] % 3 and cfg["intermediate_size"] > cfg["hidden_size"]


@pytest.mark.slow
@pytest.mark.distributed
def test_three_ranks_train_a_hidden_size_they_do_not_divide(
    tmp_path, hidden_not_divisible_by_three
):
    run_dir = tmp_path / "run"
    run(torchrun(command(run_dir, *UNEVEN, optim="adamw"), ranks=3))
    losses = train_losses(run_dir)
    assert sorted(losses) == [1] and math.isfinite(losses[1])


@pytest.mark.slow
@pytest.mark.distributed
def test_fold_that_straddles_three_row_shards_is_a_config_error(
    tmp_path, hidden_not_divisible_by_three
):
    """FOAM-2's blocks of 4 rows cannot align with 58 rows per rank: one line says so, naming the
    parameter's shape and what fits, before any step (not a raw torch error)."""
    proc = run(torchrun(command(tmp_path / "run", *UNEVEN, optim="foam2"), ranks=3), expect_rc=1)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors, proc.stderr[-4000:]
    assert errors[0].startswith("error: trainer.parallelism=fsdp: FOAM under FSDP2: ")
    assert "of shape (172, 64) folds blocks of 4 along its sharded dim 0" in errors[0]
    assert "2**level divides 58" in errors[0] and errors[0].endswith("trainer.parallelism=ddp")
    assert "NotImplementedError" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# -- FOAM-Mini whose one block spans the ranks, one of which holds none of it ------------------


def _mini_on_three_ranks(rank: int, init_file: str, results) -> None:
    """Two steps of FOAM-Mini on a 4 x 3 matrix sharded by rows over 3 ranks: torch's chunks
    give ranks 2, 2 and 0 rows, and the fold (along the 4 rows) averages across all of them."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import foam

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=3)
    mesh = init_device_mesh("cpu", (3,))
    weight, grads = mini_inputs()
    p = torch.nn.Parameter(distribute_tensor(weight, mesh, [Shard(0)]))
    optimizer = foam.FOAM([p], lr=1e-2, level="mini")
    for grad in grads:
        p.grad = distribute_tensor(grad, mesh, [Shard(0)])
        optimizer.step()
    full = p.detach().full_tensor()
    if rank == 0:
        results["sharded"] = full
    shutdown()


def mini_inputs() -> tuple[torch.Tensor, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(4, 3, generator=generator)
    return weight, [torch.randn(4, 3, generator=generator) for _ in range(2)]


@pytest.mark.slow
@pytest.mark.distributed
def test_foam_mini_across_ranks_steps_a_rank_with_an_empty_shard(tmp_path):
    """The rank without rows still joins the block mean's all-reduce (a rank that skipped its
    empty shard would leave the other ranks waiting), and the result is the unsharded step's."""
    import foam

    results = mp.Manager().dict()
    context = mp.spawn(
        _mini_on_three_ranks, args=(str(tmp_path / "init"), results), nprocs=3, join=False
    )
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the ranks did not finish within 120 s (a rank left the all-reduce)")
    weight, grads = mini_inputs()
    p = torch.nn.Parameter(weight)
    optimizer = foam.FOAM([p], lr=1e-2, level="mini")
    for grad in grads:
        p.grad = grad
        optimizer.step()
    torch.testing.assert_close(results["sharded"], p.detach(), rtol=1e-6, atol=1e-7)


# -- the fused FOAM step on each rank's shard ---------------------------------------------------

# (shape, sharded dim, group): folded along the unsharded dim (columns, then rows), along the
# sharded dim in blocks that fit a rank's rows, a matrix of which rank 1 holds no row, and
# FOAM-Mini along the unsharded dim and along the sharded one (a block mean over the ranks).
SHARDED_MATRICES = [
    ((8, 16), 0, "matrices"),
    ((16, 8), 1, "matrices"),
    ((16, 8), 0, "matrices"),
    ((1, 12), 0, "matrices"),
    ((6, 16), 0, "mini"),
    ((12, 4), 0, "mini"),
]


def sharded_inputs() -> list[tuple[torch.Tensor, list[torch.Tensor]]]:
    """Each matrix's start and three gradients."""
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(shape, generator=generator),
            [torch.randn(shape, generator=generator) for _ in range(3)],
        )
        for shape, _, _ in SHARDED_MATRICES
    ]


def _fused_on_two_ranks(rank: int, init_file: str, results) -> None:
    """Three steps of FOAM-2 and FOAM-Mini on ``SHARDED_MATRICES`` over 2 ranks, fused (the
    default) and eager: the whole parameters and moments of each, and what ran."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import foam

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    inputs = sharded_inputs()
    for implementation in ("auto", "eager"):
        params = [
            torch.nn.Parameter(distribute_tensor(weight, mesh, [Shard(dim)]))
            for (weight, _), (_, dim, _) in zip(inputs, SHARDED_MATRICES, strict=True)
        ]
        named = list(zip(params, (name for *_, name in SHARDED_MATRICES), strict=True))
        groups = [
            {"params": [p for p, of in named if of == name], "name": name, "level": level}
            for name, level in (("matrices", 2), ("mini", "mini"))
        ]
        optimizer = foam.FOAM(groups, lr=1e-2, weight_decay=0.1, implementation=implementation)
        for step in range(3):
            for p, (_, grads), (_, dim, _) in zip(params, inputs, SHARDED_MATRICES, strict=True):
                p.grad = distribute_tensor(grads[step], mesh, [Shard(dim)])
            optimizer.step()
        keys = ("exp_avg", "exp_avg_sq")
        whole = [
            [p.detach().full_tensor(), *(optimizer.state[p][k].full_tensor() for k in keys)]
            for p in params
        ]
        if rank == 0:
            results[implementation] = (whole, foam.steps_run(optimizer))
    shutdown()


@pytest.mark.slow
@pytest.mark.distributed
def test_each_rank_steps_its_shards_with_the_fused_kernel_as_the_eager_step(tmp_path):
    """Under FSDP2 each rank's shard of a matrix goes through the fused CPU kernel, folded along
    the axis the shard keeps whole (or in blocks that fit the shard), and ends where the eager
    sharded step ends; only FOAM-Mini along the sharded dim, whose block mean is all-reduced,
    stays eager. ``foam_steps`` says so."""
    from tests.helpers.agreement import assert_agree

    results = mp.Manager().dict()
    context = mp.spawn(
        _fused_on_two_ranks, args=(str(tmp_path / "init"), results), nprocs=2, join=False
    )
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the ranks did not finish within 120 s")
    (fused, fused_ran), (eager, eager_ran) = results["auto"], results["eager"]
    assert fused_ran == {"matrices": "cpp", "mini": "cpp+eager"}
    assert eager_ran == {"matrices": "eager", "mini": "eager"}
    for actual, expected in zip(fused, eager, strict=True):
        for a, e in zip(actual, expected, strict=True):
            assert_agree(a, e, torch.float32)
