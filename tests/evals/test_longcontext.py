"""longcontext: the paired statistics against plain computations, the per-item records of lm-eval samples,
the shipped stand-ins against lm-eval's own task configurations and generators' rules, and bad input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from evalkit.errors import EvalkitError
from evalkit.evals.longcontext import items as I
from evalkit.evals.longcontext.paired import compare, holm

from tests.evals import paired_reference as R

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tasks" / "longcontext"


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


# ---- paired statistics -----------------------------------------------------------------------


def test_binary_pairs_take_the_exact_mcnemar_test():
    base = [1] * 30 + [0] * 10
    scheme = [0] * 7 + [1] * 23 + [1] * 2 + [0] * 8  # 7 right-to-wrong, 2 wrong-to-right
    r = compare(scheme, base)
    assert r.binary and r.test == "mcnemar_exact" and (r.right_to_wrong, r.wrong_to_right) == (7, 2)
    # by hand: two-sided exact binomial test of 2 of 9 discordant pairs at 1/2
    assert r.p_value == pytest.approx(min(1.0, 2 * stats.binom.cdf(2, 9, 0.5)))
    assert r.diff == pytest.approx((25 - 30) / 40) and r.discordance == pytest.approx(9 / 40)
    assert r.score_ci == pytest.approx(wilson(25, 40)) and r.discordance_ci == pytest.approx(wilson(9, 40))
    assert r.diff_ci[0] < r.diff < r.diff_ci[1]


def test_identical_scores_have_no_difference_and_p_one():
    r = compare([1, 0, 1, 1], [1, 0, 1, 1])  # 0/1 scores: 0 of 4 changed gives about Wilson's width
    wilson_high = stats.binomtest(0, 4).proportion_ci(method="wilson").high
    assert r.diff == 0 and r.p_value == 1.0 and r.discordance == 0
    assert r.diff_ci == pytest.approx((-wilson_high, wilson_high), abs=1e-9)
    r = compare([0.2, 0.6, 1.0, 0.0], [0.2, 0.6, 1.0, 0.0])  # fractional: the t interval of zeros
    assert r.diff == 0 and r.diff_ci == (0.0, 0.0) and r.p_value == 1.0 and r.discordance == 0


def test_binary_difference_is_tangos_interval():
    base = [1] * 30 + [0] * 10
    scheme = [0] * 7 + [1] * 23 + [1] * 2 + [0] * 8  # 7 right-to-wrong, 2 wrong-to-right
    assert compare(scheme, base).diff_ci == pytest.approx(R.tango_brute(7, 2, 40), abs=1e-7)


def test_holm_adjusts_like_the_textbook():
    p = [0.01, 0.04, 0.03, 0.005, float("nan")]
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4 = 0.02, x3 = 0.03, x2 = 0.06, x1 = 0.04 raised to 0.06 (step-down)
    assert holm(p)[:4] == pytest.approx([0.03, 0.06, 0.06, 0.02]) and math.isnan(holm(p)[4])


def test_fractional_scores_take_the_paired_t():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.4, 1.0, 200)
    scheme = np.clip(base - 0.1 + rng.normal(0, 0.05, 200), 0, 1)
    r = compare(scheme, base)
    assert not r.binary and r.test == "paired_t" and r.p_value < 0.01
    d = scheme - base
    assert r.diff == pytest.approx(d.mean())
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert r.diff_ci == pytest.approx((lo, hi), abs=1e-12)
    assert r.p_value == pytest.approx(stats.ttest_rel(scheme, base).pvalue, abs=1e-12)
    assert r.score_ci == pytest.approx(stats.t.interval(0.95, 199, loc=scheme.mean(), scale=stats.sem(scheme)))
    noise = compare(base + rng.normal(0, 0.01, 200), base)  # no shift: no evidence
    assert noise.p_value > 0.05


# ---- per-item records ------------------------------------------------------------------------


def _ruler_sample(doc_id, length, score, text):
    doc = {"max_length": length, "length": length - 40, "outputs": ["1234567"]}
    return {
        "doc_id": doc_id,
        "doc": doc,
        "doc_hash": f"h{doc_id}",
        "filter": "none",
        "filtered_resps": [text],
        "metrics": [str(length)],
        str(length): score,
    }


def test_records_take_rulers_length_metric_and_longbenchs_class():
    s = I.record("niah_single_1", _ruler_sample(3, 8192, 1.0, " 1234567."), "generate_until")
    assert (s["length"], s["score"], s["prediction"]) == ("8192", 1.0, " 1234567.")
    mc = {
        "doc_id": 0,
        "doc": {"length": "medium", "answer": "B"},
        "filtered_resps": [(-3.0, False), (-1.0, False), (-1.0, False), (-5.0, False)],
        "metrics": ["acc"],
        "acc": 1.0,
    }
    r = I.record("longbench2_table", mc, "multiple_choice")
    assert (r["length"], r["score"], r["prediction"]) == ("medium", 1.0, 1)  # first maximum, as lm-eval's acc
    assert I.length_of({}) == "all"
    assert sorted(["all", "long", "131072", "short", "4096"], key=I.length_order) == [
        "4096",
        "131072",
        "short",
        "long",
        "all",
    ]


def test_pairing_refuses_other_items():
    a = [I.record("t", _ruler_sample(i, 4096, 1.0, "x"), "generate_until") for i in range(3)]
    assert len(I.pair(a, a)) == 3
    with pytest.raises(EvalkitError, match="differ from the baseline"):
        I.pair(a, a[:2])
    other = [dict(r, doc_hash="z") for r in a]
    with pytest.raises(EvalkitError, match="another document"):
        I.pair(a, other)


class _Task:
    def __init__(self, docs):
        self.eval_docs = docs


def test_limit_takes_the_first_items_of_each_length():
    docs = [{"max_length": 4096}] * 3 + [{"max_length": 8192}] * 3
    tasks = {"niah": _Task(docs), "lb": _Task([{"length": "short"}, {"length": "long"}, {"length": "short"}])}
    assert I.select_documents(tasks, 2) == {"niah": [0, 1, 3, 4], "lb": [0, 1, 2]}
    assert I.select_documents(tasks, 1, {"lb": None}) == {"niah": [0, 3], "lb": [0, 1, 2]}
    assert I.select_documents(tasks, None) is None


# ---- the shipped stand-ins -------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


def _yaml(path: Path) -> dict:
    return yaml.load(path.read_text(), Loader=_Loader)


def _lm_eval_tasks() -> Path:
    import lm_eval

    return Path(lm_eval.__file__).parent / "tasks"


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURE / name).read_text().splitlines() if line]


def test_standins_keep_the_real_tasks_prompts_and_metrics():
    real_niah = _yaml(_lm_eval_tasks() / "ruler" / "niah_single_1.yaml")
    real_vt = _yaml(_lm_eval_tasks() / "ruler" / "vt.yaml")
    real_lb = _yaml(_lm_eval_tasks() / "longbench2" / "_longbench_common_yaml")
    niah = _yaml(FIXTURE / "longctx_ruler_niah_single_1.yaml")
    vt = _yaml(FIXTURE / "longctx_ruler_vt.yaml")
    lb = _yaml(FIXTURE / "longctx_longbench2.yaml")
    for key in ("output_type", "doc_to_text", "doc_to_target", "gen_prefix", "target_delimiter", "test_split"):
        assert niah[key] == real_niah[key], key
    assert {k: v for k, v in niah["generation_kwargs"].items() if k != "max_gen_toks"} == {
        k: v for k, v in real_niah["generation_kwargs"].items() if k != "max_gen_toks"
    }
    assert vt["generation_kwargs"] == real_vt["generation_kwargs"] and vt["include"] == niah["task"] + ".yaml"
    for key in ("output_type", "doc_to_text", "doc_to_choice", "doc_to_target", "metric_list"):
        assert lb[key] == real_lb[key], key
    # RULER's metrics are named by the length each item was built at, as the real tasks name them
    for cfg, items in ((niah, "ruler_niah_single_1.jsonl"), (vt, "ruler_vt.jsonl")):
        assert [m["metric"] for m in cfg["metric_list"]] == [
            str(n) for n in sorted({i["max_length"] for i in _jsonl(items)})
        ]


def test_ruler_items_follow_the_generators_rules():
    from transformers import AutoTokenizer

    from evalkit.models.loading import ensure_embedded

    tok = AutoTokenizer.from_pretrained(str(ensure_embedded("smollm2-135m")))
    for name, gen in (("ruler_niah_single_1.jsonl", 128), ("ruler_vt.jsonl", 30)):
        items = _jsonl(name)
        assert len(items) == 8 and len({i["max_length"] for i in items}) == 2
        for i in items:
            assert all(o in i["input"] for o in i["outputs"])
            # lm-eval's length: the prompt's tokens plus the generation budget (variable tracking: measured before
            # its answer prefix moved to gen_prefix, with its in-context example's tokens), within max_length
            tokens = len(tok(i["input"]).input_ids) + gen
            assert tokens == i["length"] if name.startswith("ruler_niah") else tokens <= i["length"]
            assert i["length"] <= i["max_length"]
    niah = _jsonl("ruler_niah_single_1.jsonl")[0]
    assert "One of the special magic numbers for" in niah["input"] and niah["gen_prefix"].startswith(
        "The special magic number for"
    )
    assert len(niah["outputs"]) == 1 and niah["outputs"][0].isdigit() and len(niah["outputs"][0]) == 7
    vt = _jsonl("ruler_vt.jsonl")[0]
    assert len(vt["outputs"]) == 5 and all(f"VAR {v} =" in vt["input"] for v in vt["outputs"])


def test_longbench_items_have_one_right_sentence():
    for item in _jsonl("longbench2.jsonl"):
        right = item["choices"]["ABCD".index(item["answer"])]
        assert right in item["context"] and sum(c in item["context"] for c in item["choices"]) == 1
        assert item["length"] in ("short", "medium")


def test_ruler_standin_score_is_the_share_of_values_found():
    import importlib.util

    spec = importlib.util.spec_from_file_location("longctx_utils", FIXTURE / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    doc = {"max_length": 768, "outputs": ["ABCDE", "FGHIJ", "KLMNO", "PQRST", "UVWXY"]}
    assert utils.process_results(doc, [" abcde, FGHIJ and KLMNO\n"]) == {"768": 3 / 5}  # case-blind, as RULER
    assert [i["max_length"] for i in utils.load_ruler_vt(max_seq_lengths=[1024])["test"]] == [1024] * 4
    with pytest.raises(ValueError, match="offline stand-in"):
        utils.load_ruler_niah_single_1(max_seq_lengths=[4096])


# ---- parameters ------------------------------------------------------------------------------


def test_parameters_and_their_one_line_errors():
    from evalkit.evals.base import get_eval

    ev = get_eval("longcontext")
    p = ev.validate({"lengths": "4k,128k,8k", "limit": 5, "limits": '{"longctx_longbench2": null}'})
    assert p["lengths"] == [4096, 8192, 131072] and p["limits"] == {"longctx_longbench2": None}
    for bad, match in (
        ({"limit": 0}, "whole number"),
        ({"lengths": "4q"}, "bad context length"),
        ({"limits": {"ruler": 3}}, "not among its tasks"),
        ({"limits": "{"}, "not valid JSON"),
    ):
        with pytest.raises(EvalkitError, match=match) as exc:
            ev.validate(bad)
        assert "\n" not in str(exc.value)


# ---- backends and schemes that read no quantized value --------------------------------------


def test_backends_are_asked_for_lm_evals_requests():
    from evalkit.evals.backend import use_backend
    from evalkit.evals.longcontext.evaluation import LongContextEval

    from tests.evals.test_backend import KnownBackend  # serves log-probs and decode only

    with pytest.raises(EvalkitError, match="lm-eval's loglikelihood") as exc:
        use_backend(LongContextEval({}), KnownBackend())
    assert "\n" not in str(exc.value)


def test_one_forward_tasks_are_not_measured_under_raw_prefill_schemes():
    from evalkit.evals.base import MetricRow
    from evalkit.evals.longcontext.evaluation import not_measured
    from evalkit.kv.scheme import parse_scheme

    results = {"configs": {"lb": {"output_type": "multiple_choice"}, "niah": {"output_type": "generate_until"}}}
    groups = {"both": ["lb", "niah"]}
    rows = [MetricRow(f"{t}/score", 0.5, 0.4, 0.6, labels={"task": t, "length": "all"}) for t in ("lb", "niah", "both")]
    marked = not_measured(parse_scheme("vllm:turboquant_k8v4"), results, groups, rows)
    assert [math.isnan(r.value) for r in marked] == [True, False, True] and "raw K/V" in marked[0].info["not_measured"]
    assert not_measured(parse_scheme("fp8_e4m3/tensor/unit"), results, groups, rows) == rows


# ---- existing grids ---------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["default", "engine", "llamacpp", "vllm-dtypes"])
def test_published_grids_ask_for_the_same_runs(store):
    """Adding longcontext left every existing evaluation's canonical parameters as they were: each published
    grid still asks for exactly the runs its store records (the grid identity hashes every run's canonical
    spec, eval parameters included; library versions and evalkit's code identity are not part of it)."""
    from evalkit.sweep.grid import parse_grid

    spec = json.loads((ROOT / "published" / store / "spec.json").read_text())
    assert parse_grid(ROOT / "published" / store / "grid.yaml").identity == spec["grid_identity"]
