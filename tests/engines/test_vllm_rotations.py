"""The rotation dtypes' constants against vLLM's own code (needs vLLM): the INT4 sign vector, the
TurboQuant Lloyd-Max centroids and midpoints, the boundary layers, the UltraQuant slot, and the
per-token bytes of every rotation dtype on the embedded model against vLLM's page size."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from evalkit.kv import hadamard
from evalkit.kv.codec import codec_for
from evalkit.kv.codecs.vllm import turboquant, ultraquant
from evalkit.kv.scheme import parse_scheme

from tests.engines.vllm_env import needs_vllm

ROTATIONS = [
    "int4_per_token_head",
    "turboquant_k8v4",
    "turboquant_4bit_nc",
    "turboquant_k3v4_nc",
    "turboquant_3bit_nc",
    "ultraquant_4bit",
]


@needs_vllm
@pytest.mark.parametrize("d", [32, 64, 128])
def test_the_int4_signs_are_vllms(d):
    from vllm.v1.attention.ops.int4_per_token_head import _get_rht_signs

    assert torch.equal(hadamard.rht_signs(d), _get_rht_signs(d, 0, torch.device("cpu")))


@needs_vllm
@pytest.mark.parametrize("d,bits", [(64, 3), (64, 4), (128, 3), (128, 4)])
def test_the_codebook_is_vllms_bit_for_bit(d, bits):
    from vllm.model_executor.layers.quantization.turboquant.centroids import get_centroids

    c, mid = turboquant.codebook(d, bits)
    theirs = get_centroids(d, bits).sort().values
    assert torch.equal(c, theirs) and torch.equal(mid, (theirs[:-1] + theirs[1:]) / 2)


@needs_vllm
@pytest.mark.parametrize("layers", [1, 2, 3, 6, 30])
def test_the_boundary_layers_are_vllms(layers):
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig

    model = SimpleNamespace(is_hybrid=False, hf_text_config=SimpleNamespace(num_hidden_layers=layers))
    want = {int(i) for i in TurboQuantConfig.get_boundary_skip_layers(model)}
    for name in ROTATIONS[1:]:
        assert codec_for(parse_scheme(f"vllm:{name}").recipe).boundary(layers) == want


@needs_vllm
@pytest.mark.parametrize("d", [64, 128, 256])
def test_the_slots_are_vllms(d):
    from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig
    from vllm.v1.attention.ops.ultraquant.format import slot_size

    for name in ROTATIONS[1:5]:
        tq = TurboQuantConfig.from_cache_dtype(name, d)
        assert (turboquant.key_width(name, d), turboquant.value_width(name, d)) == (
            tq.key_packed_size,
            tq.value_packed_size,
        )
    assert 2 * ultraquant.width("k", d) == slot_size(d)


@needs_vllm
def test_rotation_bytes_per_token_on_the_embedded_model_equal_vllms_pages():
    from evalkit.engines.vllm.dtypes import rows

    from tests.engines.test_vllm_dtypes_pages import layouts

    by = {r.kv_cache_dtype: r for r in rows(layouts()["embedded"])}
    want = {  # vLLM 0.32, SmolLM2-135M (30 layers, 3 KV heads, head_dim 64); 4 boundary layers in BF16
        "int4_per_token_head": 6480,
        "turboquant_k8v4": 10872,
        "turboquant_4bit_nc": 8532,
        "turboquant_k3v4_nc": 7908,
        "turboquant_3bit_nc": 7284,
        "ultraquant_4bit": 8376,
    }
    for name, n in want.items():
        assert by[name].scheme == f"vllm:{name}"
        assert by[name].vllm_bytes_per_token == by[name].evalkit_bytes_per_token == n, by[name]


@needs_vllm
@pytest.mark.slow
def test_rotation_stores_through_the_interpreter_equal_evalkit():
    from evalkit.engines.vllm.triton_rotations import CLASSES, CONFORMANCE
    from evalkit.engines.vllm.triton_store import FP8_CLASSES, conformance

    results = {r.kv_cache_dtype: r for r in conformance(tuple(CONFORMANCE))}
    assert set(results) == set(ROTATIONS)
    for name, r in results.items():
        assert r.values == 65536 and r.scales_equal == r.scales > 0, r
        assert r.codes_equal + sum(r.classes.values()) == r.values, r
        assert "other" not in r.classes and set(r.classes) <= set(FP8_CLASSES) | set(CLASSES), r
        if name != "turboquant_k8v4":  # integer / float32 / float16 arithmetic only: equal, every code
            assert r.codes_equal == r.values, r
    k8v4 = results["turboquant_k8v4"]  # its FP8 keys: the interpreter's cast, each difference classified
    assert set(k8v4.classes) <= {"carry_lost", "min_subnormal_lost", "one_code_toward_zero"}, k8v4.classes
