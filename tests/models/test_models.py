"""models/: configs, builders, parameter and FLOP counts (CPU, tiny models only run)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

import foam
import models
from models.config import validate_model_config
from models.families import FAMILIES

PAPER_SIZES = (
    "llama_60m",
    "llama_130m",
    "llama_350m",
    "llama_1b",
    "llama_3b",
    "llama_7b",
    "qwen_60m",
    "qwen_130m",
    "qwen_350m",
)
DEBUG_SIZES = ("llama_tiny", "qwen_tiny")
OTHER_FAMILIES = ("gpt2_tiny", "deberta_tiny", "gpt2_base", "deberta_base")
"""GPT-2 (Conv1D linear layers) and DeBERTa (an encoder, masked LM): the appendix's models."""

# Qwen above 350M (not in the paper): Qwen2.5-1.5B / 3B / 7B's published shapes, restated here as
# hidden, intermediate, layers, heads, kv heads, tied embeddings; vocabulary the protocol's 32000.
QWEN2_PUBLISHED_SHAPES = {
    "qwen_1b": (1536, 8960, 28, 12, 2, True),
    "qwen_3b": (2048, 11008, 36, 16, 2, True),
    "qwen_7b": (3584, 18944, 28, 28, 4, False),
}

# Total parameters in millions, benchmark_protocol.md section 13 (rounded to 0.1M).
PROTOCOL_TOTAL_M = {
    "llama_60m": 58.1,
    "llama_130m": 134.1,
    "llama_350m": 368.0,
    "llama_1b": 1339.1,
    "llama_3b": 2685.8,
    "llama_7b": 6738.4,
    "qwen_60m": 60.3,
    "qwen_130m": 134.7,
    "qwen_350m": 360.0,
}

# hidden, intermediate, layers, heads, kv heads: the protocol's tables, restated independently.
PROTOCOL_SHAPES = {
    "llama_60m": (512, 1376, 8, 8, 8),
    "llama_130m": (768, 2048, 12, 12, 12),
    "llama_350m": (1024, 2736, 24, 16, 16),
    "llama_1b": (2048, 5461, 24, 32, 32),
    "llama_3b": (2560, 6848, 32, 32, 32),
    "llama_7b": (4096, 11008, 32, 32, 32),
    "qwen_60m": (576, 1536, 12, 8, 2),
    "qwen_130m": (768, 2816, 14, 12, 2),
    "qwen_350m": (1024, 3328, 26, 16, 2),
}


def expected_counts(cfg: dict) -> tuple[int, int, int]:
    """(total, folded, other) from the shapes alone, written out rather than taken from the model."""
    h, i, n_layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    vocab = cfg["vocab_size"]
    folded = n_layers * (h * h + 2 * h * kv + h * h + 3 * h * i)  # q, k, v, o, gate, up, down
    embeddings = vocab * h * (1 if cfg["tie_word_embeddings"] else 2)
    norms = (2 * n_layers + 1) * h
    biases = n_layers * (h + 2 * kv) if cfg["family"] == "qwen" else 0  # Qwen2 q/k/v biases
    other = embeddings + norms + biases
    return folded + other, folded, other


@pytest.mark.parametrize("name", PAPER_SIZES + DEBUG_SIZES + tuple(QWEN2_PUBLISHED_SHAPES))
def test_builds_on_meta_with_counts_from_shapes(name: str) -> None:
    cfg = models.load_model_config(name)
    model = models.build_model(cfg, device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    counts = models.count_params(model)
    assert (counts.total, counts.folded, counts.other) == expected_counts(cfg)
    assert counts.total == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(QWEN2_PUBLISHED_SHAPES))
def test_large_qwen_sizes_have_qwen2_published_shapes(name: str) -> None:
    cfg = models.load_model_config(name)
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    shape = (*(cfg[k] for k in keys), cfg["num_key_value_heads"], cfg["tie_word_embeddings"])
    assert shape == QWEN2_PUBLISHED_SHAPES[name]
    assert (cfg["family"], cfg["vocab_size"], cfg["rope_theta"]) == ("qwen", 32000, 1e6)


@pytest.mark.parametrize("name", PAPER_SIZES)
def test_protocol_shapes_and_totals(name: str) -> None:
    cfg = models.load_model_config(name)
    shape = tuple(
        cfg[k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
        )
    )
    assert shape == PROTOCOL_SHAPES[name]
    assert round(expected_counts(cfg)[0] / 1e6, 1) == PROTOCOL_TOTAL_M[name]
    config = models.hf_config(cfg)
    assert config.vocab_size == 32000
    assert config.initializer_range == 0.02
    qwen = name.startswith("qwen")
    assert config.tie_word_embeddings is qwen
    assert config.rope_parameters["rope_theta"] == (1e6 if qwen else 1e4)
    assert type(config).__name__ == ("Qwen2Config" if qwen else "LlamaConfig")


