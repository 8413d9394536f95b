"""The paper's parameter split and ``build_optimizer`` on real transformers models."""

import pytest
import torch
from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM

import foam
from foam import FOAM, build_optimizer, split_params
from foam.param_groups import check_covers
from tests.helpers.optim import TINY_LLAMA, random_grads, step_with, tiny_llama


@pytest.fixture(scope="module")
def llama():
    return tiny_llama(seed=None)


@pytest.fixture(scope="module")
def qwen():
    config = {**TINY_LLAMA, "num_key_value_heads": 2}
    return Qwen2ForCausalLM(Qwen2Config(tie_word_embeddings=True, **config))


def matrix_suffixes(split):
    return sorted({name.split(".")[-2] for name, _ in split.matrices})


def test_llama_split_is_attention_and_mlp_matrices(llama):
    split = split_params(llama)
    assert matrix_suffixes(split) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    assert len(split.matrices) == 7 * 2
    others = {name for name, _ in split.others}
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} <= others
    assert all(p.dim() == 1 for name, p in split.others if "norm" in name)
    assert len(split.matrices) + len(split.others) == len(list(llama.parameters()))


def test_qwen_split_keeps_tied_embedding_and_biases_out(qwen):
    split = split_params(qwen)
    assert len(split.matrices) == 7 * 2
    others = {name for name, _ in split.others}
    assert "model.embed_tokens.weight" in others and "lm_head.weight" not in others  # tied
    assert any(name.endswith("q_proj.bias") for name in others)


def test_split_rejects_a_model_without_matrices():
    with pytest.raises(ValueError, match="no linear weight matrices"):
        split_params(nn.Sequential(nn.Embedding(10, 4), nn.LayerNorm(4)))


def test_groups_must_cover_every_trainable_parameter_once(llama):
    params = list(llama.parameters())
    with pytest.raises(ValueError, match="missing"):
        check_covers(llama, [{"params": params[1:]}])
    with pytest.raises(ValueError, match="repeated"):
        check_covers(llama, [{"params": params}, {"params": params[:1]}])


def test_foam_groups_fold_matrices_and_leave_the_rest_to_adamw(llama):
    opt = build_optimizer("foam", llama, lr=1e-2, level=3)
    matrices, others = opt.param_groups
    assert (matrices["name"], matrices["level"], matrices["alpha"]) == ("matrices", 3, 0.25)
    assert (others["name"], others["level"]) == ("others", None)
    assert build_optimizer("foam_mini", llama).param_groups[0]["level"] == "mini"


def test_module_wise_lr_adamw_scales_only_the_matrices(llama):
    opt = build_optimizer("adamw", llama, lr=1e-3, alpha=0.5)
    assert isinstance(opt, torch.optim.AdamW)
    assert [g["lr"] for g in opt.param_groups] == [5e-4, 1e-3]


def test_unknown_names_and_keywords_list_what_is_accepted(llama):
    with pytest.raises(ValueError, match=r"unknown optimizer 'adamx'; available: .*adamw"):
        build_optimizer("adamx", llama)
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['rank'\].*'level'"):
        build_optimizer("foam", llama, rank=4)


def test_level_beyond_the_matrices_is_refused_naming_the_largest_they_allow(llama):
    """Tiny LLaMA's matrices are 64 x 64, 64 x 172 and 172 x 64: level 6 (blocks of 64) is the
    largest whose blocks fit an axis of each; level 7 is refused, for every folding method."""
    for name in ("foam", "foam_muon", "foam_adam_mini", "foam8bit"):
        if name == "foam8bit":
            pytest.importorskip("bitsandbytes")
        with pytest.raises(foam.OptionError, match=r"level 7 .* 64 x 64 .* is 6") as err:
            build_optimizer(name, llama, level=7)
        assert err.value.key == "level"
    build_optimizer("foam", llama, level=6)  # the largest they allow is accepted


@pytest.mark.parametrize(
    ("name", "hparams"),
    [("foam", {"level": 2}), ("foam", {"level": 6}), ("foam_mini", {}), ("adamw", {})],
)
def test_planned_state_matches_allocated_state(llama, name, hparams):
    opt = build_optimizer(name, llama, **hparams)
    for p in llama.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    opt.zero_grad()
    moments = sum(t.numel() for s in opt.state.values() for k, t in s.items() if k != "step")
    assert moments == foam.planned_state_numel(opt)


def test_meta_models_can_be_planned_without_allocating():
    with torch.device("meta"):
        model = tiny_llama(seed=None)
    opt = build_optimizer("foam", model, level=2)
    assert isinstance(opt, FOAM) and foam.state_bytes(opt) == 0
    hidden, inter, vocab = 64, 172, 256
    per_layer = 4 * 2 * hidden * hidden // 4 + 3 * 2 * hidden * inter // 4
    others = 2 * (2 * vocab * hidden + hidden * 5)  # embed, head, 2 norms/layer + final norm
    assert foam.planned_state_numel(opt) == 2 * per_layer + others


# Methods whose own class could update the embeddings, head and norms; by default (the paper's
# recipe) they hand them to the same plain AdamW as every other method.
SHARED_ADAMW_METHODS = ["galore", "apollo", "apollo_mini", "gwt", "gwt_mini", "ldadamw", "muon"]


@pytest.mark.parametrize("name", SHARED_ADAMW_METHODS)
def test_every_method_updates_the_rest_with_torch_adamw(name):
    model, reference = tiny_llama(), tiny_llama()
    hp = dict(lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
    opt = build_optimizer(name, model, **hp)
    rest = [q for _, q in split_params(reference).others]
    ref_opt = torch.optim.AdamW(rest, **hp, eps=1e-8, foreach=False)
    grads = random_grads(model, 3)
    step_with(opt, model, grads)
    names = {id(p): n for n, p in model.named_parameters()}
    ref_names = {id(q): n for n, q in reference.named_parameters()}
    ref_by_name = {ref_names[id(q)]: q for q in rest}
    for step_grads in grads:
        for q, g in zip(reference.parameters(), step_grads, strict=True):
            q.grad = g.clone()
        ref_opt.step()
    for _, p in split_params(model).others:
        torch.testing.assert_close(p, ref_by_name[names[id(p)]], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", [*SHARED_ADAMW_METHODS[:-1], "adam_mini"])  # not muon
def test_others_option_is_checked(name):
    with pytest.raises(ValueError, match="others must be one of"):
        build_optimizer(name, tiny_llama(), others="sgd")


def test_sharded_methods_are_those_that_declare_it_where_they_register(monkeypatch):
    """``foam.sharding.SHARDED_METHODS`` is read off the ``shards=True`` declarations, so a
    method that registers it is listed (and a method that does not is refused under FSDP2)."""
    import foam.registry as registry
    import foam.sharding

    assert {"adamw", "foam", "foam_mini"} <= set(foam.sharding.SHARDED_METHODS)
    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    monkeypatch.setattr(foam.sharding, "_DECLARED_SHARDED", set(foam.sharding._DECLARED_SHARDED))
    registry.register("sharded_probe", shards=True)(lambda split, hp: None)
    registry.register("unsharded_probe")(lambda split, hp: None)
    assert "sharded_probe" in foam.sharding.SHARDED_METHODS
    assert "unsharded_probe" not in foam.sharding.SHARDED_METHODS
