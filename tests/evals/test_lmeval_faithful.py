"""lmeval is faithful to lm-eval: the baseline evalkit reports equals what lm-eval's own command line
reports on the same model folder, to the last digit; and on the embedded model, quantized KV
schemes flip answers and move the gold log-likelihoods."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TASKS = "evalkit_mmlu4,evalkit_topics_ppl,evalkit_passkey"


def run_lm_eval_cli(model_dir: Path, out: Path, tasks: str, limit: int) -> tuple[dict, dict[str, list[dict]]]:
    """`lm_eval --model hf ... --batch_size 1 --log_samples` as a subprocess: (results, samples per task)."""
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false"
    )
    cmd = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={model_dir},dtype=float32",
        "--include_path",
        "tasks/lmeval",
        "--tasks",
        tasks,
        "--limit",
        str(limit),
        "--batch_size",
        "1",
        "--log_samples",
        "--output_path",
        str(out),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results_file,) = out.rglob("results_*.json")
    samples = {}
    for f in out.rglob("samples_*.jsonl"):
        task = f.name[len("samples_") :].rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        for sample in samples[task]:  # the CLI writes targets and responses as str(); str(float) round-trips exactly
            if isinstance(sample["target"], str) and sample["target"].isdigit():
                sample["target"] = int(sample["target"])
    return json.loads(results_file.read_text()), samples


@pytest.mark.slow
def test_baseline_equals_lm_eval_cli_to_the_last_digit(tiny_llama_dir, tmp_path):
    from evalkit.evals.lmeval.evaluation import LmEvalEval
    from evalkit.evals.lmeval.items import item_from_sample
    from evalkit.kv.scheme import Scheme
    from evalkit.models.loading import load_model

    cli_results, cli_samples = run_lm_eval_cli(tiny_llama_dir, tmp_path / "cli", TASKS, limit=5)

    lm = load_model(str(tiny_llama_dir), dtype="float32")
    ev = LmEvalEval({"tasks": TASKS, "limit": 5})
    ev.prepare(lm, tmp_path / "work")
    rows = {r.metric: r for r in ev.evaluate(lm, Scheme())}
    compared = 0
    for task in TASKS.split(","):
        theirs = cli_results["results"][task]
        ours = ev.baseline_summary["results"][task]
        for key, value in theirs.items():
            if "," not in key or not isinstance(value, (int, float)):
                continue
            assert ours[key] == value, (task, key)  # the prepared baseline, exact
            if "_stderr" not in key:
                assert rows[f"{task}/{key.split(',')[0]}"].value == value, (task, key)  # the bf16 row, exact
                compared += 1
        assert cli_results["n-samples"][task] == ev.baseline_summary["n-samples"][task]
        # per item: the same predictions and log-likelihoods as the CLI's logged samples
        output_type = cli_results["configs"][task]["output_type"]
        cli_items = sorted((item_from_sample(s, output_type) for s in cli_samples[task]), key=lambda i: i["doc_id"])
        our_items = sorted(ev.baseline_items[task], key=lambda i: i["doc_id"])
        assert [(i["prediction"], i["gold_loglik"]) for i in cli_items] == [
            (i["prediction"], i["gold_loglik"]) for i in our_items
        ]
    assert compared == 6  # acc, acc_norm, 3 perplexity metrics, exact_match


@pytest.mark.slow
def test_quantized_kv_flips_answers_on_the_embedded_model(embedded, tmp_path):
    """40 test questions (4 short forwards each, 3 passes; all 224 take ~45 min of 2 CPU cores):
    int4 changes answers; fp8 with scale 1.0 and int4 both move every gold log-likelihood.
    (fp8 with scale 1.0 flips 1 answer of all 224: figure in the issue notes, not re-run here.)"""
    from evalkit.evals.lmeval.evaluation import LmEvalEval
    from evalkit.kv.scheme import parse_scheme

    n = 40
    ev = LmEvalEval({"tasks": "evalkit_mmlu4", "limit": n})
    ev.prepare(embedded, tmp_path)
    assert len(ev.baseline_items["evalkit_mmlu4"]) == n
    for scheme in ("fp8_e4m3/tensor/unit", "int4/tensor/dynamic"):
        rows = {r.metric: r for r in ev.evaluate(embedded, parse_scheme(scheme), tmp_path / scheme.replace("/", "_"))}
        flips = rows["evalkit_mmlu4/flip_rate"]
        delta = rows["evalkit_mmlu4/gold_loglik_abs_delta"]
        r2w, w2r = rows["evalkit_mmlu4/flip_right_to_wrong"], rows["evalkit_mmlu4/flip_wrong_to_right"]
        assert flips.value >= r2w.value + w2r.value
        # accuracy moves by exactly the net of the two kinds of flips
        base_acc = ev.baseline_summary["results"]["evalkit_mmlu4"]["acc,none"]
        assert rows["evalkit_mmlu4/acc"].value - base_acc == pytest.approx(w2r.value - r2w.value, abs=1e-12)
        assert delta.value > 0 and delta.info["n_changed"] == n, scheme
        if scheme.startswith("int4"):
            assert flips.value > 0 and flips.info["n_flipped"] >= 1