@pytest.mark.parametrize("name", DEBUG_SIZES + OTHER_FAMILIES)
def test_counts_agree_with_the_optimizers_split(name: str) -> None:
    model = models.build_model(models.load_model_config(name), device="meta")
    split = foam.split_params(model)
    counts = models.count_params(model)
    assert counts.folded == sum(p.numel() for _, p in split.matrices)
    assert counts.other == sum(p.numel() for _, p in split.others)


def test_gpt2_base_is_gpt2s_124m_on_the_t5_vocabulary() -> None:
    """GPT-2-base has 124,439,808 parameters with its 50257 ids; here 32000, the embedding's
    (50257 - 32000) x 768 fewer. Its attention and MLP are Conv1D modules: the split finds them."""
    cfg = models.load_model_config("gpt2_base")
    model = models.build_model(cfg, device="meta")
    assert models.count_params(model).total == 124_439_808 - (50257 - 32000) * 768
    split = dict(foam.split_params(model).matrices)
    assert tuple(split["transformer.h.0.attn.c_attn.weight"].shape) == (768, 3 * 768)
    assert len(split) == 12 * 4  # c_attn, attn c_proj, c_fc, mlp c_proj
    assert models.matmul_params(cfg) == 12 * (4 * 768**2 + 2 * 768 * 3072) + 32000 * 768


def test_deberta_base_is_relative_attention_with_a_mask_row() -> None:
    cfg = models.load_model_config("deberta_base")
    config = models.hf_config(cfg)
    assert type(config).__name__ == "DebertaConfig" and models.is_masked_lm(cfg)
    assert config.relative_attention and config.pos_att_type == ["c2p", "p2c"]
    assert not config.position_biased_input and cfg["mask_token_id"] == 32000 == 32001 - 1
    assert not models.is_masked_lm(models.load_model_config("gpt2_base"))


@pytest.mark.parametrize(
    ("name", "auto"),
    [("gpt2_tiny", "AutoModelForCausalLM"), ("deberta_tiny", "AutoModelForMaskedLM")],
)
def test_other_families_save_and_load(name: str, auto: str, tmp_path: Path) -> None:
    import transformers

    torch.manual_seed(0)
    model = models.build_model(models.load_model_config(name)).eval()
    model.save_pretrained(tmp_path)
    loaded = getattr(transformers, auto).from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    ids = torch.randint(2, 32000, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, loaded(input_ids=ids).logits)


def test_llama_60m_matches_the_papers_split() -> None:
    """Appendix 'Memory Estimation': ~58M params, 25.3M under FOAM, 32.77M under Adam."""
    counts = models.count_params(
        models.build_model(models.load_model_config("llama_60m"), device="meta")
    )
    assert round(counts.total / 1e6, 1) == 58.1
    assert round(counts.folded / 1e6, 1) == 25.3
    assert int(counts.other / 1e4) / 100 == 32.77  # 32.776704M, printed truncated
    assert int(counts.total * 2 / 1e4) / 100 == 116.14  # "116.14 MBytes" (116.1472, truncated)


def test_1b_is_24_layers_of_32_heads() -> None:
    cfg = models.load_model_config("llama_1b")
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"]) == (24, 32)


def test_unknown_config_lists_available_names() -> None:
    with pytest.raises(ValueError, match=r"llama_60m.*qwen_tiny|available"):
        models.load_model_config("llama_42m")
    assert set(PAPER_SIZES + DEBUG_SIZES) <= set(models.available_models())


def test_typo_in_a_config_key_is_an_error() -> None:
    cfg = dict(models.load_model_config("llama_tiny"), num_kv_heads=2)
    with pytest.raises(ValueError, match="num_kv_heads"):
        models.build_model(cfg, device="meta")
    bad = dict(models.load_model_config("llama_tiny"))
    del bad["rope_theta"]
    with pytest.raises(ValueError, match="rope_theta"):
        models.build_model(bad, device="meta")


def test_every_yaml_is_a_model_package_file() -> None:
    for path in Path(models.CONFIG_DIR).glob("*.yaml"):
        assert path.read_text().splitlines()[0] == "# @package model", path.name
        assert models.load_model_config(path.stem)["name"] == path.stem


def test_hydra_plus_model_lands_under_cfg_model() -> None:
    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(models.CONFIG_DIR.parent), version_base=None):
        cfg = compose(overrides=["+model=qwen_tiny"])
    assert cfg.model.num_key_value_heads == 2
    model = models.build_model(cfg.model, device="meta")  # a DictConfig is accepted as is
    assert type(model).__name__ == "Qwen2ForCausalLM"


