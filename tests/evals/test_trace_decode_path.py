"""A traces file is generated on the decode path the model was given: on ``static`` and ``compiled``
through the static storage cache, drawing per seed the tokens ``generate()`` draws on ``eager``;
a path that cannot serve the model is refused in one line."""

from __future__ import annotations

import dataclasses
import types

import pytest

from evalkit.errors import SchemeError
from evalkit.evals.generation.trace_decode import generate
from evalkit.kv.scheme import parse_scheme

from tests.tiny_models import tiny_model

PROMPTS = [[5, 17, 23, 9, 41, 7], [12, 3, 88, 19]]
SAMPLED = {"do_sample": True, "temperature": 0.7, "top_p": 0.95}


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    from evalkit.models.loading import load_model

    return load_model(str(tiny_llama_dir))


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch):
    monkeypatch.setenv("EVALKIT_COMPILE_BACKEND", "eager")


@pytest.mark.parametrize("scheme", [None, "fp8_e4m3/tensor/dynamic"])
@pytest.mark.parametrize("gen_kwargs", [SAMPLED, {"do_sample": False}], ids=["sampled", "greedy"])
def test_every_path_generates_the_eager_paths_tokens(tiny, scheme, gen_kwargs):
    scheme = None if scheme is None else parse_scheme(scheme)
    got = {
        path: generate(dataclasses.replace(tiny, decode_path=path), scheme, PROMPTS, 10, gen_kwargs, [0, 1])
        for path in ("eager", "static", "compiled")
    }
    assert got["static"] == got["eager"]
    assert got["compiled"] == got["eager"]
    assert all(len(s) == 2 and all(1 <= len(t) <= 10 for t in s) for s in got["eager"])
    if gen_kwargs["do_sample"]:
        assert any(s[0] != s[1] for s in got["eager"])  # the two seeds drew differently: samples compared


def test_a_path_that_cannot_serve_the_model_is_refused_in_one_line(tiny):
    lm = types.SimpleNamespace(model=tiny_model("gemma3"), tokenizer=tiny.tokenizer, device="cpu", decode_path="static")
    with pytest.raises(SchemeError) as err:
        generate(lm, None, [PROMPTS[0]], 4, SAMPLED, [0])
    assert "--decode-path eager" in str(err.value) and "\n" not in str(err.value)
