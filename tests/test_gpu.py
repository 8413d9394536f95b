"""The CUDA paths, checked on the first machine that has a GPU (skipped everywhere else).

    python -m pytest -q -m gpu tests/test_gpu.py      # or: make test-gpu

What CPU runs cannot reach: every optimizer (fused AdamW, Triton/CUDA kernels, bitsandbytes)
stepping bf16 weights on the GPU, the Triton probe passing and the fused FOAM step matching the
eager one at LLaMA-350M's matrix shapes (also replayed from a CUDA graph under an lr schedule),
a warm optimizer step and a training step that never wait for the GPU (the real tiny LLaMA's
forward and backward over padded and packed batches included), the padded batches on the flash
kernel, the compiled loss, bf16 autocast, the weights being those of a CPU build, peak memory
per phase, compiled decoder layers (trainer.compile's default there), and NCCL DDP with
bucket-view gradients when two GPUs are present.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import foam
import models
from foam import fused
from foam.folding import make_plan
from foam.update import StepScalars, bias_corrections
from tests.helpers.agreement import assert_agree
from tests.helpers.optim import TINY_LLAMA, build, tiny_llama
from train.distributed import wrap_ddp
from train.metrics import PhasePeaks
from train.parallelism import compile_decoder_layers
from train.step import (
    accumulate_gradients,
    forward_loss_sum,
    grad_norm_and_clip,
    loss_sum_for,
    to_device,
)
from train.step_stats import StepStats

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda", 0)


def micro_batches(n: int = 2, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Host-side batches, as the data loader yields them."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 16), generator=gen)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids})
    return out


@pytest.mark.parametrize("name", sorted(foam.available_optimizers()))
def test_every_optimizer_steps_bf16_weights_on_the_gpu(name: str) -> None:
    if name in {"adamw8bit", "foam8bit", "galore8bit"}:
        pytest.importorskip("bitsandbytes")
    model = tiny_llama(torch.bfloat16).to(CUDA)
    optimizer = build(name, model, lr=1e-2)
    start = [p.detach().clone() for p in model.parameters()]
    for seed in range(2):
        accumulate_gradients(
            model,
            micro_batches(seed=seed),
            device=CUDA,
            world_size=1,
            autocast=contextlib.nullcontext,
        )
        optimizer.step()
        optimizer.zero_grad()
    torch.cuda.synchronize()
    assert all(p.isfinite().all() for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(start, model.parameters(), strict=True))
    assert foam.state_bytes(optimizer) > 0


def test_the_triton_kernel_probe_passes_on_this_gpu() -> None:
    """Otherwise every FOAM run here takes the eager step, and benchmarks measure that."""
    assert fused.kernel_available("cuda")


LLAMA_350M_MATRICES = [(1024, 1024), (2736, 1024), (1024, 2736)]
"""q/k/v/o, gate/up and down projections of LLaMA-350M (hidden 1024, intermediate 2736)."""


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("level", [2, 3, "mini"])
def test_fused_foam_matches_eager_at_llama_350m_shapes(level, dtype) -> None:
    """The Triton step against the eager reference, three steps, weights and both states."""
    generator = torch.Generator(device=CUDA).manual_seed(0)
    starts = [torch.randn(s, device=CUDA, generator=generator) * 0.02 for s in LLAMA_350M_MATRICES]
    grads = [
        [torch.randn(s, device=CUDA, generator=generator) * 1e-3 for s in LLAMA_350M_MATRICES]
        for _ in range(3)
    ]
    stepped = {}
    for implementation in ("eager", "fused"):
        params = [torch.nn.Parameter(start.to(dtype)) for start in starts]
        optimizer = foam.FOAM(params, lr=1e-3, level=level, implementation=implementation)
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g.to(dtype)
            optimizer.step()
        stepped[implementation] = [
            (p.detach(), optimizer.state[p]["exp_avg"], optimizer.state[p]["exp_avg_sq"])
            for p in params
        ]
    for got, expected in zip(stepped["fused"], stepped["eager"], strict=True):
        for a, e in zip(got, expected, strict=True):
            assert a.dtype == e.dtype
            assert_agree(a, e, dtype)


def test_the_fused_step_replays_from_a_cuda_graph_under_an_lr_schedule() -> None:
    """The step's launch captured once in a CUDA graph, then replayed after each step's scalars
    are written (bias corrections, a changing lr), gives the eager step's weights and states:
    nothing that changes between steps is frozen into the graph (foam/triton_kernels.py)."""
    from foam.triton_kernels import TritonGroup, _foam_step_kernel

    schedule, dtype = (1e-3, 2e-3, 5e-4, 1e-4), torch.bfloat16
    generator = torch.Generator(device=CUDA).manual_seed(0)
    starts = [torch.randn(s, device=CUDA, generator=generator) * 0.02 for s in LLAMA_350M_MATRICES]
    grads = [
        [
            torch.randn(s, device=CUDA, generator=generator).to(dtype) * 1e-3
            for s in LLAMA_350M_MATRICES
        ]
        for _ in schedule
    ]
    params = [torch.nn.Parameter(start.to(dtype)) for start in starts]
    eager = foam.FOAM(params, lr=schedule[0], level=2, weight_decay=0.1, implementation="eager")
    group = eager.param_groups[0]
    plans = [make_plan(p.shape, 2, group["fold_axis"]) for p in params]

    def kernel_group(weights: list[torch.Tensor]) -> tuple[TritonGroup, list[torch.Tensor]]:
        states = [
            torch.zeros(plan.folded_shape, device=CUDA, dtype=dtype) for plan in plans for _ in "mv"
        ]
        return TritonGroup(weights, states[::2], states[1::2], plans), states

    def write(kernel: TritonGroup, t: int) -> None:
        bc1, bc2, _ = bias_corrections(group["bias_correction"], group["betas"], t)
        kernel.write_scalars((bc1, bc2), StepScalars.of_group(group))

    buffers = [torch.zeros_like(g) for g in grads[0]]
    scratch, _ = kernel_group([start.to(dtype) for start in starts])
    scratch.step(buffers, (1.0, 1.0), StepScalars.of_group(group))  # compiles, outside capture
    weights = [start.to(dtype) for start in starts]
    kernel, states = kernel_group(weights)
    grid, args, constants = kernel.launch(buffers, mean_of_squares=False)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _foam_step_kernel[grid](*args, **constants)
    for t, (lr, step_grads) in enumerate(zip(schedule, grads, strict=True), start=1):
        group["lr"] = lr
        for p, buffer, g in zip(params, buffers, step_grads, strict=True):
            p.grad = g.clone()
            buffer.copy_(g)
        eager.step()
        write(kernel, t)
        graph.replay()
    for k, p in enumerate(params):
        state = eager.state[p]
        assert_agree(weights[k], p.detach(), dtype)
        assert_agree(states[2 * k], state["exp_avg"], dtype)
        assert_agree(states[2 * k + 1], state["exp_avg_sq"], dtype)


@pytest.mark.parametrize("name", ["foam", "foam_mini", "adamw"])
def test_a_warm_optimizer_step_never_waits_for_the_gpu(name: str) -> None:
    """After the first step (states allocated, kernels built), a step only queues work: CUDA's
    sync debug mode raises on any host sync."""
    model = tiny_llama(torch.bfloat16).to(CUDA)
    optimizer = build(name, model, lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        optimizer.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_bf16_autocast_keeps_fp32_weights_and_an_fp32_loss() -> None:
    model = tiny_llama().to(CUDA)

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast("cuda", dtype=torch.bfloat16)

    batch = {k: v.to(CUDA) for k, v in micro_batches(1)[0].items()}
    with autocast():
        logits = model(input_ids=batch["input_ids"]).logits
    assert logits.dtype == torch.bfloat16
    loss = forward_loss_sum(model, batch, autocast)
    assert loss.dtype == torch.float32 and loss.isfinite()
    accumulate_gradients(model, micro_batches(), device=CUDA, world_size=1, autocast=autocast)
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


class DenseLM(torch.nn.Module):
    """A language model of dense ops only (no embedding lookup, whose CUDA backward may sync),
    so that a sync caught below is the trainer's own."""

    def __init__(self, seq_len: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.hidden = torch.nn.Parameter(torch.randn(seq_len, hidden))
        self.head = torch.nn.Linear(hidden, TINY_LLAMA["vocab_size"])

    def forward(self, input_ids: torch.Tensor, attention_mask=None) -> SimpleNamespace:
        return SimpleNamespace(logits=self.head(self.hidden.expand(input_ids.shape[0], -1, -1)))


@pytest.mark.parametrize("max_norm", [0.0, 1.0])
def test_the_training_step_never_waits_for_the_gpu(max_norm: float) -> None:
    """The trainer's part of a step (moving the batches, the token counts, the loss, the
    gradient norm and clipping, the step's bookkeeping) queues work without one host sync:
    CUDA's sync debug mode raises on any. The stats' read is the interval's one sync."""
    model = DenseLM().to(CUDA)
    params = list(model.parameters())
    stats = StepStats(CUDA)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in (1, 2):
            result = accumulate_gradients(
                model, micro_batches(), device=CUDA, world_size=1, autocast=contextlib.nullcontext
            )
            stats.add(step, result, grad_norm_and_clip(params, max_norm))
            model.zero_grad(set_to_none=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    interval = stats.read()
    assert interval.steps == 2 and interval.grad_norm > 0 and interval.tokens == 2 * 2 * 2 * 16


def paper_batches(packed: bool, n: int = 2) -> list[dict[str, torch.Tensor]]:
    """Host-side batches as ``data.pack=false`` makes them (right-padded documents of
    different lengths) or as packing does (no padding)."""
    out = []
    for batch in micro_batches(n):
        if not packed:
            batch["attention_mask"][0, 5:] = 0  # one short document, padded on the right
            batch["input_ids"][0, 5:] = 0
            batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        out.append(batch)
    return out


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_a_tiny_llama_training_step_never_waits_for_the_gpu(packed: bool) -> None:
    """The real model's forward and backward (transformers' mask code, SDPA, the embedding, the
    chunked loss) over the paper's padded batches and packed ones, after a warm-up step: no host
    sync, which CUDA's sync debug mode turns into an error."""
    model = tiny_llama(torch.bfloat16).to(CUDA)
    batches = paper_batches(packed)

    def step() -> None:
        accumulate_gradients(
            model, batches, device=CUDA, world_size=1, autocast=contextlib.nullcontext
        )

    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_padded_batches_run_on_the_flash_kernel() -> None:
    """A right-padded batch reaches SDPA without a mask, causal: the flash kernel alone (any
    other backend disabled) runs it, and counts the same loss as the masked math kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = tiny_llama(torch.bfloat16).to(CUDA)
    (batch,) = paper_batches(packed=False, n=1)
    with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        flash = forward_loss_sum(model, to_device(batch, CUDA), contextlib.nullcontext)
    masked = {k: v.to(CUDA) for k, v in batch.items()}
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        math = forward_loss_sum(model, masked, contextlib.nullcontext)
    torch.testing.assert_close(flash, math, rtol=2e-2, atol=0)


def test_the_compiled_loss_gives_the_eager_loss_and_gradient() -> None:
    """``trainer.compile``'s loss (inductor's kernels for the chunked cross-entropy) against the
    eager one on bf16 logits of a 32,000-token vocabulary, in several chunks."""
    generator = torch.Generator(device=CUDA).manual_seed(0)
    logits = torch.randn(4, 64, 32000, device=CUDA, generator=generator).to(torch.bfloat16)
    labels = torch.randint(0, 32000, (4, 64), device=CUDA, generator=generator)
    labels[0, 40:] = -100
    results = []
    for loss_sum in (loss_sum_for(False), loss_sum_for(True)):
        leaf = logits.clone().requires_grad_()
        loss = loss_sum(leaf, labels, chunk_rows=100)
        loss.backward()
        results.append((loss.detach(), leaf.grad))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=0)
    torch.testing.assert_close(results[1][1], results[0][1])


def test_compiled_decoder_layers_give_the_eager_loss_and_gradients() -> None:
    """``trainer.compile``'s default on a GPU: inductor's kernels for each decoder layer compute
    the eager layers' loss and gradients (fp32, so only the order of sums differs)."""
    eager, compiled = tiny_llama().to(CUDA), tiny_llama().to(CUDA)
    compile_decoder_layers(compiled)
    losses = [
        accumulate_gradients(
            m, micro_batches(), device=CUDA, world_size=1, autocast=contextlib.nullcontext
        ).loss
        for m in (eager, compiled)
    ]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
    for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-5)


