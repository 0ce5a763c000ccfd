"""The KV codec registry (evalkit.kv.codec): a test-only family (tests/toy_codec.py), which no package file
names, parses and prints, runs through the storage cache on a tiny model with the bytes a plain reference
computes, counts its bytes, and appears in ``python -m evalkit schemes``; the built-in families are found
by a process that imports nothing but the scheme grammar."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from evalkit.errors import EvalkitError, SchemeError
from evalkit.kv import codec
from evalkit.kv.scheme import parse_scheme, parse_schemes

from tests.tiny_models import tiny_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def toy_codec():
    """The test-only ``toy`` family, registered for one test."""
    from tests.toy_codec import TOY_FAMILY

    codec.register_family(TOY_FAMILY)
    yield TOY_FAMILY
    codec.unregister_family("toy")


def test_a_test_only_family_parses_prints_and_refuses_in_one_line(toy_codec):
    scheme = parse_scheme("toy:i8h+skip=0,2")
    assert str(scheme) == "toy:i8h+skip=0,2" and scheme.skip_layers == (0, 2)
    assert scheme.recipe.value == "toy_i8h" and codec.family_of(scheme.recipe) is toy_codec
    assert parse_scheme("int8/token/dynamic+recipe=toy_i8h") == parse_scheme("toy:i8h")  # the long form
    assert [str(s) for s in parse_schemes("toy:i8h,fp8_e4m3/tensor/dynamic,toy:i8h+skip=1")] == [
        "toy:i8h",
        "fp8_e4m3/tensor/dynamic",
        "toy:i8h+skip=1",
    ]
    for text, words in (
        ("int8/token/dynamic+recipe=toy_i8h+rounding=rtz", "a test-only engine's i8h store, which fixes"),
        ("toy:i4", "no cache type 'i4'"),
        ("fp8_e4m3/tensor/dynamic+recipe=nope", "use one of standard, sglang, vllm_cpu"),
    ):
        with pytest.raises(SchemeError, match=words) as e:
            parse_scheme(text)
        assert "\n" not in str(e.value)
    assert "toy_i8h" in str(pytest.raises(SchemeError, parse_scheme, "int8/token/dynamic+recipe=nope").value)


def test_an_unregistered_family_is_an_unknown_scheme():
    assert "toy" not in codec.families()
    with pytest.raises(SchemeError, match="malformed KV scheme"):
        parse_scheme("toy:i8h")


def _reference_slot(x: np.ndarray) -> np.ndarray:
    """Plain numpy, row by row: int8 codes round(x / s) with s = float16(amax / 127) (1 for a zero row), then s."""
    rows = x.reshape(-1, x.shape[-1])
    out = []
    for row in rows:
        amax = np.abs(row).max()
        s = np.float16(amax / np.float32(127)) if amax > 0 else np.float16(1)
        codes = np.clip(np.round(row / np.float32(s)), -127, 127).astype(np.int8)
        out.append(np.frombuffer(codes.tobytes() + s.tobytes(), dtype=np.uint8))
    return np.stack(out).reshape(*x.shape[:-1], -1)


@torch.no_grad()
def test_a_test_only_family_runs_through_the_storage_cache(toy_codec):
    from transformers import DynamicCache

    from evalkit.integration.hf_compat import cache_inputs
    from evalkit.integration.install import quantized_kv
    from evalkit.kv.memory import bytes_per_token
    from evalkit.models.info import kv_layout

    model = tiny_model("llama")
    layout = kv_layout(model.config)
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(0))
    raw = DynamicCache()
    model(ids, **cache_inputs(model, raw))
    with quantized_kv(model, "toy:i8h") as session:
        cache = session.new_cache()
        quantized = model(ids, **cache_inputs(model, cache)).logits
    first = cache.layers[0]  # layer 0's K/V do not depend on the cache: the raw run's are its input
    raw_k, raw_v = raw.layers[0].keys, raw.layers[0].values
    np.testing.assert_array_equal(first.k.codes.numpy(), _reference_slot(raw_k.float().numpy()))
    np.testing.assert_array_equal(first.v.codes.numpy(), _reference_slot(raw_v.float().numpy()))
    d, heads, layers = layout.head_dim, layout.num_kv_heads, layout.num_layers
    for layer in cache.layers:  # what attention reads: each stored code times its stored float16 scale
        for st in (layer.k, layer.v):
            b = st.codes.numpy()
            want = b[..., :d].copy().view(np.int8).astype(np.float32) * b[..., d:].copy().view(np.float16).astype(
                np.float32
            )
            np.testing.assert_array_equal(st.decoded().numpy(), want)
    assert cache.nbytes() == 2 * 9 * layers * 2 * heads * (d + 2)  # batch, tokens, layers, K and V, heads, slot
    assert bytes_per_token(layout, parse_scheme("toy:i8h")) == layers * 2 * heads * (d + 2)
    baseline = model(ids).logits
    assert 0 < (quantized - baseline).abs().max() < 1.0  # int8 K/V: a small change, not none


def test_a_test_only_family_is_refused_on_a_model_it_does_not_store(toy_codec):
    from evalkit.integration.install import quantized_kv

    with pytest.raises(SchemeError, match="toy:i8h stores standard K/V rows") as e:
        with quantized_kv(tiny_model("deepseek_v3"), "toy:i8h"):
            pass
    assert "\n" not in str(e.value)


def test_a_test_only_family_appears_in_the_schemes_listing(toy_codec, capsys):
    from evalkit.cli import main

    assert main(["schemes"]) == 0
    out = capsys.readouterr().out
    assert "  toy:           a test-only engine: toy:i8h[+skip=...]\n" in out and "  vllm:  " in out
    env = {**os.environ, "EVALKIT_CODECS": "tests.toy_codec"}  # a process of its own: the plugin route
    for extra, shown in (({}, False), (env, True)):
        done = subprocess.run(
            [sys.executable, "-m", "evalkit", "schemes"],
            cwd=ROOT,
            env=extra or {k: v for k, v in os.environ.items() if k != "EVALKIT_CODECS"},
            capture_output=True,
            text=True,
            check=True,
        )
        assert ("toy:i8h[+skip=...]" in done.stdout) is shown
        assert "  llamacpp:      llama.cpp: llamacpp:<k>[/<v>]" in done.stdout


def test_the_built_in_families_load_when_the_grammar_is_first_asked():
    """A process that imports only the scheme grammar parses every family's schemes: the registry imports
    evalkit.kv.codecs itself, the first time it is asked."""
    code = (
        "import sys; from evalkit.kv.scheme import parse_scheme; "
        "assert not any(m.startswith('evalkit.kv.codecs') for m in sys.modules); "
        "print(parse_scheme('vllm:int4_per_token_head+skip=0'), parse_scheme('llamacpp:q8_0/q4_0'))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["vllm:int4_per_token_head+skip=0", "llamacpp:q8_0/q4_0"]


def test_the_registry_refuses_a_taken_prefix_or_recipe(toy_codec):
    from tests.toy_codec import ToyFamily

    with pytest.raises(EvalkitError, match="registered twice"):
        codec.register_family(ToyFamily())
    assert codec.register_family(toy_codec) is toy_codec  # the same family again: a no-op
    thief = type("Thief", (ToyFamily,), {"prefix": "thief"})()
    with pytest.raises(EvalkitError, match="recipe 'toy_i8h' of family 'thief' is family 'toy''s"):
        codec.register_family(thief)
    with pytest.raises(EvalkitError, match="must be lower-case"):
        codec.register_family(type("Bad", (ToyFamily,), {"prefix": "Bad-1"})())
    assert "thief" not in codec.families()
