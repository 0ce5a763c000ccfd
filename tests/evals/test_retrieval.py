"""Retrieval eval on tiny models: task files, seeded needles, exact-length prompts, scoring and
intervals against plain computations, row aggregation, artifacts, bad input."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch
from scipy import stats

from evalkit.errors import EvalkitError
from evalkit.evals.retrieval import grid as G
from evalkit.evals.retrieval.evaluation import RetrievalEval
from evalkit.evals.retrieval.prompts import Haystack, build_prompt, build_template, encode, filler_haystack
from evalkit.evals.retrieval.scoring import accuracy_ci, difference_ci, score, words
from evalkit.evals.retrieval.tasks import DEFAULT_TASKS, available_tasks, draw_needles, load_task
from evalkit.kv.scheme import Scheme, parse_scheme

from tests.evals import paired_reference as R

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_lm(tiny_llama_dir):
    from evalkit.models.loading import load_model

    return load_model(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def tok(tiny_lm):
    return tiny_lm.tokenizer


# ---- task definitions and needles ---------------------------------------------------------------
def test_every_default_task_has_a_valid_file():
    assert set(DEFAULT_TASKS) <= set(available_tasks())
    shapes = {t: (s.keys, s.values_per_key, s.queries, s.scoring) for t in DEFAULT_TASKS for s in [load_task(t)]}
    assert shapes["passkey"] == (1, 1, 1, "exact") and load_task("passkey").haystack == "filler"
    assert shapes["niah_multikey"] == (4, 1, 1, "exact")
    assert shapes["niah_multivalue"] == (1, 4, 1, "recall")
    assert shapes["niah_multiquery"] == (4, 1, 4, "recall")


@pytest.mark.parametrize("task", DEFAULT_TASKS)
def test_same_seed_same_needles_and_answers(task):
    spec = load_task(task)
    a, b, c = draw_needles(spec, "0/x/1"), draw_needles(spec, "0/x/1"), draw_needles(spec, "0/x/2")
    assert a == b and a != c
    assert len(a.needles) == spec.keys * spec.values_per_key
    assert len(a.answers) == spec.queries * spec.values_per_key
    for ans in a.answers:  # every expected answer is stated by some needle, and asked for by the question
        assert sum(ans in n for n in a.needles) == 1
    assert a.answers[0] in a.needles[0]  # needle 0 (placed at the depth) is a queried one
    if spec.key == "words":
        asked = [k for k in a.keys if k in a.question]
        assert len(asked) == spec.queries and all(k in a.answer_prefix for k in asked)
    if spec.value["kind"] == "uuid":
        assert str(uuid.UUID(a.answers[0])) == a.answers[0]
    if spec.value["kind"] == "number":
        assert all(len(x) == spec.value["digits"] and x.isdigit() for x in a.answers)


def test_multikey_answer_belongs_to_the_asked_key():
    spec = load_task("niah_multikey")
    nd = draw_needles(spec, "7")
    asked = nd.keys[0]
    assert f"for {asked} is: {nd.answers[0]}." in nd.needles[0] and asked in nd.question
    assert all(asked not in n for n in nd.needles[1:])


def test_bad_task_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nhaystack: ocean\n")
    with pytest.raises(EvalkitError):
        load_task(str(bad))
    with pytest.raises(EvalkitError, match="unknown retrieval task"):
        load_task("no_such_task")


# ---- exact-length prompts -------------------------------------------------------------------------
def _find(seq: list[int], sub: list[int]) -> int:
    return next(i for i in range(len(seq) - len(sub) + 1) if seq[i : i + len(sub)] == sub)


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("depth", [0, 25, 50, 75, 100])
def test_prompt_has_exact_length_and_needle_at_depth(tok, chat, depth):
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    try:
        spec = load_task("niah_single_number")
        nd = draw_needles(spec, "s")
        template = build_template(tok, spec.intro, nd.question, nd.answer_prefix)
        assert template.chat is chat
        hay = filler_haystack(tok, 600)
        for length in (300, 401, 512):
            ids, realised = build_prompt(tok, template, hay, nd.needles, length, depth, random.Random(1))
            assert len(ids) == length
            assert ids[: len(template.head)] == list(template.head) and ids[-len(template.tail) :] == list(
                template.tail
            )
            needle = encode(tok, " " + nd.needles[0])
            at = _find(ids, needle) - len(template.head)
            budget = length - len(template.head) - len(template.tail) - len(needle)
            assert at / budget == pytest.approx(realised)
            assert abs(at - depth / 100 * budget) <= 12  # filler sentences are < 12 tokens apart
            text = tok.decode(ids)
            assert nd.question in text and text.rstrip().endswith(nd.answer_prefix)
            if chat:
                assert text.startswith("<|im_start|>user\n")
    finally:
        tok.chat_template = None


def test_needles_sit_at_sentence_boundaries(tok):
    spec = load_task("niah_multivalue")
    nd = draw_needles(spec, "b")
    template = build_template(tok, spec.intro, nd.question, nd.answer_prefix)
    ids, _ = build_prompt(tok, template, filler_haystack(tok, 600), nd.needles, 480, 50, random.Random(3))
    text = tok.decode(ids)
    for n in nd.needles:
        assert re.search(r"(\.|\n\n) " + re.escape(n) + r"( [A-Z]|\n|$)", text), n


def test_haystack_boundaries_are_sentence_ends(tok):
    hay = filler_haystack(tok, 200)
    for p in hay.boundaries[:30].tolist():
        assert tok.decode(hay.ids[:p].tolist()).endswith(".")
        assert tok.decode(hay.ids[p : p + 2].tolist()).startswith(" ")


def test_samples_are_deterministic(tok):
    tasks = [load_task("passkey"), load_task("niah_single_word")]
    args = dict(
        tokenizer=tok,
        lengths=[400, 512],
        depths=[0.0, 50.0, 100.0],
        samples=2,
        haystack="filler",
        corpus="embedded",
        cache_dir=None,
    )
    a, b = G.build_samples(tasks, seed=0, **args), G.build_samples(tasks, seed=0, **args)
    c = G.build_samples(tasks, seed=1, **args)
    assert a == b and G.samples_digest(a) == G.samples_digest(b)
    assert [s.answers for s in a] != [s.answers for s in c] and G.samples_digest(a) != G.samples_digest(c)
    assert all(len(s.ids) == s.length for s in a)
    assert len({s.answers for s in a}) > len(a) // 2  # samples differ from each other


# ---- scoring and intervals -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "generated,answer,expected",
    [
        (" 12345.", "12345", 1.0),
        (" 12345 is the pass key", "12345", 1.0),
        ('"12345".', "12345", 1.0),
        ("\n 12345", "12345", 1.0),
        (" is 12345", "12345", 0.0),
        (" 123456", "12345", 0.0),
        (" the pass key.", "12345", 0.0),
        ("", "12345", 0.0),
        (" Lantern.", "lantern", 1.0),
        (" lanterns", "lantern", 0.0),
        (" 0f8c4a1e-2b3d-4e5f-8a9b-0c1d2e3f4a5b is it", "0f8c4a1e-2b3d-4e5f-8a9b-0c1d2e3f4a5b", 1.0),
        (" 0f8c4a1e-2b3d", "0f8c4a1e-2b3d-4e5f-8a9b-0c1d2e3f4a5b", 0.0),
    ],
)
def test_exact_match(generated, answer, expected):
    assert score(generated, [answer], "exact") == expected


def test_recall():
    ans = ["1111111", "2222222", "3333333", "4444444"]
    assert score(" 1111111, 2222222, 3333333 and 4444444.", ans, "recall") == 1.0
    assert score(" 2222222 and 9999999, then 4444444", ans, "recall") == 0.5
    assert score(" 11111112", ans, "recall") == 0.0
    assert words("A-b, C.") == ["a-b", "c"]


def test_intervals_match_scipy_and_plain_means():
    scores = [1, 1, 0, 1, 0, 1, 1, 1]
    mean, lo, hi, method = accuracy_ci(scores)
    ci = stats.binomtest(6, 8).proportion_ci(confidence_level=0.95, method="wilson")
    assert (mean, lo, hi, method) == (pytest.approx(0.75), pytest.approx(ci.low), pytest.approx(ci.high), "wilson")
    frac = [0.25, 0.5, 1.0, 0.75]
    mean, lo, hi, method = accuracy_ci(frac)
    t = stats.t.interval(0.95, 3, loc=0.625, scale=np.std(frac, ddof=1) / 2)  # Student's t, clipped to [0, 1]
    assert method == "t" and mean == pytest.approx(0.625) and (lo, hi) == pytest.approx((t[0], 1.0)) and t[1] > 1
    # 0/1 scores, nothing changed: not [0, 0] but Wilson's width for 0 of the 3 prompts
    wilson_high = stats.binomtest(0, 3).proportion_ci(method="wilson").high
    assert difference_ci([1, 0, 1], [1, 0, 1]) == pytest.approx((0.0, -wilson_high, wilson_high), abs=1e-9)
    d, lo, hi = difference_ci([0, 0, 1, 0], [1, 1, 1, 1])  # 3 right -> wrong of 4: Tango's interval
    assert d == pytest.approx(-0.75) and (lo, hi) == pytest.approx(R.tango_brute(3, 0, 4), abs=1e-7)
    d, lo, hi = difference_ci([0.5, 0.25, 1.0, 0.75], [1.0, 0.5, 1.0, 0.75])  # recall: Student's t, clipped
    t = stats.t.interval(0.95, 3, loc=-0.1875, scale=np.std([-0.5, -0.25, 0, 0], ddof=1) / 2)
    assert d == pytest.approx(-0.1875) and (lo, hi) == pytest.approx(t)


# ---- the evaluation end to end ---------------------------------------------------------------------
def _canned(ev, correct):
    """Generations that answer sample s correctly iff correct(s) (first answer word, or all values)."""
    return [(" " + ", ".join(s.answers) + ".") if correct(s) else " I do not know." for s in ev.samples]


def test_rows_aggregate_scores_per_cell(tiny_lm, tmp_path, monkeypatch):
    ev = RetrievalEval(
        {
            "tasks": "passkey,niah_multivalue",
            "lengths": "400,440",
            "depths": "0,50,100",
            "samples": 3,
            "haystack": "filler",
        }
    )
    ev.prepare(tiny_lm, tmp_path)
    assert len(ev.samples) == 2 * 2 * 3 * 3
    base_rule = lambda s: s.index < 2  # noqa: E731  baseline: 2 of 3 right in every cell
    scheme_rule = lambda s: s.index < 2 and s.depth == 0  # noqa: E731  scheme: only depth 0 survives
    fake = {True: _canned(ev, base_rule), False: _canned(ev, scheme_rule)}
    monkeypatch.setattr(
        ev,
        "_generate",
        lambda lm, scheme, which=None, **kw: [fake[scheme.is_identity][i] for i in (which or range(len(ev.samples)))],
    )
    base_rows = ev.evaluate(tiny_lm, Scheme())
    rows = ev.evaluate(tiny_lm, parse_scheme("int4/tensor/unit"), tmp_path / "art")
    cells = {
        (r.labels["task"], r.labels["length"], r.labels["depth"]): r
        for r in rows
        if r.metric == "accuracy" and len(r.labels) == 3
    }
    assert len(cells) == 2 * 2 * 3
    for (task, length, depth), r in cells.items():
        mine = [scheme_rule(s) for s in ev.samples if (s.task, s.length, s.depth) == (task, length, depth)]
        k, n = sum(mine), len(mine)
        assert r.value == pytest.approx(k / n) and r.info["n"] == 3
        ci = stats.binomtest(k, n).proportion_ci(method="wilson")
        assert (r.ci_low, r.ci_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
        diff = next(x for x in rows if x.metric == "accuracy_diff" and x.labels == r.labels)
        assert diff.value == pytest.approx(k / n - 2 / 3) and diff.info["baseline"] == pytest.approx(2 / 3)
    overall = next(r for r in rows if r.metric == "accuracy" and not r.labels)
    assert overall.value == pytest.approx(sum(map(scheme_rule, ev.samples)) / len(ev.samples))
    base_overall = next(r for r in base_rows if r.metric == "accuracy_diff" and not r.labels)
    wilson_high = stats.binomtest(0, len(ev.samples)).proportion_ci(method="wilson").high
    assert base_overall.value == 0.0  # nothing changed: Wilson's width for 0 of the prompts, not [0, 0]
    assert (base_overall.ci_low, base_overall.ci_high) == pytest.approx((-wilson_high, wilson_high), abs=1e-9)
    per_task = {r.labels["task"]: r.value for r in rows if r.metric == "accuracy" and set(r.labels) == {"task"}}
    assert per_task == {"passkey": pytest.approx(2 / 9), "niah_multivalue": pytest.approx(2 / 9)}
    for name in ("retrieval_accuracy.png", "retrieval_diff.png"):
        assert (tmp_path / "art" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    recs = [json.loads(x) for x in (tmp_path / "art" / "samples.jsonl").read_text().splitlines()]
    assert len(recs) == len(ev.samples) and sum(r["score"] for r in recs) == sum(map(scheme_rule, ev.samples))


def test_identity_through_the_storage_path_equals_plain_generate(tiny_lm):
    from evalkit.evals.retrieval.generate import generate_batches, generation_config

    ev = RetrievalEval({"tasks": "passkey", "lengths": "300", "depths": "0,100", "samples": 1, "haystack": "filler"})
    ev.prepare(tiny_lm, None)
    prompts = [list(s.ids) for s in ev.samples]
    x = torch.tensor(prompts)
    with torch.inference_mode():
        out = tiny_lm.model.generate(
            x, attention_mask=torch.ones_like(x), generation_config=generation_config(tiny_lm.tokenizer, 6)
        )
    plain = tiny_lm.tokenizer.batch_decode(out[:, 300:], skip_special_tokens=True)
    assert generate_batches(tiny_lm, Scheme(), [(prompts, 6)]) == [plain]


def test_generation_runs_through_the_storage_cache(tiny_lm, monkeypatch):
    import evalkit.integration.storage as cache_mod

    made = []
    original = cache_mod.StorageCache.__init__

    def spy(self, *a, **k):
        made.append(self)
        original(self, *a, **k)

    monkeypatch.setattr(cache_mod.StorageCache, "__init__", spy)
    ev = RetrievalEval({"tasks": "passkey", "lengths": "300", "depths": "50", "samples": 1, "haystack": "filler"})
    ev.prepare(tiny_lm, None)
    ev.evaluate(tiny_lm, parse_scheme("fp8_e4m3/head/dynamic"))
    assert made and made[-1].get_seq_length() > 300 and made[-1].nbytes() > 0


# ---- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params,match",
    [
        ({"depths": "0,150"}, "outside 0-100"),
        ({"depths": "-5"}, "outside 0-100"),
        ({"lengths": "1x"}, "bad context length"),
        ({"via": "hook"}, "unknown retrieval parameter"),
        ({"samples": 0}, "samples"),
        ({"tasks": "nope"}, "unknown retrieval task"),
    ],
)
def test_bad_params(params, match):
    with pytest.raises(EvalkitError, match=match):
        RetrievalEval(params)


def test_bad_grid_for_the_model(tiny_lm, tmp_path):
    with pytest.raises(EvalkitError, match="above the model's maximum of 512"):
        RetrievalEval({"lengths": "1k"}).prepare(tiny_lm, tmp_path)
    with pytest.raises(EvalkitError, match="needle does not fit"):
        RetrievalEval({"tasks": "niah_multikey", "lengths": "128", "samples": 1}).prepare(tiny_lm, tmp_path)
    with pytest.raises(EvalkitError, match="exceeds the model's maximum"):
        RetrievalEval({"tasks": "passkey", "lengths": "510", "samples": 1}).prepare(tiny_lm, tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n ")
    with pytest.raises(EvalkitError, match="empty"):
        RetrievalEval({"haystack": f"file:{empty}", "lengths": "400", "samples": 1}).prepare(tiny_lm, tmp_path)
    with pytest.raises(EvalkitError, match="empty"):
        Haystack.from_ids(torch.tensor([5]), tiny_lm.tokenizer, "x")


def test_default_lengths_are_capped_at_the_model_maximum():
    assert G.resolve_lengths(None, 8192) == [1024, 2048, 4096, 8192 - G.ANSWER_ROOM]
    assert G.resolve_lengths(None, 512) == [512 - G.ANSWER_ROOM]
    assert G.resolve_lengths([1024], 8192) == [1024]
    assert G.parse_length("2k") == 2048 and G.parse_depth("25%") == 25.0


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "evalkit", "run", "--eval", "retrieval", *args],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "EVALKIT_PROGRESS": "0"},
    )


@pytest.mark.parametrize(
    "args,match",
    [(["--retrieval-depths", "0,101"], "outside 0-100"), (["--retrieval-lengths", "4k"], "above the model's maximum")],
)
def test_cli_bad_input_exits_2_with_one_line(tiny_llama_dir, capsys, args, match):
    from evalkit.cli import main

    code = main(["run", "--eval", "retrieval", "--model", str(tiny_llama_dir), "--schemes", "auto", *args])
    err = capsys.readouterr().err
    assert code == 2
    lines = [x for x in err.splitlines() if x.startswith("evalkit:")]
    assert len(lines) == 1 and match in lines[0] and "Traceback" not in err


@pytest.mark.slow
def test_cli_runs_and_writes_rows(tiny_llama_dir, tmp_path):
    pytest.importorskip("tabulate", reason="run prints its rows with tabulate (not in the GPU-image environment)")
    res = _cli(
        "--model",
        str(tiny_llama_dir),
        "--schemes",
        "fp8_e4m3/tensor/dynamic",
        "--retrieval-tasks",
        "passkey",
        "--retrieval-lengths",
        "300",
        "--retrieval-depths",
        "0,100",
        "--retrieval-samples",
        "1",
        "--out",
        str(tmp_path),
        "--cache-dir",
        str(tmp_path / "c"),
    )
    assert res.returncode == 0, res.stderr
    rows = [
        r
        for r in (json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines())
        if r["type"] == "metric"
    ]  # the results store
    cells = [r for r in rows if r["metric"] == "accuracy" and set(r["labels"]) == {"task", "length", "depth"}]
    assert {r["scheme"] for r in cells} == {"auto", "fp8_e4m3/tensor/dynamic"} and len(cells) == 4
    assert all(0.0 <= r["value"] <= 1.0 and not math.isnan(r["value"]) for r in cells)
    assert len(list(tmp_path.glob("runs/*/retrieval_accuracy.png"))) == 2


def test_baseline_answers_are_cached_per_prompt_and_reused_by_other_grids(tiny_lm, tmp_path, monkeypatch):
    params = {"tasks": "passkey", "lengths": "300", "samples": 1, "haystack": "filler"}
    first = RetrievalEval({**params, "depths": "0,100"})
    first.prepare(tiny_lm, tmp_path)
    gens = first.baseline(tiny_lm)
    files = list((tmp_path / "retrieval").glob("baseline-*.jsonl"))
    assert len(files) == 1 and len(files[0].read_text().splitlines()) == 2
    subset = RetrievalEval({**params, "depths": "100"})
    subset.prepare(tiny_lm, tmp_path)
    monkeypatch.setattr(subset, "_generate", lambda *a, **k: pytest.fail("baseline recomputed"))
    assert subset.baseline(tiny_lm) == gens[1:]


def test_baseline_cache_key_holds_the_batch_size(tiny_lm, tmp_path):
    """The batch size decides which prompts share a padded forward, so the baseline's floats: two batch
    sizes, two baseline files; the same batch size, the same file."""
    params = {"tasks": "passkey", "lengths": "300", "samples": 1, "haystack": "filler", "depths": "0"}
    paths = {}
    for bs in (1, 4, 4):
        ev = RetrievalEval({**params, "batch_size": bs})
        ev.prepare(tiny_lm, tmp_path)
        paths.setdefault(bs, set()).add(ev._baseline_path(tiny_lm))
    assert len(paths[4]) == 1 and paths[1].isdisjoint(paths[4]) and None not in paths[1] | paths[4]


def test_canonical_params_follow_the_task_files(tmp_path):
    import shutil

    from evalkit.evals.retrieval.tasks import TASK_DIR

    copy = tmp_path / "passkey.yaml"
    shutil.copy(TASK_DIR / "passkey.yaml", copy)
    before = RetrievalEval({"tasks": str(copy)}).canonical_params()
    assert before == RetrievalEval({"tasks": str(copy)}).canonical_params()
    json.dumps(before)  # hashable as JSON
    copy.write_text(copy.read_text().replace("Remember it.", "Keep it."))
    assert RetrievalEval({"tasks": str(copy)}).canonical_params() != before


def _append_many(path: str, tag: int) -> None:
    from pathlib import Path

    from evalkit.evals.output_head import append_lines

    for i in range(200):
        append_lines(Path(path), [json.dumps({"key": f"{tag}-{i}-{j}", "generated": "x" * 3000}) for j in range(4)])


def test_cache_lines_of_concurrent_writers_never_interleave(tmp_path):
    """Ray workers of one model share the retrieval baseline file: each batch is one O_APPEND write."""
    import multiprocessing

    path = tmp_path / "baseline.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(path), tag)) for tag in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    keys = [json.loads(line)["key"] for line in path.read_text().splitlines()]  # every line parses
    assert sorted(keys) == sorted(f"{t}-{i}-{j}" for t in range(3) for i in range(200) for j in range(4))
