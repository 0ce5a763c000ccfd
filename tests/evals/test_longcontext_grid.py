"""longcontext through the sweep grid on the shipped stand-ins (a RULER task and a LongBench v2 task, the
embedded model, offline): scores per context length, paired tests against the baseline recomputed from the
run's per-item artifact, the identity scheme's items equal to the baseline's; and the one-line errors for
real tasks whose data or extra is missing here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest

from evalkit.cli import main
from evalkit.errors import EvalkitError

GRID = """name: lc
models: [embedded]
schemes: [auto, int4/tensor/dynamic]
evals:
  longcontext: {tasks: [longctx_ruler_niah_single_1, longctx_longbench2], limit: 1}
"""


@pytest.mark.slow
def test_standins_run_through_the_grid_with_paired_tests(tmp_path):
    grid = tmp_path / "lc.yaml"
    grid.write_text(GRID)
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--out", str(out), "--cache-dir", str(tmp_path / "c"), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("type") == "metric"]
    by = {(r["scheme"], r["metric"], r["labels"]["length"]): r for r in rows}
    lengths = {"longctx_ruler_niah_single_1": ["256", "512", "all"], "longctx_longbench2": ["short", "medium", "all"]}
    for scheme in ("auto", "int4/tensor/dynamic"):
        run_id = next(r["run_id"] for r in rows if r["scheme"] == scheme)
        art = json.loads((out / "runs" / run_id[:16] / "longcontext_items.json").read_text())
        items, base = art["items"], art["baseline"]
        if scheme == "auto":  # the identity scheme: every item as the baseline's, answer and score
            assert [(i["score"], i["prediction"]) for i in items] == [(b["score"], b["prediction"]) for b in base]
        for task, labels in lengths.items():
            for length in labels:
                s, b = (
                    {x["doc_id"]: x["score"] for x in xs if x["task"] == task and length in ("all", x["length"])}
                    for xs in (items, base)
                )
                assert s and s.keys() == b.keys()
                diff = np.mean([s[k] - b[k] for k in s])
                score, d, p = (by[(scheme, f"{task}/{m}", length)] for m in ("score", "score_diff", "p_value"))
                assert score["value"] == pytest.approx(np.mean(list(s.values())))
                assert d["value"] == pytest.approx(diff) and d["info"]["test"] == "mcnemar_exact"
                fell = sum(s[k] < b[k] for k in s)
                rose = sum(s[k] > b[k] for k in s)
                want = 1.0 if fell + rose == 0 else binomtest(fell, fell + rose, 0.5).pvalue
                assert p["value"] == pytest.approx(want)
                lm = score["info"].get("lm_eval_value")  # lm-eval's own aggregate where it has one
                if task.endswith("niah_single_1") and length != "all" or length == "all" and "longbench" in task:
                    assert lm == pytest.approx(score["value"])
                if scheme == "auto":
                    assert (
                        d["value"] == 0
                        and p["value"] == 1
                        and by[(scheme, f"{task}/discordance", length)]["value"] == 0
                    )


def _load_error(name: str) -> str:
    from evalkit.evals.longcontext.tasks import load_tasks, resolve

    taskset = resolve([name], (), {"pretrained": "embedded-tokenizer-not-needed"})
    with pytest.raises(EvalkitError) as exc:
        load_tasks(taskset, [name])
    return str(exc.value)


@pytest.mark.slow
def test_real_tasks_without_their_data_fail_in_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    msg = _load_error("longbench2_academic_single")
    assert "\n" not in msg and "longbench2_academic_single" in msg and "recursal/longbench-v2" in msg
    assert "HF_HUB_OFFLINE unset" in msg and "longctx_longbench2" in msg
    if importlib.util.find_spec("wonderwords") is None:  # lm-eval's RULER extra is not installed here
        msg = _load_error("niah_single_1")
        assert "\n" not in msg and "niah_single_1" in msg and "pip install 'lm_eval[ruler]'" in msg


def test_unknown_tasks_and_stand_in_lengths_fail_in_one_line(embedded, tmp_path):
    from evalkit.evals.base import get_eval

    ev = get_eval("longcontext")({"tasks": ["longctx_ruler_vt"], "lengths": [4096]})
    with pytest.raises(EvalkitError, match="holds items at \\[768, 1024\\] tokens only") as exc:
        ev.prepare(embedded, Path(tmp_path))
    assert "\n" not in str(exc.value)
