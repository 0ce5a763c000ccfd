"""DeepSeek V4 / V4.1 records (``dsv4:fp8_ds_mla``, ``dsv4:fp8_ds_mla_v41``): bytes, codes against a plain
reading of vLLM's writers, the pages per vLLM version, the layout, and the one-line refusals.

The reference (:func:`reference_row`) is a per-value Python loop over numpy and ml_dtypes, written from
the kernels' text (quoted in :mod:`evalkit.kv.codecs.dsv4.records`), not from evalkit's code.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from evalkit.cli import main
from evalkit.errors import SchemeError
from evalkit.kv.codecs.dsv4 import records
from evalkit.kv.codecs.dsv4.family import CODECS
from evalkit.kv.memory import bytes_per_token, model_cache_bytes
from evalkit.kv.scheme import parse_scheme
from evalkit.models.info import kv_layout
from evalkit.models.presets import PRESETS, config_namespace

NAMES = ("fp8_ds_mla", "fp8_ds_mla_v41")
CODEC = {c.name: c for c in CODECS}


def _entry(seed: int, tokens: int = 6) -> torch.Tensor:
    """(1, 1, tokens, 512) bf16-representable values over many magnitudes, with an all-zero block and outliers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 1, tokens, 512, generator=g) * torch.logspace(-6, 3, 512)[torch.randperm(512, generator=g)]
    x[..., 0, 64:128] = 0.0  # a V4 block (and two V4.1 blocks) of zeros: the 1e-4 floor
    x[..., 1, 5] = 3.0e4
    return x.to(torch.bfloat16).float()


def _e4m3_byte(v: float) -> int:
    return int(np.array(np.clip(v, -448.0, 448.0), dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8))


def _exponent(amax: float, reciprocal: bool) -> int:
    amax32 = np.float32(max(amax, np.float32(1e-4)))
    s = amax32 * np.float32(1.0 / 448.0) if reciprocal else amax32 / np.float32(448.0)
    m, e = math.frexp(float(np.float32(s)))
    return e - 1 if m == 0.5 else e


def reference_row(name: str, token: np.ndarray) -> bytes:
    """vLLM's record for one token's 512 values, value by value."""
    if name == "fp8_ds_mla":  # 448 E4M3 in blocks of 64 | 64 bf16 | 7 exponent bytes | pad
        codes, scales = [], []
        for b in range(7):
            block = token[64 * b : 64 * (b + 1)]
            e = _exponent(float(np.abs(block).max()), reciprocal=False)
            scales.append(min(max(e + 127, 0), 255))
            codes += [_e4m3_byte(float(v) / 2.0**e) for v in block]
        rope = np.array(token[448:], dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint8).tobytes()
        return bytes(codes) + rope + bytes(scales) + b"\x00"
    codes, scales = [], []  # V4.1: 512 E4M3 in blocks of 32 | 16 exponent bytes
    for b in range(16):
        block = token[32 * b : 32 * (b + 1)]
        e = _exponent(float(np.abs(block).max()), reciprocal=True)
        scales.append(min(max(e + 127, 0), 255))
        codes += [_e4m3_byte(float(v) * 2.0**-e) for v in block]
    return bytes(codes) + bytes(scales)


def _rows(name: str, x: torch.Tensor) -> torch.Tensor:
    codec = CODEC[name]
    latent, rope = codec.encode(x[..., :448], "k"), codec.encode(x[..., 448:], "v")
    assert torch.equal(codec.decode(latent.stored, "k", 448), latent.values)  # read back independently of encode
    assert torch.equal(codec.decode(rope.stored, "v", 64), rope.values)
    return records.row(name, latent.stored, rope.stored)


@pytest.mark.parametrize("name", NAMES)
def test_the_rows_are_the_writers_byte_for_byte(name):
    x = _entry(3)
    rows = _rows(name, x)[0, 0]
    assert rows.shape == (6, {"fp8_ds_mla": 584, "fp8_ds_mla_v41": 528}[name])
    for t in range(6):
        assert bytes(rows[t].tolist()) == reference_row(name, x[0, 0, t].numpy()), t


