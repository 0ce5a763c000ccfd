"""Serving capacity, admission and speed measured from vLLM (``capacity --engine vllm``).

Without vLLM (the main environment) the logic is tested on made-up engine numbers: the split of a
step's tokens into prefill and decode, speeds, admission from running/waiting counts, the
comparison with evalkit's count and the term that explains a mismatch, the rows and the table, and
the command line's refusals; the engine tests skip, printing why. With vLLM
(``/opt/vllm/bin/python -m pytest -q tests/engines/test_vllm_serving.py``): the embedded model's
allocation in 2 GiB (BF16 against FP8 E4M3 within 1 % of evalkit's ratio), admission and speed
under a tiny budget, and the command line end to end. Each engine start takes 10-40 s.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from evalkit.cli import main
from evalkit.engines.vllm import serving as vs
from evalkit.engines.vllm import serving_results as vr
from evalkit.errors import EvalkitError

from tests.cli_checks import one_line_exit_2
from tests.engines.vllm_env import MISSING, needs_vllm

BF16_BPT = 30 * 2 * 3 * 64 * 2  # the embedded model: 30 layers, K and V, 3 KV heads x head_dim 64, 2 bytes


def alloc(kvd="auto", budget=2 << 30, bpt=BF16_BPT, block=128, context=2048, null=1):
    blocks = budget // (bpt * block)
    return vr.Allocation(
        kvd,
        budget,
        context,
        blocks,
        block,
        blocks * block * bpt,
        blocks / math.ceil(context / block),
        blocks - null,
        30,
    )


# -- without the engine ------------------------------------------------------------------------------
def test_split_tokens_prefill_then_decode_and_recompute():
    assert vr.split_tokens(0, 248, 248) == (248, 0)  # the prompt in one step
    assert vr.split_tokens(248, 249, 248) == (0, 1)  # one decode token
    assert vr.split_tokens(128, 256, 200) == (72, 56)  # a chunk crossing the prompt's end
    assert vr.split_tokens(250, 251, 248) == (0, 1)
    assert vr.split_tokens(252, 251, 248) == (248, 3)  # preempted, then recomputed from 0 in the step


def test_speeds_and_admission_from_steps():
    steps = [
        vr.Step(2.0, 4, 3, 4 * 100, 0, 0, 4),  # the prompts of 4 requests, 3 left waiting
        vr.Step(0.5, 4, 3, 0, 4, 0, 4),
        vr.Step(0.5, 0, 3, 0, 4, 0, 4),
        vr.Step(1.0, 3, 0, 300, 0, 0, 3),
        vr.Step(0.25, 3, 0, 0, 3, 0, 3),
    ]
    run = vr.LoadRun(7, 100, 2, steps)
    assert run.admitted == 4 and run.peak_running == 4 and run.preemptions == 0
    prefill, decode = vr.speeds(steps)
    assert prefill == pytest.approx(700 / 3.0) and decode == pytest.approx(11 / 1.25)
    assert vr.speeds(steps, running=4) == (pytest.approx(700 / 3.0), pytest.approx(8 / 1.0))
    assert vr.LoadRun(1, 100, 2, [vr.Step(1.0, 1, 0, 100, 0, 0, 1)]).admitted is None  # no queue: nothing measured
    assert vr.speeds([]) == (None, None)


def test_compare_exact_block_rounding_and_storage_terms():
    exact = vr.compare(alloc(), Fraction(BF16_BPT))
    assert not exact.flagged and exact.terms == () and exact.computed_tokens == (2 << 30) // BF16_BPT
    assert exact.ratio == pytest.approx(93184 / 93206)

    tiny = vr.compare(alloc(budget=32 << 20), Fraction(BF16_BPT))  # 11 blocks of 128 where 1,456 tokens fit
    assert tiny.flagged and len(tiny.terms) == 1 and tiny.terms[0].startswith("block rounding: whole blocks of 128")
    assert "48 of 1,456 tokens" in tiny.terms[0]

    f32 = vr.compare(alloc(bpt=2 * BF16_BPT, block=32), Fraction(BF16_BPT), engine_dtype="float32")
    assert f32.flagged and f32.ratio == pytest.approx(0.5, abs=1e-3)
    assert f32.terms[0].startswith("per-token storage: the engine stores 46,080.00 B/token, evalkit counts 23,040.00")
    assert "model dtype float32" in f32.terms[0] and not any(t.startswith("unexplained") for t in f32.terms)


def test_kv_cache_dtypes_budget_and_refusal_lines():
    assert vs.check_kv_cache_dtypes(None, "vllm-cpu") == ("auto", "fp8_e4m3", "fp8_e5m2")
    assert vs.check_kv_cache_dtypes(["fp8_e4m3", " auto", "fp8_e4m3"], "vllm-cpu") == ("fp8_e4m3", "auto")
    with pytest.raises(EvalkitError, match="vllm-cpu has no kv_cache_dtype 'int8': use auto, fp8, fp8_e4m3, fp8_e5m2"):
        vs.check_kv_cache_dtypes(["auto", "int8"], "vllm-cpu")
    assert vs.check_budget(0.5) == 1 << 29
    for bad in (0, -1, "x", float("inf")):
        with pytest.raises(EvalkitError, match="--budget-gib must be a"):
            vs.check_budget(bad)
    vllm_says = (
        "To serve at least one request with the model's max seq len (4096), (0.09 GiB KV cache is needed, "
        "which is larger than the available KV cache memory (0.01 GiB)."
    )
    line = vs.too_small(vllm_says, 10 << 20, 4096, "auto", 90 << 20)
    assert "holds no request of 4,096 tokens" in line and "vLLM needs 0.09 GiB" in line and "raise --budget-gib" in line
    assert "not one cache block fits" in vs.too_small(
        "No available memory for the cache blocks. Try", 1, 2048, "auto", 5
    )
    assert vs.too_small("some other refusal", 1, 2048, "auto", 5) is None


def _measurement(kvd, bpt, scheme, admitted=None):
    a = alloc(kvd, budget=32 << 20, bpt=bpt, context=256)
    m = vr.Measurement(a, vr.compare(a, Fraction(bpt)), scheme, {"engine": "vllm", "engine_block_size": 128})
    if admitted:
        m.single = vr.LoadRun(1, 248, 8, [vr.Step(2.0, 1, 0, 248, 0, 0, 1), vr.Step(0.1, 0, 0, 0, 1, 0, 1)])
        m.load = vr.LoadRun(
            admitted + 2,
            248,
            8,
            [
                vr.Step(4.0, admitted, 2, 248 * admitted, 0, 0, admitted),
                vr.Step(0.2, admitted, 2, 0, admitted, 0, admitted),
            ],
        )
    return m


def test_rows_and_table():
    ms = [
        _measurement("auto", BF16_BPT, "auto", 5),
        _measurement("fp8_e4m3", BF16_BPT // 2, "fp8_e4m3/tensor/unit", 10),
    ]
    rows = vr.serving_rows(ms)
    by = {(r.metric, r.labels["kv_cache_dtype"], r.labels.get("batch")): r for r in rows}
    assert by[("kv_tokens", "fp8_e4m3", None)].value == 22 * 128
    assert by[("capacity_vs_auto", "fp8_e4m3", None)].value == 2.0
    assert by[("computed_capacity_vs_auto", "fp8_e4m3", None)].value == 2.0
    assert by[("admitted_requests", "fp8_e4m3", None)].value == 10
    assert by[("decode_tok_s", "auto", 5)].value == pytest.approx(5 / 0.2)
    assert by[("prefill_tok_s", "auto", 1)].value == pytest.approx(124.0)
    flagged = by[("capacity_ratio_vs_computed", "auto", None)]
    assert flagged.info["flagged"] and flagged.info["mismatch_terms"][0].startswith("block rounding")
    assert all(r.labels["budget_bytes"] == 32 << 20 and r.labels["context"] == 256 for r in rows)
    json.dumps([r.to_dict() for r in rows])  # storable as they are
    table = vr.serving_table(rows)
    assert list(table["kv_cache_dtype"]) == ["auto", "fp8_e4m3"] and list(table["admitted"]) == [5, 10]
    md = vr.format_serving_table(table, "md")
    assert "| auto" in md and "2,816" in md and "block rounding" in md
    assert vr.format_serving_table(table, "csv").splitlines()[0].startswith("kv_cache_dtype,KV tokens,")


def test_cli_refuses_engine_input_in_one_line(capsys, tmp_path):
    one_line_exit_2(
        ["capacity", "--preset", "kimi-k2", "--engine", "vllm"], capsys, "--engine vllm measures a model folder"
    )
    one_line_exit_2(
        ["capacity", "--model", "embedded", "--engine", "vllm", "--budget-gib", "0"],
        capsys,
        "--budget-gib must be a positive number",
    )
    one_line_exit_2(
        ["capacity", "--model", "embedded", "--engine", "vllm", "--json", "--format", "md"],
        capsys,
        "--json and --format md disagree",
    )
    one_line_exit_2(
        ["capacity", "--preset", "kimi-k2", "--load"],
        capsys,
        "--load is for measuring with an engine: add --engine vllm",
    )
    one_line_exit_2(
        ["capacity", "--preset", "kimi-k2", "--format", "csv"], capsys, "--format is for measuring with an engine"
    )


@pytest.mark.skipif(MISSING is None, reason="vLLM is installed here")
def test_cli_without_vllm_says_so(capsys):
    one_line_exit_2(["capacity", "--model", "embedded", "--engine", "vllm"], capsys, "vLLM is not installed")


# -- with the engine -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def embedded():
    from evalkit.models.info import kv_layout
    from evalkit.models.loading import model_source
    from evalkit.models.presets import config_namespace

    folder, _ = model_source("embedded")
    with open(f"{folder}/config.json") as fh:
        return folder, kv_layout(config_namespace(json.load(fh)))


@needs_vllm
def test_allocator_capacity_bf16_against_fp8_matches_evalkits_ratio(embedded):
    ms = vs.measure(*embedded, ["auto", "fp8_e4m3"], budget_bytes=2 << 30, context=2048)
    auto, fp8 = ms
    assert (auto.allocation.kv_tokens, fp8.allocation.kv_tokens) == (93184, 186368)  # whole blocks of 128
    assert auto.allocation.bytes_per_token == BF16_BPT and fp8.allocation.bytes_per_token == BF16_BPT // 2
    assert fp8.scheme == "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"
    engine_ratio = fp8.allocation.kv_tokens / auto.allocation.kv_tokens
    computed_ratio = auto.comparison.computed_bytes_per_token / fp8.comparison.computed_bytes_per_token
    assert abs(engine_ratio / computed_ratio - 1) < 0.01  # the done-when figure
    assert not auto.comparison.flagged and not fp8.comparison.flagged
    assert auto.allocation.max_concurrency == pytest.approx(93184 / 2048)
    assert (
        auto.info["engine"] == "vllm"
        and auto.info["engine_profile"] == "vllm-cpu"
        and auto.info["kv_cache_dtype"] == "auto"
    )


@needs_vllm
def test_admission_and_speed_under_a_tiny_budget(embedded):
    ms = vs.measure(*embedded, ["auto", "fp8_e4m3"], budget_bytes=16 << 20, context=256, load=True, decode_tokens=4)
    for m in ms:
        a = m.allocation
        assert a.usable_blocks == a.num_blocks - 1  # vLLM's null block
        per_request = math.ceil(256 / a.block_size)
        assert m.load.admitted == a.usable_blocks // per_request  # measured from running/waiting, equal to the blocks
        assert m.load.requests > m.load.admitted and m.load.preemptions == 0
        assert m.single.admitted is None and sum(s.decode_tokens for s in m.single.steps) == 3
        assert sum(s.prefill_tokens for s in m.load.steps) == m.load.requests * 252
    auto, fp8 = ms
    assert fp8.load.admitted >= 2 * auto.load.admitted
    rows = vr.serving_rows(ms)
    speed = [r for r in rows if r.metric in ("prefill_tok_s", "decode_tok_s")]
    assert {r.labels["batch"] for r in speed} == {1, auto.load.admitted, fp8.load.admitted} and all(
        r.value > 0 for r in speed
    )


@needs_vllm
def test_cli_end_to_end_json_and_out(capsys, tmp_path):
    capsys.readouterr()
    assert (
        main(
            [
                "capacity",
                "--engine",
                "vllm",
                "--model",
                "embedded",
                "--kv-cache-dtypes",
                "fp8_e4m3",
                "--budget-gib",
                "0.015625",
                "--context",
                "256",
                "--format",
                "json",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    doc = json.loads(capsys.readouterr().out)
    kv = next(r for r in doc["rows"] if r["metric"] == "kv_tokens")
    assert kv["value"] == (16 << 20) // (BF16_BPT // 2 * 128) * 128 and kv["labels"]["kv_cache_dtype"] == "fp8_e4m3"
    records = [json.loads(line) for line in (tmp_path / "serving.jsonl").read_text().splitlines()]
    assert len(records) == len(doc["rows"]) and {r["eval"] for r in records} == {"serving"}
    assert (tmp_path / "serving.csv").read_text().startswith("kv_cache_dtype,")
    one_line_exit_2(
        ["capacity", "--engine", "vllm", "--model", "embedded", "--budget-gib", "0.01", "--context", "4096"],
        capsys,
        "holds no request of 4,096 tokens",
        "raise --budget-gib",
    )


# -- the serving evaluation ------------------------------------------------------------------------------
def test_serving_eval_registers_and_checks_its_params():
    from evalkit.engines.vllm.serving_eval import ServingEval
    from evalkit.evals.base import get_eval

    assert get_eval("serving") is ServingEval and ServingEval.name == "serving"
    assert ServingEval({"budget_gib": 0.5, "context": 256}).params == {
        "budget_gib": 0.5,
        "context": 256,
        "load": False,
        "decode_tokens": 16,
    }
    with pytest.raises(EvalkitError, match="--serving-budget-gib must be a positive number"):
        ServingEval({"budget_gib": 0})
    with pytest.raises(EvalkitError, match="unknown serving parameter"):
        ServingEval({"budget": 1})


@needs_vllm
def test_serving_eval_measures_the_scheme_through_its_engine_config(embedded):
    from types import SimpleNamespace

    import torch

    from evalkit.engines.vllm.serving_eval import ServingEval

    folder, layout = embedded
    lm = SimpleNamespace(path=folder, layout=layout, model=None, dtype=torch.bfloat16)  # an engine run's handle
    ev = ServingEval({"budget_gib": 1 / 64, "context": 256})
    ev.prepare(lm, None)
    rows = {r.metric: r for r in ev.evaluate(lm, "fp8_e4m3/tensor/unit")}
    assert rows["kv_tokens"].value == 1408 and rows["kv_tokens"].labels["kv_cache_dtype"] == "fp8_e4m3"
    assert (
        rows["computed_bytes_per_token"].value == BF16_BPT // 2 and rows["kv_tokens"].info["engine_dtype"] == "bfloat16"
    )
