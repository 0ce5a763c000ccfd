"""Multi-head latent attention (DeepSeek-V3 / Kimi K2): the stored latent and RoPE key are quantized.

Tiny random deepseek_v3 with a dense first layer and MoE layers after it.
"""

from __future__ import annotations

import subprocess
import sys
import sys as _sys

import pytest
import torch

from evalkit import quantized_kv
from evalkit.errors import SchemeError
from evalkit.integration.hf_compat import cache_inputs
from evalkit.integration.storage import StorageCache

from tests.kv.test_quantize import reference
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def mla():
    return tiny_model("deepseek_v3")


def inputs():
    ids = torch.randint(3, 128, (2, 14), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return ids, mask


@torch.no_grad()
def test_mixed_dense_and_moe_layers(mla):
    kinds = [type(layer.mlp).__name__ for layer in mla.model.layers]
    assert kinds == ["DeepseekV3MLP", "DeepseekV3MoE", "DeepseekV3MoE"]


@torch.no_grad()
def test_identity_is_bit_exact(mla):
    ids, mask = inputs()
    ref = mla(ids, attention_mask=mask).logits
    ref_gen = mla.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
    with quantized_kv(mla, "auto"):
        assert torch.equal(mla(ids, attention_mask=mask).logits, ref)
        assert torch.equal(mla.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False), ref_gen)
    with quantized_kv(mla, "auto") as session:
        out = mla.generate(
            ids, attention_mask=mask, max_new_tokens=5, do_sample=False, **cache_inputs(mla, session.new_cache(mask))
        )
    assert torch.equal(out, ref_gen)
    assert torch.equal(mla(ids, attention_mask=mask).logits, ref)  # no hook left behind


@torch.no_grad()
def test_fp8_changes_logits_and_an_explicit_cache_equals_the_installed_one(mla):
    ids, mask = inputs()
    ref = mla(ids, attention_mask=mask).logits
    with quantized_kv(mla, "fp8_e4m3/group16/dynamic"):
        out = mla(ids, attention_mask=mask).logits
        gen = mla.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=5,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
        )
    assert not torch.equal(out, ref) and (out - ref).abs().max() < 0.5
    with quantized_kv(mla, "fp8_e4m3/group16/dynamic") as session:
        gen2 = mla.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=5,
            do_sample=False,
            **cache_inputs(mla, session.new_cache(mask)),
            output_scores=True,
            return_dict_in_generate=True,
        )
    assert all(torch.equal(a, b) for a, b in zip(gen.scores, gen2.scores))


def capture_attention_inputs(model):
    seen = {}

    def pre(module, args, kwargs):
        seen[module.layer_idx] = (
            kwargs["hidden_states"] if "hidden_states" in kwargs else args[0],
            kwargs["position_embeddings"],
        )

    handles = [layer.self_attn.register_forward_pre_hook(pre, with_kwargs=True) for layer in model.model.layers]
    return seen, handles


def independent_latent(attn, hidden, position_embeddings):
    """The latent and RoPE key from the layer's own projections, as DeepSeek-V3 defines them."""
    modeling = _sys.modules[type(attn).__module__]
    b, s, _ = hidden.shape
    compressed = attn.kv_a_proj_with_mqa(hidden)
    latent, k_rot = torch.split(compressed, [attn.kv_lora_rank, attn.qk_rope_head_dim], dim=-1)
    latent = attn.kv_a_layernorm(latent).view(b, 1, s, -1)
    k_rot = k_rot.view(b, 1, s, -1)
    cos, sin = position_embeddings
    rotate = modeling.apply_rotary_pos_emb_interleave if attn.config.rope_interleave else modeling.apply_rotary_pos_emb
    _, k_rot = rotate(k_rot, k_rot, cos, sin)
    return latent, k_rot


@torch.no_grad()
@pytest.mark.parametrize(
    "scheme, gran, rope_bf16",
    [
        ("fp8_e4m3/token/dynamic", "token", False),
        ("fp8_e4m3/group16/dynamic+rope=bf16", "group16", True),
        ("int8/tensor/dynamic", "tensor", False),
    ],
)
def test_cache_holds_exactly_the_quantized_latent(mla, scheme, gran, rope_bf16):
    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(4))
    seen, handles = capture_attention_inputs(mla)
    try:
        with quantized_kv(mla, scheme) as session:
            cache = session.new_cache()
            mla(ids, **cache_inputs(mla, cache))
    finally:
        for h in handles:
            h.remove()
    assert isinstance(cache, StorageCache)
    fmt = scheme.split("/")[0]
    for idx, layer in enumerate(cache.layers):
        latent, k_rot = independent_latent(mla.model.layers[idx].self_attn, *seen[idx])
        stored_latent = layer.k.values.float()
        stored_rope = layer.v.values.float()
        assert stored_latent.shape == (1, 1, 12, 32) and stored_rope.shape == (1, 1, 12, 8)
        assert layer.k.codes.element_size() == 1
        assert torch.equal(stored_latent, torch.from_numpy(reference(latent.numpy(), fmt, gran)))
        if rope_bf16:
            assert torch.equal(stored_rope, k_rot)
        else:
            rope_gran = "group8" if gran.startswith("group") else gran
            assert torch.equal(stored_rope, torch.from_numpy(reference(k_rot.numpy(), fmt, rope_gran)))
            assert not torch.equal(stored_rope, k_rot)


def test_head_granularity_is_refused_with_the_valid_ones(mla):
    for scheme in ("fp8_e4m3/head/dynamic", "fp8_e4m3/block16/dynamic"):
        with pytest.raises(SchemeError, match="use tensor, token or group<N>"):
            with quantized_kv(mla, scheme):
                pass


@pytest.mark.slow
def test_head_granularity_exits_2_at_the_cli(tmp_path, tiny_tokenizer_dir):
    from tests.tiny_models import make_model_dir

    folder = make_model_dir(tmp_path / "tiny_deepseek", "deepseek_v3", tiny_tokenizer_dir)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "evalkit",
            "run",
            "--model",
            str(folder),
            "--schemes",
            "fp8_e4m3/head/dynamic",
            "--eval",
            "perplexity",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "use tensor, token or group<N>" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_perplexity_eval_runs_unchanged_on_mla(tmp_path, tiny_tokenizer_dir):
    from evalkit.evals.perplexity.evaluation import PerplexityEval
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import load_model

    from tests.tiny_models import make_model_dir

    lm = load_model(str(make_model_dir(tmp_path / "tiny_deepseek", "deepseek_v3", tiny_tokenizer_dir)))
    ev = PerplexityEval({"corpus": "embedded", "window": 64, "stride": 64, "max_windows": 3, "bootstrap_samples": 200})
    ev.prepare(lm, tmp_path / "work")
    base = {r.metric: r.value for r in ev.evaluate(lm, parse_scheme("auto")) if not r.labels}
    fp8 = {
        r.metric: r.value for r in ev.evaluate(lm, parse_scheme("fp8_e4m3/group16/dynamic+rope=bf16")) if not r.labels
    }
    assert base["kl_mean"] == 0 and base["top1_agreement"] == 1
    assert fp8["kl_mean"] > 0 and fp8["ppl"] != base["ppl"]
