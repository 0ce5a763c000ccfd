"""Batched lm-eval is exact: per item, batch size 8 (and ``auto``) gives batch size 1's
log-likelihoods under every scheme, and lm-eval's own HFLM (right padding, no mask) does not.

The requests are lm-eval's own (built by the tasks in ``tasks/lmeval``) and go through
``HFLM.loglikelihood`` / ``loglikelihood_rolling`` / ``generate_until`` exactly as
``simple_evaluate`` sends them. Tolerance: |a - b| <= 1e-5 + 1e-6 |a| (float32 log-likelihoods
summed over up to ~1000 tokens); on CPU the two are in fact bit for bit equal.
"""

from __future__ import annotations

import pytest
import torch

from evalkit import quantized_kv
from evalkit.errors import EvalkitError

SCHEMES = [
    "auto",
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e4m3/block16/dynamic",
    "int4_asym/group8/dynamic",
]
DYNAMIC = "fp8_e4m3/tensor/dynamic"


def close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-5 + 1e-6 * abs(a)


def requests(task: str, limit: int):
    """lm-eval's request instances for the first ``limit`` documents of ``task``."""
    from lm_eval.tasks import get_task_dict

    from evalkit.evals.lmeval.adapter import resolve_tasks

    tasks = resolve_tasks([task])
    (built,) = get_task_dict([task], tasks.manager).values()
    built.build_all_requests(limit=limit, rank=0, world_size=1)
    return built.instances


def logliks(hflm, model, scheme: str, reqs) -> list[float]:
    with quantized_kv(model, scheme):
        if reqs[0].request_type == "loglikelihood_rolling":
            return hflm.loglikelihood_rolling(reqs, disable_tqdm=True)
        return [ll for ll, _ in hflm.loglikelihood(reqs, disable_tqdm=True)]


def worst(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) - 1e-6 * abs(x) for x, y in zip(a, b))


# ---- the batch size parameter ------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, expected", [(None, None), (1, 1), ("8", 8), (" 16 ", 16), ("auto", "auto"), ("AUTO", "auto")]
)
def test_batch_size_values(value, expected):
    from evalkit.evals.lmeval.batching import parse_batch_size

    assert parse_batch_size(value) == expected


@pytest.mark.parametrize("value", [0, -1, "0", "-3", 1.5, "1.5", 8.0, "eight", "", True, "auto:4"])
def test_bad_batch_size_is_refused(value):
    from evalkit.evals.lmeval.evaluation import LmEvalEval

    with pytest.raises(EvalkitError, match="batch_size .* must be a whole number >= 1 or 'auto'") as err:
        LmEvalEval({"tasks": "evalkit_mmlu4", "batch_size": value})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("flag", ["0", "-2", "1.5", "many"])
