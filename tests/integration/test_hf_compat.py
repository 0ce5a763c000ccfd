"""The transformers releases the storage path supports, and the differences between them it papers over."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers
from transformers import DynamicCache

from evalkit.integration import hf_compat
from evalkit.integration.hf_compat import (
    SUPPORTED,
    UnsupportedTransformersError,
    cache_inputs,
    cache_keyword,
    cache_layer_specs,
    check_transformers,
    output_cache,
    take_cache,
)


@pytest.mark.parametrize("version", ["5.17.0", "5.19.0", "5.24.0", "5.30.0.dev0", "5.17.0rc1"])
def test_supported_versions_pass(version):
    check_transformers(version)


@pytest.mark.parametrize("version", ["5.16.1", "5.0.0", "4.57.6", "6.0.0"])
def test_unsupported_versions_get_one_line_naming_both(version):
    with pytest.raises(UnsupportedTransformersError) as err:
        check_transformers(version)
    message = str(err.value)
    assert "\n" not in message and version in message and SUPPORTED in message and "pip install" in message


def test_installed_release_is_in_the_range():
    check_transformers()


def test_import_of_the_storage_path_refuses_an_unsupported_release():
    code = (
        "import transformers; transformers.__version__ = '5.10.0'\n"
        "from evalkit.errors import EvalkitError\n"
        "try:\n    import evalkit.integration.install\nexcept EvalkitError as e:\n    print('REFUSED', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("REFUSED transformers 5.10.0 is installed") and SUPPORTED in line


def test_cache_keyword_follows_the_model_signature(tiny):
    model = tiny.model
    names = set(__import__("inspect").signature(type(model.model).forward).parameters)
    expected = "cache" if "cache" in names else "past_key_values"
    assert cache_keyword(model.model) == expected == cache_keyword(model)
    assert cache_inputs(model, "C") == {expected: "C", "use_cache": True}


def test_cache_handed_over_and_read_back_on_the_installed_release(tiny):
    model = tiny.model
    ids = torch.randint(0, model.config.vocab_size, (2, 6))
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = model(ids, **cache_inputs(model, cache))
        assert output_cache(out) is cache and cache.get_seq_length() == 6
        out = model(ids[:, :1], **cache_inputs(model, cache))
    assert output_cache(out) is cache and cache.get_seq_length() == 7


def test_take_cache_accepts_either_name():
    assert take_cache({"past_key_values": None, "cache": "C"}) == "C"
    kwargs = {"past_key_values": "P", "x": 1}
    assert take_cache(kwargs) == "P" and kwargs == {"x": 1}
    assert take_cache({}) is None


@pytest.mark.parametrize("shape", ["one dict (5.17-5.18)", "one dict per layer (5.19+)"])
def test_layer_specs_per_layer_from_either_return_shape(monkeypatch, shape):
    types = ["full_attention", "sliding_attention", "full_attention"]
    kwargs = {"sliding_window": 8}
    value = kwargs if shape.startswith("one dict (") else [dict(kwargs) for _ in types]
    monkeypatch.setattr(hf_compat, "get_layer_types_and_kwargs", lambda cfg: (types, value))
    specs = cache_layer_specs(object())
    assert [kind for kind, _ in specs] == types and all(kw == kwargs for _, kw in specs)


def test_layer_specs_count_every_layer_on_the_installed_release(tiny):
    specs = cache_layer_specs(tiny.model.config)
    assert len(specs) == tiny.model.config.num_hidden_layers, transformers.__version__
