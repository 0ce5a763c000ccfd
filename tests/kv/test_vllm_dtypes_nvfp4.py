"""vllm:nvfp4 and vllm:nvfp4_4over6 on standard attention: each (token, head) slot's bytes against a
numpy reading of reshape_and_cache_nvfp4_kernel / cvt_warp_fp16_to_fp4 (k_scale 1.0), written here with
the exhaustive nearest-even E4M3/E2M1 references, read back independently; the storage path of a tiny
GQA model; refusals (MLA, head sizes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf

from evalkit import quantized_kv
from evalkit.errors import SchemeError
from evalkit.integration.hf_compat import cache_inputs
from evalkit.kv.codecs.vllm import nvfp4
from evalkit.kv.memory import bytes_per_token
from evalkit.kv.scheme import parse_scheme
from evalkit.models.info import kv_layout

from tests.kv.test_vllm_dtypes_ds_mla import E2M1, E4M3, ref_e2m1_code, ref_e4m3_code
from tests.tiny_models import tiny_model

CODECS = {c.name: c for c in nvfp4.CODECS}


def ref_group(g: np.ndarray, divisor: float) -> tuple[list[int], int, np.ndarray]:
    """One group of 16 as the kernel computes it (global scale 1): codes, scale byte, dequantized values."""
    g = g.astype(np.float32)
    sf_value = np.float32(np.abs(g).max()) * np.float32(1.0 / divisor)
    sf_code = ref_e4m3_code(float(sf_value))
    sf = np.float32(E4M3[sf_code])
    out = np.float32(0) if sf == 0 else np.float32(1) / sf
    codes = [ref_e2m1_code(float(np.float32(v) * out)) for v in g]
    deq = np.array([E2M1[c & 7] * (-1.0 if c & 8 else 1.0) for c in codes]) * float(sf)
    return codes, sf_code, deq


def ref_slot(x: np.ndarray, four_over_six: bool) -> bytes:
    codes, scales = [], []
    for g in x.reshape(-1, 16):
        c, s, deq = ref_group(g, 6.0)
        if four_over_six:
            c4, s4, deq4 = ref_group(g, 4.0)
            if np.sum((g.astype(np.float64) - deq4) ** 2) < np.sum((g.astype(np.float64) - deq) ** 2):
                c, s = c4, s4
        codes += c
        scales.append(s)
    return bytes(codes[i] | (codes[i + 1] << 4) for i in range(0, len(codes), 2)) + bytes(scales)


def read_slot(b: bytes, d: int) -> np.ndarray:
    a = np.frombuffer(b, dtype=np.uint8)
    nib = np.stack([a[: d // 2] & 0xF, a[: d // 2] >> 4], axis=-1).reshape(-1)
    e2m1 = E2M1[nib & 7] * np.where(nib & 8, -1.0, 1.0)
    return (e2m1.reshape(-1, 16) * E4M3[a[d // 2 :]][:, None]).reshape(-1)


def sample(d: int = 128) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, d, generator=g)
    x[0, :16] = 0.0  # scale 0, all-zero codes
    x[1] *= 1e-3  # scales that round to 0 in E4M3 (amax / 6 below 2**-10)
    x[2] *= 5000.0  # beyond 6 * 448: saturated scale and elements
    x[3] = x[3].to(torch.bfloat16).float() * 7.0  # bf16 inputs
    x[4, :16] = torch.tensor([6.0, 4.0, 3.0, 2.0, 1.5, 1.0, 0.5, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, -0.0])
    return x


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6"])
def test_slot_bytes_equal_an_independent_reading_of_the_kernel(name):
    x = sample()
    q = CODECS[name].encode(x, "k")
    assert q.stored.shape == (6, nvfp4.width("k", 128)) == (6, 72)
    for i in range(6):
        got = q.stored[i].numpy().tobytes()
        assert got == ref_slot(x[i].numpy(), name == "nvfp4_4over6"), i
        assert np.array_equal(q.values[i].double().numpy(), read_slot(got, 128))
    assert torch.equal(CODECS[name].decode(q.stored, "k", 128), q.values)


def test_4over6_takes_each_scale_somewhere():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(9))
    q6, sf6 = nvfp4.quantize_groups(x, False)
    q, sf = nvfp4.quantize_groups(x, True)
    changed = (sf != sf6).float().mean()
    assert 0.05 < changed < 0.95, changed
    err = lambda q, sf: (x.reshape(64, -1, 16) - q.reshape(64, -1, 16) * sf[..., None]).square().sum()  # noqa: E731
    assert err(q, sf) < err(q6, sf6)


def gqa_model(head_dim=64):
    cfg = tf.LlamaConfig(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
    )
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).eval()


@torch.no_grad()
@pytest.mark.parametrize("name", ["nvfp4", "nvfp4_4over6"])
def test_storage_path_holds_the_slots(name):
    model = gqa_model()
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    with quantized_kv(model, f"vllm:{name}") as session:
        cache = session.new_cache()
        model(ids, **cache_inputs(model, cache))
    for layer in cache.layers:
        for st in (layer.k, layer.v):
            assert st.codes.shape == (2, 2, 7, 36) and st.codes.dtype == torch.uint8
            assert torch.equal(st.decoded(), st.values.float())
    assert cache.nbytes() == 2 * 7 * 2 * 2 * 2 * 36  # batch, tokens, layers, K and V, heads, slot
    assert bytes_per_token(kv_layout(model.config), parse_scheme(f"vllm:{name}")) == 2 * 2 * 2 * 36


def test_refused_in_one_line():
    for name in ("nvfp4", "nvfp4_4over6"):
        for model, match in (
            (tiny_model("deepseek_v3"), "no MLA backend"),
            (gqa_model(32), "takes head_size 64, 128, 256, 512"),
        ):
            with pytest.raises(SchemeError, match=match) as e:
                with quantized_kv(model, f"vllm:{name}"):
                    pass
            assert "\n" not in str(e.value)
    with pytest.raises(SchemeError, match="write vllm:nvfp4"):
        parse_scheme("fp4_e2m1/group16/dynamic+scale_dtype=e4m3+recipe=vllm_nvfp4+rounding=rtz")