def test_cli_bad_batch_size_is_one_line_and_exit_2(flag, tmp_path, capsys):
    from evalkit.cli import main

    out = tmp_path / "out"
    assert (
        main(
            [
                "run",
                "--eval",
                "lmeval",
                "--lmeval-tasks",
                "evalkit_mmlu4",
                "--lmeval-batch-size",
                flag,
                "--out",
                str(out),
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lmeval-batch-size" in err[0] and repr(flag) in err[0]
    assert not out.exists()


def test_default_batch_size_follows_the_device():
    from evalkit.evals.lmeval.batching import CPU_BATCH_SIZE, default_batch_size

    assert default_batch_size("cpu") == CPU_BATCH_SIZE
    assert default_batch_size(torch.device("cuda", 0)) == "auto"


def test_requests_differing_only_by_trailing_zeros_go_to_separate_calls():
    from evalkit.evals.lmeval.batching import loglikelihood_calls, padded_lengths

    reqs = [
        (None, [5, 6], [0, 9]),
        (None, [5, 6], [9]),
        (None, [7], [8, 9]),
        (None, [5, 6, 0], [0, 3]),
        (None, [1, 2, 3, 4, 5], [6, 7]),
    ]
    # inputs (context + continuation)[-5:][:-1]: [5, 6, 0], [5, 6], [7, 8], [5, 6, 0, 0], [3, 4, 5, 6]
    calls = loglikelihood_calls(reqs, max_length=4)
    assert calls == [({(5, 6): 3, (7, 8): 2, (3, 4, 5, 6): 4}, [0, 2, 4]), ({(5, 6): 2}, [1]), ({(5, 6): 4}, [3])]
    assert padded_lengths([[5, 6, 0, 0], [7, 8, 0, 0], [3, 4, 5, 6]], calls[0][0]) == [3, 2, 4]
    with pytest.raises(RuntimeError, match="matches none"):
        padded_lengths([[1, 1, 0, 0]], calls[0][0])


# ---- the tiny model ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    from evalkit.models.loading import load_model

    return load_model(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def tiny_requests():
    return {
        "mmlu": requests("evalkit_mmlu4", 8),
        "rolling": requests("evalkit_topics_ppl", 2),
        "generate": requests("evalkit_passkey", 4),
    }


@pytest.mark.parametrize("scheme", SCHEMES)
def test_tiny_batch_8_equals_batch_1(tiny, tiny_requests, scheme):
    from evalkit.evals.lmeval.adapter import make_hflm

    one, eight = make_hflm(tiny.model, tiny.tokenizer, 1), make_hflm(tiny.model, tiny.tokenizer, 8)
    for kind in ("mmlu", "rolling"):
        a = logliks(one, tiny.model, scheme, tiny_requests[kind])
        b = logliks(eight, tiny.model, scheme, tiny_requests[kind])
        assert all(close(x, y) for x, y in zip(a, b)), (kind, worst(a, b))


def test_tiny_auto_batch_size_equals_batch_1(tiny, tiny_requests):
    from evalkit.evals.lmeval.adapter import make_hflm

    auto = make_hflm(tiny.model, tiny.tokenizer, "auto")
    assert auto.batch_size == "auto"
    a = logliks(make_hflm(tiny.model, tiny.tokenizer, 1), tiny.model, DYNAMIC, tiny_requests["mmlu"])
    b = logliks(auto, tiny.model, DYNAMIC, tiny_requests["mmlu"])
    assert all(close(x, y) for x, y in zip(a, b)), worst(a, b)


def test_tiny_generation_is_batch_independent(tiny, tiny_requests):
    """generate_until: lm-eval left-pads with a mask itself and the storage cache leaves the padding
    out of every scale: the greedy continuations are batch size 1's (its logits are equal to float
    rounding only: see evalkit/evals/lmeval/batching.py)."""
    from evalkit.evals.lmeval.adapter import make_hflm

    reqs = tiny_requests["generate"]
    for scheme in (DYNAMIC, "fp8_e4m3/block16/dynamic"):
        with quantized_kv(tiny.model, scheme):
            a = make_hflm(tiny.model, tiny.tokenizer, 1).generate_until(reqs, disable_tqdm=True)
            b = make_hflm(tiny.model, tiny.tokenizer, 8).generate_until(reqs, disable_tqdm=True)
        assert a == b and any(a), scheme


def test_tiny_without_the_fix_a_dynamic_scheme_depends_on_the_batch(tiny, tiny_requests):
    """lm-eval's own HFLM (right padding, no mask): the padding enters the dynamic scales (here the
    block scales of each row's last, partly filled block of 16 tokens)."""
    from lm_eval.models.huggingface import HFLM

    from evalkit.evals.lmeval.adapter import make_hflm

    reqs = tiny_requests["mmlu"]
    scheme = "fp8_e4m3/block16/dynamic"
    a = logliks(make_hflm(tiny.model, tiny.tokenizer, 1), tiny.model, scheme, reqs)
    b = logliks(HFLM(pretrained=tiny.model, tokenizer=tiny.tokenizer, batch_size=8), tiny.model, scheme, reqs)
    assert worst(a, b) > 1e-4


def test_batch_size_1_is_lm_evals_own_call(tiny, tiny_requests):
    """Batch size 1 (and any unpadded batch) calls the model exactly as lm-eval does: same numbers
    to the last digit as lm-eval's own HFLM."""
    from lm_eval.models.huggingface import HFLM

    from evalkit.evals.lmeval.adapter import make_hflm

    reqs = tiny_requests["mmlu"]
    ours = logliks(make_hflm(tiny.model, tiny.tokenizer, 1), tiny.model, DYNAMIC, reqs)
    theirs = logliks(HFLM(pretrained=tiny.model, tokenizer=tiny.tokenizer, batch_size=1), tiny.model, DYNAMIC, reqs)
    assert ours == theirs


# ---- the embedded model ------------------------------------------------------------------------


@pytest.mark.slow
def test_embedded_batch_8_equals_batch_1_and_lm_evals_padding_does_not(embedded):
    """16 MMLU questions (two batches of 8 rows of different lengths) under bf16 and four dynamic
    schemes; lm-eval's own HFLM at batch 8 moves the log-likelihoods under a dynamic scheme."""
    from lm_eval.models.huggingface import HFLM

    from evalkit.evals.lmeval.adapter import make_hflm

    reqs = requests("evalkit_mmlu4", 16)
    one, eight = make_hflm(embedded.model, embedded.tokenizer, 1), make_hflm(embedded.model, embedded.tokenizer, 8)
    for scheme in SCHEMES:
        a, b = logliks(one, embedded.model, scheme, reqs), logliks(eight, embedded.model, scheme, reqs)
        assert all(close(x, y) for x, y in zip(a, b)), (scheme, worst(a, b))
        if scheme == DYNAMIC:
            plain = logliks(
                HFLM(pretrained=embedded.model, tokenizer=embedded.tokenizer, batch_size=8),
                embedded.model,
                scheme,
                reqs,
            )
            assert worst(a, plain) > 1e-3
