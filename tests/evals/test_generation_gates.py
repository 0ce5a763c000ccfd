"""generation's failure gates: each reported failure shape planted in a recorded generation (a traces
file's records, and an lm-eval task's records) is caught by its own gate; a clean run reports 0 with its
Wilson width; every rate equals a plain computation (:func:`tests.evals.generation_checks.check_gates`)."""

from __future__ import annotations

import numpy as np
import pytest

from evalkit.evals.generation import gates as G
from evalkit.evals.generation.rows import task_rows
from evalkit.evals.generation.trace_rows import trace_rows

from tests.evals import generation_checks as C

EOS = 0
BUDGET = 64


def _words(start: int, n: int) -> list[int]:
    return list(range(start, start + n))  # distinct token ids: no repeat of any kind


def _sample(ids: list[int], text: str = "a clean answer", truncated: bool = False, split: int = 0) -> dict:
    """One traces sample as evalkit records it: the ids with the closing EOS unless cut at the budget."""
    closed = ids if truncated else ids + [EOS]
    return {"seed": 0, "ids": closed, "text": text, "tokens": len(ids), "truncated": truncated, "split_tokens": split}


def _record(line: int, samples: list[dict]) -> dict:
    return {"line": line, "id": None, "reference": None, "samples": samples}


# the shapes of the reported failures (gates module docstring), one per line; the baseline answers each
# line with 24 distinct tokens and stops
PLANTED = {
    "repeated_token": _sample([t for w in _words(100, 12) for t in ((w, w) if w % 2 else (w,))]),  # llm-scaler#721
    "repeated_ngram": _sample([100, 101, 102, 103, 104] * 6),  # a phrase looped
    "first_token_eos": _sample([]),  # mlx-vlm#2162
    "collapse": _sample(_words(100, 60) + [5] * 16),  # vllm#49818: "!" until the end (here before the cap)
    "runaway": _sample(_words(100, BUDGET), truncated=True),  # llama-cpp-turboquant#311: no EOS
    "invalid_utf8": _sample(_words(100, 24), text="caf\ufffd au lait"),  # a split multi-byte character
}


def _traces(planted: dict[str, dict], clean_lines: int = 4):
    base = [_record(k, [_sample(_words(100, 24))]) for k in range(len(planted) + clean_lines)]
    mine = [_record(k, [s]) for k, s in enumerate(planted.values())]
    mine += [_record(len(planted) + k, [_sample(_words(100, 24))]) for k in range(clean_lines)]
    return base, mine


def _plain(records: list[dict]) -> list[list[dict]]:
    return [
        [{"ids": s["ids"][: s["tokens"]], "text": s["text"], "truncated": s["truncated"], "split": s["split_tokens"]}]
        for r in records
        for s in r["samples"][:1]
    ]


def _rows(base, mine, prompts=None):
    return trace_rows(base, mine, None, {"file": {"name": "planted.jsonl"}}, prompts)


def test_each_planted_shape_is_caught_by_its_gate():
    base, mine = _traces(PLANTED)
    rows = _rows(base, mine)
    counts = C.check_gates(rows, "traces/", _plain(base), _plain(mine))
    assert counts == {**{g: 1 for g in G.GATES}, "any": len(PLANTED)}
    values = {r.metric: r for r in rows}
    for gate in G.GATES:  # its own line, and only its own line, fires it
        alone = _rows(*_traces({gate: PLANTED[gate]}))
        fired = {r.metric: r.info["n_fired"] for r in alone if r.metric.startswith("traces/fail_")}
        assert fired == {f"traces/fail_{g}": int(g in (gate, "any")) for g in (*G.GATES, "any")}, gate
        assert values[f"traces/fail_{gate}"].value == pytest.approx(1 / len(mine))
    assert values["traces/fail_any"].info["scheme_count"] == len(PLANTED)


def test_a_split_token_counts_where_the_baseline_had_none():
    base, mine = _traces({})
    mine[0]["samples"][0]["split_tokens"] = 1  # a lone byte of a multi-byte character, text still decodes
    assert next(r for r in _rows(base, mine) if r.metric == "traces/fail_invalid_utf8").info["n_fired"] == 1
    base[0]["samples"][0]["split_tokens"] = 2  # the baseline splits there too (a CJK character): no new failure
    assert next(r for r in _rows(base, mine) if r.metric == "traces/fail_invalid_utf8").info["n_fired"] == 0


def test_a_shape_the_baseline_has_too_does_not_fire():
    base, mine = _traces(PLANTED)
    base[: len(PLANTED)] = [_record(k, [s]) for k, s in enumerate(PLANTED.values())]
    rows = {r.metric: r for r in _rows(base, mine)}
    assert rows["traces/fail_any"].value == 0.0
    assert rows["traces/fail_any"].info["baseline_count"] == len(PLANTED)


