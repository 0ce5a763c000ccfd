"""The storage path on every architecture: transparent for the identity scheme, bounded when on,
always removed.

One parametrized matrix over tiny random models of eleven architectures and both of transformers'
CPU attention implementations (gemma2 needs eager: soft-capping).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from evalkit import quantized_kv
from evalkit.errors import EvalkitError, NonFiniteKVError, SchemeError, UnsupportedModelError
from evalkit.integration.hf_compat import cache_inputs, output_cache
from evalkit.integration.storage import StorageCache

from tests.tiny_models import ARCHS, EAGER_ONLY, tiny_model

IMPLS = ["sdpa", "eager"]
FP8_SCHEMES = [
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e4m3/block16/dynamic",
    "fp8_e5m2/tensor/dynamic",
    "fp8_e4m3fnuz/head/dynamic",
    "fp8_e4m3/token/dynamic",
]
# Mean KL(unhooked || hooked) per token on the tiny random models (logits ~ N(0, 1)). FP8 with
# dynamic scales moves them by ~1e-6..1e-3; the bound leaves margin. A broken quantizer
# (int4/tensor/unit) moves them more than ten times as far as fp8_e4m3/head/dynamic.
KL_BOUND = 5e-3


def batch(vocab=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (2, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding
    return ids, mask


def mean_kl(ref, out, mask):
    lp, lq = F.log_softmax(ref.double(), -1), F.log_softmax(out.double(), -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    return float(kl[mask.bool()].mean())


@pytest.fixture(
    scope="module",
    params=[(a, i) for a in ARCHS for i in IMPLS if not (a in EAGER_ONLY and i == "sdpa")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def model(request):
    arch, impl = request.param
    return tiny_model(arch, attn_implementation=impl)


@torch.no_grad()
def test_identity_is_bit_exact_prefill_padding_generate(model):
    ids, mask = batch()
    ref = model(ids, attention_mask=mask).logits
    ref_gen = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    impl_before = model.config._attn_implementation
    with quantized_kv(model, "auto"):
        out = model(ids, attention_mask=mask, use_cache=False)  # the storage cache is installed all the same
        assert isinstance(output_cache(out), StorageCache)
        gen = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(out.logits, ref)
    assert torch.equal(gen, ref_gen)
    assert model.config._attn_implementation == impl_before
    assert not model.get_decoder()._forward_pre_hooks and not model.get_decoder()._forward_hooks
    assert torch.equal(model(ids, attention_mask=mask).logits, ref)


@torch.no_grad()
@pytest.mark.parametrize("scheme", FP8_SCHEMES)
def test_fp8_changes_logits_within_bound(model, scheme):
    ids, mask = batch()
    ref = model(ids, attention_mask=mask).logits
    with quantized_kv(model, scheme):
        out = model(ids, attention_mask=mask).logits
    assert not torch.equal(out, ref)
    assert 0 < mean_kl(ref, out, mask) < KL_BOUND


@torch.no_grad()
def test_destructive_scheme_exceeds_bound(model):
    ids, mask = batch()
    ref = model(ids, attention_mask=mask).logits
    with quantized_kv(model, "int4/tensor/unit"):
        broken = model(ids, attention_mask=mask).logits
    with quantized_kv(model, "fp8_e4m3/head/dynamic"):
        fp8 = model(ids, attention_mask=mask).logits
    assert mean_kl(ref, broken, mask) > 10 * mean_kl(ref, fp8, mask)


@torch.no_grad()
def test_restored_after_exception(model):
    ids, mask = batch()
    ref = model(ids, attention_mask=mask).logits
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError, match="boom"):
        with quantized_kv(model, "fp8_e4m3/head/dynamic+attn=fa3"):
            model(ids, attention_mask=mask)
            raise RuntimeError("boom")
    assert model.config._attn_implementation == before
    assert not model.get_decoder()._forward_pre_hooks and not model.get_decoder()._forward_hooks
    assert torch.equal(model(ids, attention_mask=mask).logits, ref)


@torch.no_grad()
def test_padded_row_equals_unpadded_sequence(model):
    """Scales are per sequence and padding is left out of them: the padded row scores like the
    sequence alone (up to the float noise that padding causes in the plain model itself)."""
    ids, mask = batch()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)

    def gap():
        padded = model(ids, attention_mask=mask, position_ids=pos).logits[0, 5:]
        alone = model(ids[:1, 5:]).logits[0]
        return (padded - alone).abs().max().item()

    noise = gap()
    for scheme in ("fp8_e4m3/tensor/dynamic", "fp8_e4m3/head/dynamic", "fp8_e4m3/block16/dynamic"):
        with quantized_kv(model, scheme):
            assert gap() <= 20 * noise + 1e-5, scheme


def test_skipped_layers_are_untouched():
    model = tiny_model("llama")
    seen = {}

    def spy(module, args, kwargs, output):
        seen.setdefault(module.layer_idx, []).append(output[0].detach().clone())

    ids, mask = batch()
    handles = [layer.self_attn.register_forward_hook(spy, with_kwargs=True) for layer in model.model.layers]
    with torch.no_grad():
        model(ids, attention_mask=mask)
        with quantized_kv(model, "fp8_e4m3/tensor/unit+skip=0"):
            model(ids, attention_mask=mask)
    for h in handles:
        h.remove()
    assert torch.equal(seen[0][0], seen[0][1])  # layer 0 kept unquantized: same input, same output
    assert not torch.equal(seen[1][0], seen[1][1])


def test_skip_sliding_keeps_only_sliding_layers():
    from evalkit.integration.binding import BoundScheme
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.info import kv_layout

    model = tiny_model("gemma3")
    q = BoundScheme(parse_scheme("fp8_e4m3/head/dynamic+skip=sliding"), kv_layout(model.config))
    assert [q.is_active(i) for i in range(4)] == [False, False, False, True]


def test_unsupported_architecture_is_refused():
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_config(
        tf.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4)
    )
    with pytest.raises(UnsupportedModelError, match="'falcon'"):
        with quantized_kv(model, "fp8_e4m3/tensor/dynamic"):
            pass


def test_nested_blocks_and_bad_group_are_errors():
    model = tiny_model("llama")
    with quantized_kv(model, "fp8_e4m3/tensor/dynamic"):
        with pytest.raises(EvalkitError, match="cannot be nested"):
            with quantized_kv(model, "fp8_e4m3/head/dynamic"):
                pass
    with pytest.raises(SchemeError, match="does not divide head_dim 16"):
        with quantized_kv(model, "int4/group12/dynamic"):
            pass
    with pytest.raises(SchemeError, match="skip=7"):
        with quantized_kv(model, "fp8_e4m3/tensor/dynamic+skip=7"):
            pass


def test_a_foreign_prefilled_cache_and_another_blocks_cache_are_refused():
    from transformers import DynamicCache

    model = tiny_model("llama")
    ids, mask = batch()
    with torch.no_grad():
        filled = output_cache(model(ids, attention_mask=mask, **cache_inputs(model, DynamicCache(config=model.config))))
        with quantized_kv(model, "fp8_e4m3/tensor/dynamic"):
            with pytest.raises(SchemeError, match="already holds tokens"):
                model(ids[:, :1], **cache_inputs(model, filled))
        with quantized_kv(model, "fp8_e4m3/tensor/dynamic") as first:
            cache = first.new_cache()
        with quantized_kv(model, "fp8_e4m3/head/dynamic"):
            with pytest.raises(SchemeError, match="another quantized_kv block"):
                model(ids, **cache_inputs(model, cache))


def test_attention_that_never_writes_the_cache_is_refused(monkeypatch):
    """A model whose attention bypasses cache.update would be measured unquantized: refused instead."""
    model = tiny_model("llama")
    for layer in model.model.layers:
        attn = layer.self_attn
        monkeypatch.setattr(attn, "forward", lambda hidden_states, *a, **k: (torch.zeros_like(hidden_states), None))
    with torch.no_grad(), quantized_kv(model, "fp8_e4m3/tensor/dynamic"):
        with pytest.raises(UnsupportedModelError, match="never wrote its K/V"):
            model(torch.randint(0, 100, (1, 8)))


def test_nonfinite_kv_is_a_clear_error():
    model = tiny_model("llama")
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight[0, 0] = float("inf")
        with pytest.raises(NonFiniteKVError, match="layer 0 K contains NaN or inf"):
            with quantized_kv(model, "fp8_e4m3/tensor/dynamic"):
                model(torch.randint(0, 100, (1, 8)))
