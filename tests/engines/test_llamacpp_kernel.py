"""evalkit's ggml block encoder (evalkit.kv.codecs.llamacpp.ggml_blocks) against the installed llama.cpp's own CPU
``from_float`` and ``to_float`` (evalkit.engines.llamacpp.ggml_lib, ctypes): byte for byte on the
synthetic rows for every cache type, every difference in a named class, and ggml's row sizes equal to
the codecs' widths. Skipped where llama-cpp-python is not installed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install -e '.[llamacpp]')")

from evalkit.engines.llamacpp import ggml_lib  # noqa: E402
from evalkit.kv.codecs.llamacpp import ggml_blocks as gb  # noqa: E402
from evalkit.kv.scheme import parse_scheme  # noqa: E402

TYPES = ["f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1", "f32"]


@pytest.fixture(scope="module")
def report():
    rows = np.concatenate([ggml_lib.synthetic_rows(seed=s) for s in (0, 1)])
    return {r["type"]: r for r in ggml_lib.kernel_conformance(TYPES, rows)}


@pytest.mark.parametrize("name", TYPES)
def test_bytes_equal_ggmls_from_float(report, name):
    r = report[name]
    assert r["blocks"] > 0
    assert set(r["differences"]) <= {ggml_lib.ZERO_IQ4}, r["examples"]  # nothing unexplained, no NaN in these rows
    if name != "iq4_nl":
        assert r["equal"] == r["blocks"], r["examples"]
    else:  # only rows' leading all-zero blocks, whose indices ggml takes from uninitialised stack memory
        assert r["differences"].get(ggml_lib.ZERO_IQ4, 0) == r["blocks"] - r["equal"]
        assert r["equal"] > 0.9 * r["blocks"]


def test_an_unexplained_difference_shows_as_its_own_class():
    x = np.random.default_rng(0).standard_normal(32).astype(np.float32)
    got = np.frombuffer(ggml_lib.from_float("q8_0", x).tobytes(), np.uint8).copy()
    bad = got.copy()
    bad[5] ^= 1
    assert ggml_lib._classify("q8_0", x, bad, got) == ggml_lib.UNEXPLAINED
    x[3] = np.nan
    assert ggml_lib._classify("q8_0", x, bad, got) == ggml_lib.NONFINITE


@pytest.mark.parametrize("name", TYPES)
def test_dequantization_equals_ggmls_to_float(name):
    data = ggml_lib.from_float(name, ggml_lib.synthetic_rows(seed=3, rows=8))
    want = ggml_lib.to_float(name, data)
    got = gb.decode(name, torch.from_numpy(data)).numpy()
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("name", TYPES)
def test_row_size_equals_the_codec_width(name):
    from evalkit.kv.codec import codec_for

    c = codec_for(parse_scheme(f"llamacpp:{name}/{name}").recipe)
    for d in (64, 128, 256):
        assert ggml_lib.row_size(name, d) == c.width("k", d) == c.width("v", d) == gb.TYPES[name].row_bytes(d)


def test_q8_0_is_the_simd_path_not_the_reference():
    x = np.zeros(32, np.float32)
    x[:8] = [127, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5, -3.5]
    assert ggml_lib.from_float("q8_0", x)[2:10].view(np.int8).tolist() == [127, 0, 2, 2, -2, 0, 4, -4]


def test_real_rows_go_in_the_same_way():
    k = torch.randn(1, 3, 5, 64)  # (B, H, S, D): one ggml row per token, its heads in order
    rows = gb.fwht_llamacpp(k, 64)[0].permute(1, 0, 2).reshape(5, -1).numpy()
    (r,) = ggml_lib.kernel_conformance(["q4_0"], rows)
    assert r["blocks"] == 5 * 3 * 2 and r["equal"] == r["blocks"]