@pytest.mark.parametrize("lines", [4, 20])
def test_a_clean_run_reports_zeros_with_their_wilson_width(lines):
    base, mine = _traces({}, clean_lines=lines)
    rows = {r.metric: r for r in _rows(base, mine)}
    high = C.Z**2 / (lines + C.Z**2)  # Wilson's upper end for 0 of n
    for gate in (*G.GATES, "any"):
        row = rows[f"traces/fail_{gate}"]
        assert (row.value, row.ci_low) == (0.0, pytest.approx(0.0, abs=1e-15))
        assert row.ci_high == pytest.approx(high, rel=1e-12)


def test_rates_by_prompt_length_partition_the_item_samples():
    base, mine = _traces(PLANTED, clean_lines=4)
    prompts = [10, 40, 40, 70, 70, 70, 10, 40, 200, 200]  # buckets 0-31, 32-63, 64-127, 128-255
    rows = [r for r in _rows(base, mine, prompts) if r.metric.endswith("_by_length")]
    for gate in (*G.GATES, "any"):
        mine_rows = [r for r in rows if r.metric == f"traces/fail_{gate}_by_length"]
        assert {r.labels["bucket"] for r in mine_rows} == {"0-31", "32-63", "64-127", "128-255"}
        assert sum(r.info["n_item_samples"] for r in mine_rows) == len(mine)
        total = next(r for r in _rows(base, mine) if r.metric == f"traces/fail_{gate}").info["n_fired"]
        assert sum(r.info["n_fired"] for r in mine_rows) == total
        for r in mine_rows:
            sel = [k for k, p in enumerate(prompts) if C.bucket(p) == r.labels["bucket"]]
            assert r.value == pytest.approx(r.info["n_fired"] / len(sel))
            assert r.info["bucketed_by"].startswith("the item's prompt length")


def test_plain_computation_of_each_share():
    ids = [7, 7, 8, 9, 9, 9, 1, 2, 3, 4, 1, 2, 3, 4]
    assert G.repeated_token_share(ids) == pytest.approx(3 / 13)  # positions 1, 4, 5
    grams = [tuple(ids[i : i + 4]) for i in range(len(ids) - 3)]
    assert G.repeated_ngram_share(ids) == pytest.approx(sum(g in grams[:i] for i, g in enumerate(grams)) / len(grams))
    assert G.repeated_ngram_share(ids) == pytest.approx(1 / 11)  # (1, 2, 3, 4) again at the end
    assert G.tail_run([3, 5, 5, 5]) == 3 and G.tail_run([]) == 0 and G.tail_run([4]) == 1
    assert G.repeated_token_share([]) == 0.0 and G.repeated_ngram_share([1, 2, 3]) == 0.0
    rng = np.random.default_rng(3)
    for _ in range(200):  # the module's shapes equal the written-out loops on random outputs
        n = int(rng.integers(0, 40))
        out = [int(x) for x in rng.integers(0, 4, n)]
        truncated, text = bool(rng.integers(0, 2)), "x\ufffd" if rng.random() < 0.2 else "x"
        assert G.shapes(G.Output(out, text, truncated)) == C.plain_shapes(out, text, truncated, None)


class _Tok:
    """A tokenizer of one id per character (enough for the gates' re-encoding of task texts)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def _task_records(texts: list[str], truncated: list[bool], filt: str) -> list[dict]:
    return [
        {
            "doc_id": i,
            "filter": filt,
            "doc_hash": str(i),
            "prompt": "Q" * (10 + 30 * i),
            "samples": [
                {"seed": 1234, "text": t, "answer": t[-1:], "correct": 1.0, "tokens": len(t), "truncated": cut}
                for t, cut in zip(texts[i], truncated[i])
            ],
        }
        for i in range(len(texts))
    ]


def test_task_gates_once_per_task_on_the_re_encoded_text():
    clean = ["the answer is 12", "so it is 7"]
    base_t = [clean, clean, clean]
    mine_t = [["!" * 20, "so it is 7"], ["", "so it is 7"], ["caf\ufffd is 3", "so it is 7"]]
    cuts = [[True, False], [False, False], [False, False]]
    base = {"arith": _task_records(base_t, [[False] * 2] * 3, "a") + _task_records(base_t, [[False] * 2] * 3, "b")}
    mine = {"arith": _task_records(mine_t, cuts, "a") + _task_records(mine_t, cuts, "b")}
    rows = task_rows(base, mine, _Tok(), {})
    gate_rows = [r for r in rows if "/fail_" in r.metric and "_by_length" not in r.metric]
    assert {r.metric for r in gate_rows} == {f"arith/fail_{g}" for g in (*G.GATES, "any")}  # no per-filter copy
    plain = lambda t, cut: {"ids": [ord(c) for c in t], "text": t, "truncated": cut}  # noqa: E731
    counts = C.check_gates(
        rows,
        "arith/",
        [[plain(t, False) for t in item] for item in base_t],
        [[plain(t, c) for t, c in zip(item, cut)] for item, cut in zip(mine_t, cuts)],
    )
    assert counts == {
        "repeated_token": 1,
        "repeated_ngram": 1,
        "first_token_eos": 1,
        "collapse": 1,
        "runaway": 1,
        "invalid_utf8": 1,
        "any": 3,
    }
    assert next(r for r in gate_rows if r.metric == "arith/fail_any").info["design_effect"] >= 1.0
