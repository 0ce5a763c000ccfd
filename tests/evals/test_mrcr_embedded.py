"""``run --eval generation --generation-tasks mrcr_standin`` on the embedded model (SmolLM2-135M-Instruct, with a
chat template): 4 stand-in items in two length buckets, 2 seeded samples each, the identity scheme and a
quantized one. The printed table has pass@1 per length bucket, the AUC and the % recovery; every one of them
equals a plain re-computation from the stored answers (openai/mrcr's grade by difflib, the bucket means, the
trapezoid by hand); the identity scheme recovers exactly 100 %."""

from __future__ import annotations

import json
from difflib import SequenceMatcher

import pytest

from evalkit.cli import main
from evalkit.kv.scheme import Scheme
from evalkit.sweep.store import ResultStore

IDENTITY = str(Scheme())
QUANTIZED = "fp8_e5m2/tensor/unit"


def _grade(text: str, answer: str, prefix: str) -> float:
    if not text.startswith(prefix):
        return 0.0
    return SequenceMatcher(None, text[len(prefix) :], answer[len(prefix) :]).ratio()


@pytest.mark.slow
def test_mrcr_standin_prints_per_length_pass_at_1_the_auc_and_the_recovery(tmp_path, capsys):
    from transformers import AutoTokenizer

    from evalkit.evals.generation.params import tasks_dir
    from evalkit.models.loading import ensure_embedded

    out = tmp_path / "out"
    argv = ["run", "--model", "embedded", "--eval", "generation", "--generation-tasks", "mrcr_standin"]
    argv += ["--schemes", f"{IDENTITY},{QUANTIZED}", "--generation-limit", "4", "--generation-max-gen-toks", "24"]
    argv += ["--generation-temperature", "0.7", "--generation-samples", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for column in ("mrcr_pass@1_by_length [512-1k]", "mrcr_pass@1_by_length [1k-2k]", "mrcr_auc ", "mrcr_recovery"):
        assert f"mrcr_standin/{column}" in printed, column

    store = ResultStore(out)
    view = store.read()
    tok = AutoTokenizer.from_pretrained(ensure_embedded("smollm2-135m"))
    data = json.loads((tasks_dir() / "mrcr_standin.json").read_text())
    prefixes = {d["answer"]: d["random_string_to_prepend"] for d in data["test"]}
    for run_id, run in view.complete.items():
        records = json.loads((store.artifact_dir(run_id) / "generation_items.json").read_text())["tasks"][
            "mrcr_standin"
        ]
        rows = {(r["metric"], (r["labels"] or {}).get("bucket")): r for r in view.rows if r["scheme"] == run["scheme"]}
        by_edge: dict[int, list[float]] = {}
        for rec in records:
            scores = [_grade(s["text"], rec["target"], prefixes[rec["target"]]) for s in rec["samples"]]
            assert scores == pytest.approx([s["scores"]["mrcr_score"] for s in rec["samples"]])
            n = len(tok(rec["prompt"], add_special_tokens=False)["input_ids"])
            edge = 1024 if n <= 1024 else 2048
            assert 512 < n <= 2048
            by_edge.setdefault(edge, []).append(sum(scores) / len(scores))
        y = [sum(by_edge[e]) / len(by_edge[e]) for e in (1024, 2048)]
        assert rows[("mrcr_standin/mrcr_pass@1_by_length", "512-1k")]["value"] == pytest.approx(y[0])
        assert rows[("mrcr_standin/mrcr_pass@1_by_length", "1k-2k")]["value"] == pytest.approx(y[1])
        assert rows[("mrcr_standin/mrcr_auc", None)]["value"] == pytest.approx((y[0] + y[1]) / 2)  # one trapezoid
        if run["scheme"] == IDENTITY:
            assert rows[("mrcr_standin/mrcr_recovery", None)]["value"] == 100.0
