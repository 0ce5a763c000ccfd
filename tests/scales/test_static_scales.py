"""Static scale tables: strict validation (never a quiet 1.0) and their use by the hook."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from evalkit import quantized_kv
from evalkit.errors import ScaleError
from evalkit.integration.hf_compat import output_cache
from evalkit.kv.formats import FORMATS
from evalkit.kv.quantize import quantize_dequantize
from evalkit.kv.scale_table import ScaleTable, load_scale_table, save_scale_table
from evalkit.kv.scheme import Granularity
from evalkit.models.info import config_hash, kv_layout


def write(path, k, v, meta=None):
    """A table with a sidecar naming ``meta`` (its format fp8_e4m3 unless ``meta`` says otherwise)."""
    save_scale_table(path, ScaleTable(k, v, {"format": "fp8_e4m3", **(meta or {})}))
    return path


def test_head_table_round_trips_and_validates(tmp_path, tiny):
    layout = kv_layout(tiny.model.config)
    path = write(
        tmp_path / "h.safetensors",
        torch.full((2, 2), 0.01),
        torch.full((2, 2), 0.02),
        {"config_hash": config_hash(tiny.model.config), "model": "tiny"},
    )
    table = load_scale_table(path, layout, granularity="head", config_hash=config_hash(tiny.model.config))
    assert table.granularity == "head" and table.layer_scale("k", 1).shape == (1, 2, 1, 1)


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("missing file", "does not exist"),
        ("wrong shape", "made for another model"),
        ("other model", "calibrated on model"),
        ("missing v", "no v_scale entry"),
        ("zero scale", "zero, negative or non-finite"),
        ("wrong granularity", "holds tensor scales but the scheme asks for head"),
        ("not safetensors", "not a readable safetensors file"),
    ],
)
def test_bad_tables_are_clear_errors(tmp_path, tiny, case, fragment):
    layout, chash = kv_layout(tiny.model.config), config_hash(tiny.model.config)
    path = tmp_path / "s.safetensors"
    granularity = "tensor"
    if case == "wrong shape":
        write(path, torch.ones(5), torch.ones(5))
    elif case == "other model":
        write(path, torch.ones(2), torch.ones(2), {"config_hash": "0123456789abcdef", "model": "other/model"})
    elif case == "missing v":
        save_file({"k_scale": torch.ones(2)}, str(path))
    elif case == "zero scale":
        write(path, torch.tensor([1.0, 0.0]), torch.ones(2))
    elif case == "wrong granularity":
        write(path, torch.ones(2), torch.ones(2))
        granularity = "head"
    elif case == "not safetensors":
        path.write_bytes(b"definitely not a safetensors header")
    with pytest.raises(ScaleError) as err:
        load_scale_table(path, layout, granularity=granularity, config_hash=chash)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_static_scheme_uses_exactly_the_table(tmp_path, tiny):
    """Per-layer static scales: the stored K/V are quantized with the file's scale, per layer."""
    path = write(
        tmp_path / "t.safetensors",
        torch.tensor([0.002, 0.004]),
        torch.tensor([0.003, 0.005]),
        {"config_hash": config_hash(tiny.model.config)},
    )
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        with quantized_kv(tiny.model, f"fp8_e4m3/tensor/static+scales={path}"):
            stored = output_cache(tiny.model(ids))
        with quantized_kv(tiny.model, "auto"):
            raw = output_cache(tiny.model(ids))
    fmt, tensor = FORMATS["fp8_e4m3"], Granularity.parse("tensor")
    # layer 0 sees the same input in both passes: its K/V are exactly the table-scaled quantization
    k0, v0 = stored.layers[0].k.values, stored.layers[0].v.values
    raw_k0, raw_v0 = raw.layers[0].k.values, raw.layers[0].v.values
    assert torch.equal(k0, quantize_dequantize(raw_k0, fmt, tensor, scale=torch.tensor(0.002).reshape(1, 1, 1, 1)))
    assert torch.equal(v0, quantize_dequantize(raw_v0, fmt, tensor, scale=torch.tensor(0.003).reshape(1, 1, 1, 1)))
    # every stored code is on the FP8 grid of its layer's own scale, saturated at 448
    for layer in (0, 1):
        for st, scale in (
            (stored.layers[layer].k, (0.002, 0.004)[layer]),
            (stored.layers[layer].v, (0.003, 0.005)[layer]),
        ):
            assert float(st.fixed.flatten()[0]) == pytest.approx(scale)
            codes = st.codes.float()
            assert codes.abs().max() <= 448
            assert torch.equal(st.values, codes * st.fixed)


def test_table_made_for_another_format_is_refused(tmp_path, tiny):
    from evalkit.integration.binding import BoundScheme
    from evalkit.kv.scheme import parse_scheme

    meta = {"format": "fp8_e4m3", "config_hash": config_hash(tiny.model.config)}
    path = write(tmp_path / "e4m3.safetensors", torch.ones(2), torch.ones(2), meta)
    BoundScheme(parse_scheme(f"fp8_e4m3/tensor/static+scales={path}"), kv_layout(tiny.model.config))
    with pytest.raises(ScaleError, match="calibrated for fp8_e4m3"):
        BoundScheme(parse_scheme(f"fp8_e5m2/tensor/static+scales={path}"), kv_layout(tiny.model.config))
