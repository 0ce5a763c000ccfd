"""lmeval: the offline task data, the per-item flip statistics, parameter checks, and the eval on a
tiny random llama (identity scheme reproduces the baseline exactly; quantized schemes change the
gold log-likelihoods; no request cache leaks across schemes)."""

from __future__ import annotations

import importlib.resources
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from evalkit.errors import EvalkitError

REPO_TASKS = Path(__file__).resolve().parents[2] / "tasks" / "lmeval"


def _load_task_utils():
    """tasks/lmeval/utils.py, loaded from its file as lm-eval's ``!function`` does (it is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("evalkit_test_lmeval_task_utils", REPO_TASKS / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


task_utils = _load_task_utils()


# ---- task data -------------------------------------------------------------------------------


def test_mmlu4_is_built_from_lm_evals_own_prompts():
    raw = json.loads(importlib.resources.files("lm_eval.tasks").joinpath(task_utils.MMLU_PROMPTS).read_text())
    data = task_utils.load_mmlu4()
    dev, test = list(data["dev"]), list(data["test"])
    assert len(raw) == 57 and len(dev) == 57 and {d["subject"] for d in dev} == set(raw)
    # independent count: "The answer is (X)" with X in A-D, minus questions that list an option (E)
    blocks = [b for text in raw.values() for b in text.split("\n\nQ: ")[1:]]
    four = [b for b in blocks if re.search(r"The answer is \([A-D]\)", b) and "(E)" not in b.split("\nA: ")[0]]
    assert len(dev) + len(test) == len(four) == 281
    for doc in dev + test:
        src = raw[doc["subject"]]
        assert doc["question"] in src and len(doc["choices"]) == 4 and all(doc["choices"])
        block = next(b for b in src.split("\n\nQ: ") if doc["question"] in b)
        assert f"The answer is ({'ABCD'[doc['answer']]})" in block
        assert all(c in block for c in doc["choices"])


def test_topic_documents_are_prose_from_pydoc():
    from evalkit.data.frozen import pydoc_topics

    topics = pydoc_topics()

    docs = task_utils.topic_documents(200)
    assert len(docs) > 100
    for d in docs:
        assert d["text"] and not re.search(r"^[ \t]", d["text"], flags=re.M)  # no indented code blocks
        assert all(p in topics[d["topic"]] for p in d["text"].split("\n\n"))
    assert sum(len(d["text"].split()) for d in docs) > 20000


def test_passkey_documents_and_scoring():
    docs = task_utils.passkey_documents(num_items=5, filler_repeats=4, seed=7)
    assert [d["depth"] for d in docs] == [0.0, 0.25, 0.5, 0.75, 1.0]
    for d in docs:
        assert re.fullmatch(r"\d{5}", d["passkey"]) and d["input"].count(d["passkey"]) == 2
        assert d["input"].endswith("The pass key is")
    assert docs[0]["input"].index(docs[0]["passkey"]) < docs[-1]["input"].index(docs[-1]["passkey"])
    key = docs[0]["passkey"]
    assert task_utils.passkey_results(docs[0], [f" {key}. Remember"]) == {"exact_match": 1.0}
    assert task_utils.passkey_results(docs[0], [f" 1{key}"]) == {"exact_match": 0.0}
    assert task_utils.passkey_results(docs[0], [" the grass"]) == {"exact_match": 0.0}


# ---- per-item statistics ---------------------------------------------------------------------


def _mc_sample(doc_id, lls, target):
    pred = int(np.argmax(lls))
    return {
        "doc_id": doc_id,
        "filter": "none",
        "doc_hash": f"h{doc_id}",
        "target": target,
        "filtered_resps": [(ll, False) for ll in lls],
        "metrics": ["acc", "acc_norm"],
        "acc": float(pred == target),
        "acc_norm": 0.0,
    }


def test_proportion_intervals_stay_inside_zero_one():
    from evalkit.evals.lmeval.evaluation import proportion_ci

    low, high = proportion_ci(
        0.25, 8, 0.25 - 1.96 * 0.16366, 0.25 + 1.96 * 0.16366
    )  # lm-eval's normal one: [-0.07, 0.57]
    assert 0 < low < 0.25 < high < 1 and (low, high) == pytest.approx((0.0715, 0.5907), abs=1e-4)  # Wilson, 2 of 8
    assert proportion_ci(0.3333, 7, -0.1, 0.8) == (0.0, 0.8)  # not k/7: the normal interval, clipped
    assert proportion_ci(0.5, 0, None, None) == (None, None)


def test_flip_statistics_against_hand_counts():
    from evalkit.evals.lmeval.items import compare_items, item_from_sample

    base_lls = [[-1, -2, -3, -4], [-2, -1, -3, -4], [-3, -2, -1, -4], [-4, -3, -2, -1], [-1, -5, -5, -5]]
    new_lls = [[-1, -2, -3, -4], [-1, -1.5, -3, -4], [-3, -2, -2.5, -4], [-1, -3, -2, -1.5], [-2, -5, -1, -5]]
    targets = [0, 0, 2, 3, 2]
    base = [
        item_from_sample(_mc_sample(i, lls, t), "multiple_choice") for i, (lls, t) in enumerate(zip(base_lls, targets))
    ]
    new = [
        item_from_sample(_mc_sample(i, lls, t), "multiple_choice") for i, (lls, t) in enumerate(zip(new_lls, targets))
    ]
    # by hand: predictions 0,1,2,3,0 -> 0,0,1,0,2; correct 1,0,1,1,0 -> 1,1,0,0,1
    assert [b["prediction"] for b in base] == [0, 1, 2, 3, 0] and [n["prediction"] for n in new] == [0, 0, 1, 0, 2]
    stats = compare_items(base, new)["none"]
    assert stats["flip_rate"][0] == 4 / 5
    assert stats["flip_right_to_wrong"][0] == 2 / 5  # items 2 and 3
    assert stats["flip_wrong_to_right"][0] == 2 / 5  # items 1 and 4
    gold_delta = [abs(n[t] - b[t]) for b, n, t in zip(base_lls, new_lls, targets)]  # 0, 1, 1.5, 0.5, 4
    assert stats["gold_loglik_abs_delta"][0] == pytest.approx(sum(gold_delta) / 5, abs=0)
    low, high = stats["flip_rate"][1:3]
    assert low < 0.8 < high  # 95 % Wilson interval for 4/5
    z = 1.959963984540054
    centre, half = (4 + z * z / 2) / (5 + z * z), z / (5 + z * z) * math.sqrt(4 * 1 / 5 + z * z / 4)
    assert (low, high) == pytest.approx((centre - half, centre + half))
    same = compare_items(base, base)["none"]
    assert same["flip_rate"][0] == 0 and same["gold_loglik_abs_delta"][0] == 0


def test_items_for_generation_and_rolling():
    from evalkit.evals.lmeval.items import compare_items, item_from_sample

    gen = {
        "doc_id": 0,
        "filter": "none",
        "doc_hash": "a",
        "filtered_resps": [" 12345"],
        "metrics": ["exact_match"],
        "exact_match": 1.0,
    }
    item = item_from_sample(gen, "generate_until")
    assert item["prediction"] == " 12345" and item["correct"] == 1.0 and item["gold_loglik"] is None
    roll = {
        "doc_id": 0,
        "filter": "none",
        "doc_hash": "b",
        "filtered_resps": [-123.5],
        "metrics": ["word_perplexity"],
        "word_perplexity": (-123.5, 40),
    }
    item = item_from_sample(roll, "loglikelihood_rolling")
    assert item["prediction"] is None and item["correct"] is None and item["gold_loglik"] == -123.5
    other = dict(item, gold_loglik=-120.0)
    stats = compare_items([item], [other])["none"]
    assert set(stats) == {"gold_loglik_abs_delta"} and stats["gold_loglik_abs_delta"][0] == 3.5
    with pytest.raises(EvalkitError, match="different document"):
        compare_items([item], [dict(other, doc_hash="c")])


# ---- parameters ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params, match",
    [
        ({"limit": 0}, "limit"),
        ({"limit": -3}, "limit"),
        ({"limit": 2.5}, "limit"),
        ({"num_fewshot": -1}, "num_fewshot"),
        ({"batch_size": 0}, "batch_size"),
        ({"tasks": ""}, "at least one task"),
        ({"colour": 1}, "unknown lmeval parameter"),
        ({"include": ["/no/such/folder"]}, "does not exist"),
        ({"metadata": "{not json"}, "not valid JSON"),
        ({"metadata": "[4096]"}, "must be a JSON object"),
    ],
)
def test_bad_parameters(params, match):
    from evalkit.evals.lmeval.evaluation import LmEvalEval

    with pytest.raises(EvalkitError, match=match):
        LmEvalEval(params)


def test_local_tasks_validate_without_the_builtin_index():
    from evalkit.evals.lmeval.adapter import resolve_tasks
    from evalkit.evals.lmeval.evaluation import LmEvalEval

    ev = LmEvalEval({"tasks": "evalkit_mmlu4, evalkit_topics_ppl,evalkit_passkey,evalkit_mmlu4", "limit": "5"})
    assert ev.params["tasks"] == ["evalkit_mmlu4", "evalkit_topics_ppl", "evalkit_passkey"] and ev.params["limit"] == 5
    assert ev.params["batch_size"] is None and ev.params["num_fewshot"] is None  # None: the device default
    tasks = resolve_tasks(ev.params["tasks"])
    # no built-in index: the manager knows only evalkit's own tasks (every one of them, asked for or not)
    assert tasks.external == () and set(ev.params["tasks"]) <= set(tasks.manager.all_tasks)
    assert all(t.startswith("evalkit_") for t in tasks.manager.all_tasks)


def test_cli_limit_zero_exits_2(capsys):
    from evalkit.cli import main

    assert main(["run", "--eval", "lmeval", "--lmeval-tasks", "evalkit_mmlu4", "--lmeval-limit", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "limit" in err[0] and ">= 1" in err[0]


@pytest.mark.slow
def test_unknown_task_suggests_nearest_names():
    from evalkit.evals.lmeval.evaluation import LmEvalEval

    # needs lm-eval's full index of built-in tasks (tens of seconds to build)
    with pytest.raises(EvalkitError, match=r"unknown lm-eval task 'hellaswg' \(nearest: hellaswag"):
        LmEvalEval({"tasks": "evalkit_mmlu4,hellaswg"})


def test_task_needing_the_network_fails_fast_offline(tiny_llama_dir, monkeypatch, request):
    """hellaswag's own YAML (from lm-eval's package) while the hub is unreachable: one clear line,
    no retry loop. Offline mode is cleared first so that evalkit has to find out by itself."""
    import datasets
    import lm_eval
    from huggingface_hub import constants

    from evalkit.evals.lmeval.adapter import hub_reachable, make_hflm, resolve_tasks, run_lm_eval
    from evalkit.models.loading import load_model

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")  # unreachable even on a networked CI
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert not hub_reachable()
    hellaswag_dir = Path(lm_eval.__file__).parent / "tasks" / "hellaswag"
    tasks = resolve_tasks(["hellaswag"], (str(hellaswag_dir),))
    assert tasks.external == ("hellaswag",)
    lm = load_model(str(tiny_llama_dir))
    lookups = request.getfixturevalue("network_lookups")  # from here on: datasets alone retries for ~25 s
    with pytest.raises(EvalkitError, match="hellaswag needs the network: the Hugging Face hub is unreachable"):
        run_lm_eval(make_hflm(lm.model, lm.tokenizer), tasks, num_fewshot=None, limit=2)
    assert len(lookups) <= 1, lookups  # one probe of the hub, no library retrying
    assert datasets.config.HF_HUB_OFFLINE is False  # offline mode was scoped to the call


# ---- the eval on a tiny model ----------------------------------------------------------------

TINY_TASKS = "evalkit_mmlu4,evalkit_topics_ppl,evalkit_passkey"


@pytest.fixture(scope="module")
def tiny_run(tiny_llama_dir, tmp_path_factory):
    """Baseline plus bf16 / int4 / fp8-unit rows on the tiny llama (limit 6 per task)."""
    from evalkit.evals.lmeval.evaluation import LmEvalEval
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import load_model

    lm = load_model(str(tiny_llama_dir))
    ev = LmEvalEval({"tasks": TINY_TASKS, "limit": 6})
    work = tmp_path_factory.mktemp("lmeval_work")
    ev.prepare(lm, work)
    art = tmp_path_factory.mktemp("lmeval_art")
    rows = {
        s: ev.evaluate(lm, parse_scheme(s), art / s.replace("/", "_"))
        for s in ("auto", "int4/tensor/dynamic", "fp8_e4m3/tensor/unit")
    }
    return lm, ev, work, art, rows


def _by_metric(rows):
    return {r.metric: r for r in rows}


@pytest.mark.slow
def test_identity_scheme_equals_the_baseline_exactly(tiny_run):
    lm, ev, work, art, rows = tiny_run
    got = _by_metric(rows["auto"])
    base = ev.baseline_summary["results"]
    for task in TINY_TASKS.split(","):
        for key, value in base[task].items():
            if "," in key and "_stderr" not in key and isinstance(value, (int, float)):
                assert got[f"{task}/{key.split(',')[0]}"].value == value  # bit-for-bit, no tolerance
    for name, row in got.items():
        if name.split("/")[1].startswith(("flip_", "gold_loglik")):
            assert row.value == 0.0, name
    assert got["evalkit_mmlu4/gold_loglik_abs_delta"].info["n_changed"] == 0
    saved = json.loads((art / "auto" / "lmeval_samples.json").read_text())["items"]
    assert saved == ev.baseline_items  # per-item predictions and log-likelihoods identical


@pytest.mark.slow
def test_quantized_schemes_change_gold_logliks(tiny_run):
    lm, ev, work, art, rows = tiny_run
    for scheme in ("int4/tensor/dynamic", "fp8_e4m3/tensor/unit"):
        got = _by_metric(rows[scheme])
        for task in ("evalkit_mmlu4", "evalkit_topics_ppl"):
            delta = got[f"{task}/gold_loglik_abs_delta"]
            assert delta.value > 0 and delta.info["n_changed"] > 0, (scheme, task)
        # an independent recomputation from the saved per-item files
        items = json.loads((art / scheme.replace("/", "_") / "lmeval_samples.json").read_text())["items"]
        deltas = [
            abs(a["gold_loglik"] - b["gold_loglik"])
            for a, b in zip(items["evalkit_mmlu4"], ev.baseline_items["evalkit_mmlu4"])
        ]
        assert got["evalkit_mmlu4/gold_loglik_abs_delta"].value == pytest.approx(np.mean(deltas), rel=1e-12)
        flips = np.mean(
            [
                a["prediction"] != b["prediction"]
                for a, b in zip(items["evalkit_passkey"], ev.baseline_items["evalkit_passkey"])
            ]
        )
        assert got["evalkit_passkey/flip_rate"].value == flips


@pytest.mark.slow
def test_rows_carry_provenance_and_proportion_intervals(tiny_run):
    from evalkit.evals.lmeval.adapter import lm_eval_version

    lm, ev, work, art, rows = tiny_run
    got = _by_metric(rows["int4/tensor/dynamic"])
    acc = got["evalkit_mmlu4/acc"]
    assert acc.info["lm_eval_version"] == lm_eval_version() and acc.info["task_version"] == 1.0
    assert acc.info["n_shot"] == 0 and acc.info["limit"] == 6 and acc.info["n_items"] == 6
    assert acc.info["config"]["task"] == "evalkit_mmlu4" and acc.info["config"]["output_type"] == "multiple_choice"
    se = acc.info["stderr"]
    p = acc.value
    assert se == pytest.approx(math.sqrt(p * (1 - p) / 5))  # lm-eval's sample stderr (n - 1)
    # a proportion's interval is Wilson's (inside [0, 1]), by hand: z = 1.959964, n = 6
    z, n, k = 1.959963984540054, 6, round(p * 6)
    centre = (k / n + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(k / n * (1 - k / n) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (acc.ci_low, acc.ci_high) == (
        pytest.approx(centre - half, abs=1e-12),
        pytest.approx(centre + half, abs=1e-12),
    )
    assert 0 <= acc.ci_low <= p <= acc.ci_high <= 1
    for row in rows["int4/tensor/dynamic"]:
        assert {"lm_eval_version", "task", "task_version", "n_shot", "limit", "n_items"} <= set(row.info)
        assert row.labels["task"] in TINY_TASKS.split(",")
    # the baseline file on disk is reused by a second prepare (same model, params, task files)
    baseline_files = list(Path(work).rglob("baseline.json"))
    assert len(baseline_files) == 1
    from evalkit.evals.lmeval.evaluation import LmEvalEval

    again = LmEvalEval({"tasks": TINY_TASKS, "limit": 6})
    again.prepare(lm, work)
    assert again.baseline_items == ev.baseline_items


@pytest.mark.slow
def test_cli_run_with_tasks_fewshot_and_limit(tiny_llama_dir, tmp_path, capsys):
    from evalkit.cli import main

    code = main(
        [
            "run",
            "--eval",
            "lmeval",
            "--model",
            str(tiny_llama_dir),
            "--lmeval-tasks",
            "evalkit_mmlu4,evalkit_passkey",
            "--lmeval-num-fewshot",
            "1",
            "--lmeval-limit",
            "3",
            "--schemes",
            "int4/tensor/dynamic",
            "--json",
            "--out",
            str(tmp_path / "out"),
            "--cache-dir",
            str(tmp_path / "work"),
        ]
    )
    assert code == 0
    rows = [
        r
        for r in (json.loads(x) for x in ((tmp_path / "out") / "results.jsonl").read_text().splitlines())
        if r["type"] == "metric"
    ]  # the results store
    assert [r["scheme"] for r in rows][0] == "auto" and {r["scheme"] for r in rows} == {"auto", "int4/tensor/dynamic"}
    acc = {r["scheme"]: r for r in rows if r["metric"] == "evalkit_mmlu4/acc"}
    assert acc["auto"]["info"]["n_shot"] == 1 and acc["auto"]["info"]["n_items"] == 3
    assert acc["auto"]["info"]["config"]["num_fewshot"] == 1
    flips = {r["scheme"]: r["value"] for r in rows if r["metric"] == "evalkit_passkey/flip_rate"}
    assert flips["auto"] == 0.0
    assert list(tmp_path.joinpath("out").rglob("lmeval_samples.json"))


@pytest.mark.slow
def test_group_rows_pool_the_items_of_their_subtasks(tiny_llama_dir, tmp_path):
    """A group (like lm-eval's mmlu) gets lm-eval's aggregate and flip statistics over all its items."""
    from evalkit.evals.lmeval.evaluation import LmEvalEval
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.loading import load_model

    folder = tmp_path / "tasks"
    folder.mkdir()
    (folder / "kvtest_copy.yaml").write_text(
        f"include: {REPO_TASKS / 'evalkit_mmlu4.yaml'}\ntask: kvtest_copy\nfewshot_split: test\ntest_split: dev\n"
    )
    (folder / "kvtest_group.yaml").write_text(
        "group: kvtest_group\ntask: [evalkit_mmlu4, kvtest_copy]\n"
        "aggregate_metric_list:\n  - metric: acc\n    aggregation: mean\n    weight_by_size: true\n"
    )
    lm = load_model(str(tiny_llama_dir))
    ev = LmEvalEval({"tasks": "kvtest_group", "limit": 3, "include": [str(folder)]})
    ev.prepare(lm, tmp_path / "work")
    rows = {r.metric: r for r in ev.evaluate(lm, parse_scheme("int4/tensor/dynamic"))}
    group_delta = rows["kvtest_group/gold_loglik_abs_delta"]
    parts = [rows[f"{t}/gold_loglik_abs_delta"] for t in ("evalkit_mmlu4", "kvtest_copy")]
    assert group_delta.info["n_items"] == 6 and group_delta.info["subtasks"] == ["evalkit_mmlu4", "kvtest_copy"]
    assert group_delta.value == pytest.approx((parts[0].value + parts[1].value) / 2, rel=1e-12)
    acc = [rows[f"{t}/acc"].value for t in ("evalkit_mmlu4", "kvtest_copy")]
    assert rows["kvtest_group/acc"].value == pytest.approx(sum(acc) / 2)


def test_no_progress_silences_lm_evals_request_bars(tiny_llama_dir, monkeypatch, capsys):
    """`sweep --no-progress` sets EVALKIT_PROGRESS=0: lm-eval's per-request bars stay silent, and
    the quiet HFLM scores exactly as lm-eval's own."""
    from lm_eval.api.instance import Instance

    from evalkit.evals.lmeval.adapter import make_hflm
    from evalkit.models.loading import load_model

    lm = load_model(str(tiny_llama_dir))
    request = [Instance(request_type="loglikelihood", doc={}, arguments=("The cat", " sat"), idx=0)]
    monkeypatch.delenv("EVALKIT_PROGRESS", raising=False)
    loud = make_hflm(lm.model, lm.tokenizer).loglikelihood(request)
    assert "Running loglikelihood requests" in capsys.readouterr().err
    monkeypatch.setenv("EVALKIT_PROGRESS", "0")
    quiet = make_hflm(lm.model, lm.tokenizer).loglikelihood(request)
    assert "Running loglikelihood requests" not in capsys.readouterr().err
    assert quiet == loud


def test_cached_baseline_that_is_damaged_or_stale_is_a_miss(tmp_path):
    """The one lm-eval baseline cache (lmeval, longcontext, generation): a miss, never an error, for a
    file that is missing, cut, foreign-keyed or of another layout; written whole and read back."""
    from evalkit.evals.lmeval.baseline_cache import read_baseline, write_baseline

    fields = {"items": dict, "summary": dict}
    path = tmp_path / "baseline.json"
    assert read_baseline(path, "k", fields) is None  # missing
    path.write_text('{"key": "k", "items": {')  # cut by a kill
    assert read_baseline(path, "k", fields) is None
    path.write_text(json.dumps({"key": "other", "items": {}, "summary": {}}))
    assert read_baseline(path, "k", fields) is None
    path.write_text(json.dumps({"key": "k", "items": [], "summary": {}}))  # another layout
    assert read_baseline(path, "k", fields) is None
    good = {"items": {"t": [1]}, "summary": {"results": {}}}
    write_baseline(tmp_path / "sub" / "baseline.json", "k", good)
    assert read_baseline(tmp_path / "sub" / "baseline.json", "k", fields) == good
    assert [f.name for f in (tmp_path / "sub").iterdir()] == ["baseline.json"]  # no temporary file left
