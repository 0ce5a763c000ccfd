"""generation on the embedded model (SmolLM2-135M-Instruct, whose tokenizer has a chat template), through
the shipped grid ``sweeps/generation.yaml`` made smaller (4 items, 24 output tokens, two schemes): the sweep
runs the generate-until task with the chat template, sampling settings and 2 seeded samples per item, and
the traces file as a generation workload; it stores per-item answers; every reported number (accuracy,
pass@2, McNemar p, flips, accuracy by length bucket, first divergence) equals a plain re-computation from
them; the identity scheme gives no flip and no divergence; the report shows the columns and judges the
``--max-task-drop`` budget on them."""

from __future__ import annotations

import json

import pytest
import yaml

from evalkit.cli import main
from evalkit.kv.scheme import Scheme
from evalkit.sweep.grid import resolve_grid
from evalkit.sweep.store import ResultStore

from tests.evals import generation_checks as C

QUANTIZED = "fp8_e5m2/tensor/unit"
IDENTITY = str(Scheme())  # the unquantized scheme, whatever its name


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gen")
    grid = yaml.safe_load(resolve_grid("generation").read_text())
    params = grid["evals"]["generation"]
    assert params["chat_template"] is True and params["samples"] == 2 and params["temperature"] > 0
    params.update(limit=4, max_gen_toks=24)
    grid["schemes"] = [IDENTITY, QUANTIZED]
    (tmp / "g.yaml").write_text(yaml.safe_dump(grid))
    out, cache = tmp / "out", tmp / "cache"
    argv = ["sweep", str(tmp / "g.yaml"), "--out", str(out), "--no-progress", "--cache-dir", str(cache)]
    assert main(argv) == 0
    view = ResultStore(out).read()
    assert len(view.complete) == 2 and not view.failed
    runs = {r["scheme"]: r for r in view.complete.values()}
    items = {
        s: json.loads((ResultStore(out).artifact_dir(r["run_id"]) / "generation_items.json").read_text())
        for s, r in runs.items()
    }
    (baseline_file,) = cache.glob("generation/*/baseline.json")
    baseline = json.loads(baseline_file.read_text())
    rows = {s: [r for r in view.rows if r["scheme"] == s] for s in runs}
    return out, rows, items, baseline, params


@pytest.mark.slow
def test_the_grid_runs_the_task_as_served_and_stores_per_item_answers(sweep):
    out, rows, items, baseline, params = sweep
    records = items[QUANTIZED]["tasks"]["evalkit_arith"]
    assert len(records) == 4
    for r in records:
        assert r["prompt"].startswith(f"<|im_start|>system\n{params['system_prompt']}<|im_end|>\n<|im_start|>user\n")
        assert r["prompt"].endswith("<|im_start|>assistant\n")
        assert r["request"]["temperature"] == params["temperature"] and r["request"]["top_p"] == params["top_p"]
        assert r["request"]["max_gen_toks"] == 24 and r["request"]["do_sample"] is True
        assert [s["seed"] for s in r["samples"]] == [0, 1]
        for s in r["samples"]:
            assert set(s) == {"seed", "text", "answer", "correct", "tokens", "truncated"} and s["correct"] in (0.0, 1.0)
    settings = items[QUANTIZED]["settings"]
    assert settings["chat_template"] is True and settings["samples"] == 2 and settings["seeds"] == [0, 1]
    assert len(items[QUANTIZED]["traces"]) == 3 and all(len(r["samples"]) == 2 for r in items[QUANTIZED]["traces"])