def test_build_on_the_gpu_gives_the_cpu_weights() -> None:
    cfg = models.load_model_config("llama_tiny")
    torch.manual_seed(3)
    on_cpu = models.build_model(cfg, dtype=torch.bfloat16)
    torch.manual_seed(3)
    on_gpu = models.build_model(cfg, device=CUDA, dtype=torch.bfloat16)
    for (name, a), b in zip(on_cpu.state_dict().items(), on_gpu.state_dict().values(), strict=True):
        assert torch.equal(a, b.cpu()), name


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_the_fused_foam_step_runs_on_the_parameters_gpu_not_the_current_one() -> None:
    """A library user's model on cuda:1 while cuda:0 is current (the trainer sets the device)."""
    second = torch.device("cuda", 1)
    torch.manual_seed(0)
    start, grad = torch.randn(64, 32), torch.randn(64, 32)
    stepped = {}
    for implementation in ("eager", "fused"):
        p = torch.nn.Parameter(start.to(second))
        p.grad = grad.to(second)
        with torch.cuda.device(0):
            foam.FOAM([p], lr=1e-2, implementation=implementation).step()
        stepped[implementation] = p.detach().cpu()
    torch.testing.assert_close(stepped["fused"], stepped["eager"], rtol=1e-6, atol=1e-7)