@pytest.mark.parametrize("name", NAMES)
def test_what_attention_reads_is_code_times_the_power_of_two(name):
    x = _entry(5)
    codec = CODEC[name]
    q = codec.encode(x[..., :448], "k")
    block = 64 if name == "fp8_ds_mla" else 32
    codes = q.stored[..., :448].contiguous().view(torch.float8_e4m3fn).double()
    exps = q.stored[..., 448 : 448 + 448 // block].double() - 127
    want = (codes.reshape(*codes.shape[:-1], -1, block) * torch.pow(2.0, exps)[..., None]).reshape(codes.shape)
    assert torch.equal(q.values.double(), want)
    assert (q.values - x[..., :448]).abs().max() <= torch.pow(2.0, exps).max() * 16  # within half an E4M3 step
    if name == "fp8_ds_mla":
        assert torch.equal(codec.encode(x[..., 448:], "v").values, x[..., 448:])  # the RoPE tail kept as bf16


def test_bytes_per_token_and_layer():
    assert [CODEC[n].width("k", 448) + CODEC[n].width("v", 64) for n in NAMES] == [584, 528]
    assert (448 + 128 + 7 + 1, 512 + 16) == (584, 528)  # the writers' parts


# -- the pages, per vLLM version ---------------------------------------------------------------------
def _page_by_addressing(name: str, version: str, rows: torch.Tensor) -> torch.Tensor:
    """The page as the writers address it: data at ``pos * data_stride``, scales at ``scale_base + pos * scale_bytes``."""
    block, width = rows.shape
    if name == "fp8_ds_mla":
        data, data_stride, scale_base = 576, 576, block * 576
    elif version == "0.32":
        data, data_stride, scale_base = 512, 512, block * 512  # 0.32: token_data_ptr = block + pos * head_dim
    else:
        data, data_stride, scale_base = 512, 528, 512  # 0.33/0.34: pos * (head_dim + scale_dim), scales after data
    page = torch.zeros(records.page_bytes(name, block), dtype=torch.uint8)
    for pos in range(block):
        page[pos * data_stride : pos * data_stride + data] = rows[pos, :data]
        at = scale_base + pos * (width - data) if name == "fp8_ds_mla" or version == "0.32" else pos * 528 + 512
        page[at : at + width - data] = rows[pos, data:]
    return page


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("version", records.VERSIONS)
def test_each_page_is_the_writers_addressing(name, version):
    rows = _rows(name, _entry(7, tokens=64))[0, 0]
    page = records.page(name, version, rows)
    assert torch.equal(page, _page_by_addressing(name, version, rows))
    assert torch.equal(records.rows_of(name, version, page, 64), rows)
    assert page.numel() % records.PAGE_ALIGN[name] == 0


def test_the_v41_page_changed_between_032_and_033_and_v4_did_not():
    rows = _rows("fp8_ds_mla_v41", _entry(11, tokens=64))[0, 0]
    old, new, newest = (records.page("fp8_ds_mla_v41", v, rows) for v in ("0.32", "0.33", "0.34"))
    assert not torch.equal(old, new) and torch.equal(new, newest)
    assert torch.equal(old[:512], new[:512])  # token 0's data is where it was; its scales are not
    assert torch.equal(new[512:528], rows[0, 512:]) and torch.equal(old[64 * 512 : 64 * 512 + 16], rows[0, 512:])
    assert (records.layout("fp8_ds_mla_v41", "0.32"), records.layout("fp8_ds_mla_v41", "0.33")) == (
        "split",
        "interleaved",
    )
    v4 = _rows("fp8_ds_mla", _entry(11, tokens=64))[0, 0]
    assert all(
        torch.equal(records.page("fp8_ds_mla", v, v4), records.page("fp8_ds_mla", "0.32", v4)) for v in records.VERSIONS
    )
    assert records.page_bytes("fp8_ds_mla", 64) == 65 * 576  # 64 x 584 = 37,376 B rounded up to the 576 B stride
    with pytest.raises(SchemeError, match="0.32, 0.33, 0.34"):
        records.layout("fp8_ds_mla_v41", "0.31")


@pytest.mark.slow
def test_the_page_facts_are_in_the_released_wheels():
    from tests.engines.vllm_wheels import RegistryUnreachable, vllm_source

    try:
        trees = {v: vllm_source(f"{v}.0") for v in records.VERSIONS}
    except RegistryUnreachable as exc:
        pytest.skip(str(exc))
    v41 = "vllm/models/deepseek_v41/common/ops/cache_utils.py"
    split = "token_data_ptr = cache_block_ptr + pos_in_block * head_dim\n"
    interleaved = "token_data_ptr = cache_block_ptr + pos_in_block * (head_dim + scale_dim)\n"
    texts = {v: (trees[v] / v41).read_text() for v in records.VERSIONS}
    assert split in texts["0.32"] and interleaved not in texts["0.32"]
    assert interleaved in texts["0.33"] and interleaved in texts["0.34"]
    for v in records.VERSIONS:
        assert "V4_BYTES_PER_TOKEN = 584" in texts[v] and "V41_BYTES_PER_TOKEN = 528" in texts[v]
        assert "exponent = tl.ceil(tl.log2(amax * (1.0 / fp8_max)))" in texts[v]
        v4 = (trees[v] / "vllm/models/deepseek_v4/common/ops/cache_utils.py").read_text()
        assert "block_max = tl.maximum(block_max, 1e-4)" in v4 and "exponent = tl.ceil(log_scale)" in v4
        assert "encoded_scale = exponent + 127.0" in v4
        assert "state_content_bytes=584" in (trees[v] / "vllm/models/deepseek_v4/attention.py").read_text()


# -- where they apply ------------------------------------------------------------------------------
def _layout(preset: str):
    return kv_layout(config_namespace(PRESETS[preset]["config"]))


def test_the_v4_preset_layout_and_its_bytes_by_hand():
    layout = _layout("deepseek-v4-flash-base")
    assert (layout.mla_latent_dim, layout.mla_rope_dim, layout.sliding_window) == (448, 64, 128)
    ratios = layout.compress_ratios
    assert len(ratios) == 43 and ratios[:4] == (0, 0, 4, 128) and (ratios.count(4), ratios.count(128)) == (21, 20)
    for text, entry in (("auto", 1024), ("dsv4:fp8_ds_mla", 584), ("dsv4:fp8_ds_mla_v41", 528)):
        scheme = parse_scheme(text)
        assert bytes_per_token(layout, scheme) == 21 * entry / 4 + 20 * entry / 128  # past the window
        entries = 43 * 128 + 21 * (32768 // 4) + 20 * (32768 // 128)  # windows + compressed entries at 32k
        assert model_cache_bytes(layout, scheme, 32768) == entries * entry


@pytest.mark.parametrize(
    "preset, text, message",
    [
        ("llama-3.1-8b", "dsv4:fp8_ds_mla", "dsv4:fp8_ds_mla is DeepSeek V4's latent-attention cache record"),
        ("deepseek-v3", "dsv4:fp8_ds_mla_v41", "stores DeepSeek V4's 448 NoPE + 64 RoPE values"),
        ("deepseek-v4-flash-base", "dsv4:fp8_ds_mla+rope=bf16", "drop +rope=bf16"),
        ("deepseek-v4-flash-base", "vllm:fp8_ds_mla", "DeepSeek V3.2's 512-value latent"),
    ],
)
def test_refused_in_one_line(capsys, preset, text, message):
    code = main(["capacity", "--preset", preset, "--gpu", "h200", "--gpus", "8", "--schemes", text])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_capacity_shows_both_records_on_the_v4_preset(capsys):
    assert main(["capacity", "--preset", "deepseek-v4-flash-base", "--gpu", "b200", "--gpus", "4", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    rows = {r["scheme"]: r for r in out["rows"]}
    assert rows["dsv4:fp8_ds_mla"]["bytes_per_token"] == 21 * 584 / 4 + 20 * 584 / 128
    assert rows["dsv4:fp8_ds_mla_v41"]["bytes_per_token"] == 21 * 528 / 4 + 20 * 528 / 128
    assert rows["dsv4:fp8_ds_mla"]["vllm_dtype"] == rows["dsv4:fp8_ds_mla_v41"]["vllm_dtype"] == "fp8_ds_mla"
    assert rows["dsv4:fp8_ds_mla_v41"]["vllm"] == "V4 backends"  # a B200 (SM 10.0) writes the V4.1 record
    assert main(["capacity", "--preset", "deepseek-v4-flash-base", "--gpu", "h200", "--gpus", "4", "--json"]) == 0
    rows = {r["scheme"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["dsv4:fp8_ds_mla_v41"]["vllm"] == "no" and "SM 10.x only" in rows["dsv4:fp8_ds_mla_v41"]["vllm_reason"]