@pytest.mark.slow
def test_every_number_equals_a_plain_recomputation(sweep, embedded):
    out, rows, items, baseline, params = sweep
    for scheme in rows:
        C.check_task(
            rows[scheme],
            "evalkit_arith",
            "last-number",
            baseline["tasks"]["evalkit_arith"],
            items[scheme]["tasks"]["evalkit_arith"],
            embedded.tokenizer,
        )
        C.check_traces(rows[scheme], baseline["traces"], items[scheme]["traces"], lambda r: r["reference"])
        tok, task = embedded.tokenizer, "evalkit_arith"
        gens = C.task_generations(baseline["tasks"][task], tok), C.task_generations(items[scheme]["tasks"][task], tok)
        C.check_gates(rows[scheme], f"{task}/", *gens)
        traces = C.trace_generations(baseline["traces"], tok), C.trace_generations(items[scheme]["traces"], tok)
        C.check_gates(rows[scheme], "traces/", *traces)
    metrics = {r["metric"] for r in rows[QUANTIZED]}
    for stat in (
        "accuracy",
        "pass@2",
        "mcnemar_p",
        "flip_right_to_wrong",
        "flip_wrong_to_right",
        "accuracy_by_length",
        "divergence_share",
    ):
        assert f"evalkit_arith/{stat}[last-number]" in metrics
    assert {"traces/kl_mean", "traces/flip_rate", "traces/divergence_share"} <= metrics
    # an E5M2 cache with unit scales moves the sampled generations of the embedded model
    share = next(r["value"] for r in rows[QUANTIZED] if r["metric"] == "evalkit_arith/divergence_share[last-number]")
    assert share > 0 and "evalkit_arith/first_divergence[last-number]" in metrics


@pytest.mark.slow
def test_identity_scheme_gives_no_flip_and_no_divergence(sweep):
    out, rows, items, baseline, params = sweep
    assert [[s["ids"] for s in r["samples"]] for r in items[IDENTITY]["traces"]] == [
        [s["ids"] for s in r["samples"]] for r in baseline["traces"]
    ]
    for task, records in baseline["tasks"].items():
        ours = items[IDENTITY]["tasks"][task]
        assert [[s["text"] for s in r["samples"]] for r in ours] == [[s["text"] for s in r["samples"]] for r in records]
    values = {r["metric"]: r["value"] for r in rows[IDENTITY] if "bucket" not in r["labels"]}
    for prefix, suffix in (("evalkit_arith", "[last-number]"), ("traces", "")):
        for stat in ("flip_rate", "flip_right_to_wrong", "flip_wrong_to_right", "divergence_share", "accuracy_delta"):
            assert values[f"{prefix}/{stat}{suffix}"] == 0.0
        assert values[f"{prefix}/mcnemar_p{suffix}"] == 1.0 and f"{prefix}/first_divergence{suffix}" not in values
    assert values["traces/kl_mean"] == 0.0
    for prefix in ("evalkit_arith", "traces"):  # no failure gate fires where nothing changed
        assert values[f"{prefix}/fail_any"] == 0.0


@pytest.mark.slow
def test_the_report_shows_the_task_and_judges_the_accuracy_budget(sweep):
    from evalkit.report import Budget, format_table, load_store, summary_frame
    from evalkit.report.budget import verdicts

    out, rows, items, baseline, params = sweep
    frame = summary_frame(load_store(out))
    text = format_table(frame, "md")
    assert "evalkit_arith[last-number] acc" in text and "evalkit_arith[last-number] Δacc pts" in text
    row = frame[frame["scheme"] == QUANTIZED].iloc[0].to_dict()
    delta = next(r for r in rows[QUANTIZED] if r["metric"] == "evalkit_arith/accuracy_delta[last-number]")
    assert row["evalkit_arith[last-number]/gen_acc_delta"] == delta["value"]
    (v,) = [v for v in verdicts(row, Budget(max_task_drop=0.01)) if v.name == "evalkit_arith[last-number] accuracy"]
    lo, hi = delta["ci_low"], delta["ci_high"]
    expected = "inside" if lo >= -0.01 else "outside" if hi < -0.01 else "unresolved"
    assert v.state == expected
    assert not [v for v in verdicts(row, Budget()) if "accuracy" in v.name]  # off unless asked for
    fail = next(r for r in rows[QUANTIZED] if r["metric"] == "evalkit_arith/fail_any")
    (v,) = [v for v in verdicts(row, Budget(max_failure_rate=0.05)) if v.name == "evalkit_arith failures"]
    assert v.state == ("inside" if fail["ci_high"] <= 0.05 else "outside" if fail["ci_low"] > 0.05 else "unresolved")