def test_train_peak_excludes_setup_and_eval() -> None:
    # Earlier tests in this process may leave tensors alive (caches, fixtures): the peaks are
    # absolute, so they are read against what is allocated before the phases begin.
    before = torch.cuda.memory_allocated(CUDA)
    peaks = PhasePeaks(CUDA)
    setup = torch.empty(256 * 2**20, dtype=torch.uint8, device=CUDA)
    del setup
    peaks.enter("train")
    train = torch.empty(16 * 2**20, dtype=torch.uint8, device=CUDA)
    peaks.enter("eval")
    evaluation = torch.empty(128 * 2**20, dtype=torch.uint8, device=CUDA)
    del evaluation
    peaks.enter("train")
    record = peaks.record()
    del train
    by_phase = record["peak_memory_by_phase"]
    assert 16 * 2**20 <= record["peak_memory_bytes"] - before < 64 * 2**20
    assert by_phase["setup"]["peak_memory_bytes"] - before >= 256 * 2**20
    assert by_phase["eval"]["peak_memory_bytes"] - before >= 128 * 2**20
    assert record["peak_memory_reserved_bytes"] >= record["peak_memory_bytes"]


def _nccl_worker(rank: int, store: str, out: dict) -> None:
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", init_method=store, rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    try:
        model = tiny_llama(torch.bfloat16).to(device)
        ddp = wrap_ddp(model, device)
        batches = micro_batches(4)[rank::2]  # this rank's half of the global batch
        for _ in range(2):  # the second step accumulates into the bucket views
            model.zero_grad(set_to_none=False)
            accumulate_gradients(
                ddp, batches, device=device, world_size=2, autocast=contextlib.nullcontext
            )
        if rank == 0:
            out["grads"] = [p.grad.float().cpu() for p in model.parameters()]
            out["views"] = all(p.grad._is_view() for p in model.parameters())
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_nccl_ddp_equals_one_gpu_with_the_same_global_batch(tmp_path) -> None:
    single = tiny_llama(torch.bfloat16).to(CUDA)
    accumulate_gradients(
        single, micro_batches(4), device=CUDA, world_size=1, autocast=contextlib.nullcontext
    )
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_nccl_worker, args=(f"file://{tmp_path / 'store'}", out), nprocs=2, join=True)
        grads, views = out["grads"], out["views"]
    assert views
    for p, g in zip(single.parameters(), grads, strict=True):
        torch.testing.assert_close(p.grad.float().cpu(), g, rtol=2e-2, atol=1e-4)  # bf16 sums