def test_dtype_and_init() -> None:
    torch.manual_seed(0)
    model = models.build_model(models.load_model_config("llama_tiny"), dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    model = models.build_model(models.load_model_config("llama_tiny"))
    layer = model.model.layers[0]
    for weight in (layer.self_attn.q_proj.weight, layer.mlp.down_proj.weight, model.lm_head.weight):
        assert weight.std().item() == pytest.approx(0.02, rel=0.05)
        assert weight.mean().abs().item() < 2e-3
    assert torch.equal(layer.input_layernorm.weight, torch.ones(64))


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers (RoPE's are not in the state dict), by name."""
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["llama_tiny", "qwen_tiny"])
def test_a_model_allocated_for_loading_has_the_built_buffers_and_draws_nothing(name, dtype):
    """A resumed FSDP run loads every weight from its checkpoint; the rotary frequencies, which
    no checkpoint holds, must be the ones construction computes, and no random draw may be
    spent on weights the checkpoint overwrites."""
    cfg = models.load_model_config(name)
    built = dict(models.build_model(cfg, dtype=dtype).named_buffers())
    meta = models.build_model(cfg, device="meta", dtype=dtype)
    generator = torch.get_rng_state()
    allocated = models.allocate_for_loading(meta)
    assert torch.equal(torch.get_rng_state(), generator)
    buffers = dict(allocated.named_buffers())
    assert buffers.keys() == built.keys() and built
    for name, expected in built.items():
        assert buffers[name].dtype == expected.dtype and torch.equal(buffers[name], expected), name
    assert not any(p.is_meta for p in allocated.parameters())


@pytest.mark.parametrize("name", ["llama_60m", "qwen_tiny"])  # untied and tied embeddings
def test_every_build_path_gives_the_reference_weights_for_a_seed(name: str) -> None:
    """The reference scripts' init (transformers' plain construction on the CPU after
    torch.manual_seed) is what build_model gives, and what a meta model materialises to."""
    cfg = models.load_model_config(name)
    family_cls = type(models.build_model(cfg, device="meta"))
    torch.manual_seed(7)
    reference = _tensors(family_cls(models.hf_config(cfg)))
    torch.manual_seed(7)
    built = _tensors(models.build_model(cfg))
    meta = models.build_model(cfg, device="meta", dtype=torch.bfloat16)
    assert all(t.is_meta for t in _tensors(meta).values())
    torch.manual_seed(7)
    materialised = _tensors(models.materialize(meta, dtype=torch.bfloat16))
    assert built.keys() == reference.keys() == materialised.keys()
    for key, expected in reference.items():
        assert torch.equal(built[key], expected), key
        assert torch.equal(materialised[key], expected.to(materialised[key].dtype)), key
    torch.manual_seed(8)
    other = _tensors(models.build_model(cfg))
    key = "model.embed_tokens.weight"
    assert not torch.equal(other[key], built[key])


def _batch(vocab: int = 32000, b: int = 2, t: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, vocab, (b, t), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


@pytest.mark.parametrize("name", DEBUG_SIZES)
def test_tiny_forward_backward(name: str) -> None:
    torch.manual_seed(0)
    model = models.build_model(models.load_model_config(name))
    out = model(**_batch())
    assert out.logits.shape == (2, 16, 32000)
    assert torch.isfinite(out.loss) and out.loss.item() == pytest.approx(
        10.37, abs=0.3
    )  # ~ln 32000
    out.loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", DEBUG_SIZES)
def test_save_and_load_round_trip(name: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = models.build_model(models.load_model_config(name)).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    for (n, a), (m, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert n == m and torch.equal(a, b), n
    batch = _batch()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, loaded(**batch).logits)


@pytest.mark.parametrize("name", DEBUG_SIZES)
def test_gradient_checkpointing_leaves_gradients_unchanged(name: str) -> None:
    torch.manual_seed(0)
    model = models.build_model(models.load_model_config(name)).train()
    batch = _batch()

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    calls = []
    mlp = model.model.layers[0].mlp
    forward = mlp.forward  # counted by wrapping: module hooks do not fire during the recompute
    mlp.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    models.enable_gradient_checkpointing(model)
    checkpointed = grads()
    assert len(calls) == 2  # the layer really was recomputed in the backward
    for n, g in plain.items():
        torch.testing.assert_close(checkpointed[n], g, rtol=0, atol=1e-6, msg=n)


def test_flops_per_token() -> None:
    cfg = models.load_model_config("llama_60m")
    matmul = 25_296_896 + 32000 * 512  # block matrices + lm_head (the embedding is a lookup)
    assert models.matmul_params(cfg) == matmul
    assert models.flops_per_token(cfg, 256) == 6 * matmul + 12 * 8 * 512 * 256
    qwen = models.load_model_config("qwen_60m")  # tied head still costs one matmul; GQA k/v
    assert (
        models.matmul_params(qwen)
        == 12 * (2 * 576 * 576 + 2 * 576 * 144 + 3 * 576 * 1536) + 32000 * 576
    )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_family_record_names_a_matching_transformers_pair(family):
    """``models/families.py`` is the one home of a family: its classes exist and belong together."""
    record = FAMILIES[family]
    config_cls = getattr(transformers, record.config_class)
    assert getattr(transformers, record.model_class).config_class is config_cls
    assert set(record.renamed.values()) <= set(vars(config_cls()).keys())


def test_an_unknown_family_is_one_line():
    with pytest.raises(ValueError, match=r"model family must be one of \('llama'"):
        validate_model_config({"family": "mamba"})
