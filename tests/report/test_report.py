"""The report: table numbers, ordering and rounding, LaTeX/CSV, plots, recommendation, bad input.

The results store here is a SYNTHETIC FIXTURE: hand-chosen metric values written through the
store's own writer (``ResultStore.append``), so the test knows every number the table must show.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.report import Budget, format_table, load_store, recommend, summary_frame
from evalkit.report.pareto import frontier
from evalkit.report.plots import all_plots

from tests.report import synthetic
from tests.report.synthetic import LAYOUT

# bytes per token, by hand: layers x (K,V) x heads x per-head bytes
BYTES = {
    "auto": 2 * 2 * 2 * 16 * 2,
    "fp8_e4m3/tensor/dynamic": 2 * 2 * 2 * 16,
    "fp8_e4m3/block16/dynamic": 2 * 2 * 2 * (16 + 4 / 16),
    "int4/token/dynamic": 2 * 2 * 2 * (8 + 4),
    "fp8_e5m2/tensor/unit": 2 * 2 * 2 * 16,
}
# scheme -> (ppl_delta_rel, kl, top1)
PPL = {
    "auto": (0.0, 0.0, 1.0),
    "fp8_e4m3/tensor/dynamic": (0.004, 0.0021, 0.995),
    "fp8_e4m3/block16/dynamic": (0.001, 0.0008, 0.998),
    "int4/token/dynamic": (0.05, 0.09, 0.95),
    "fp8_e5m2/tensor/unit": (-0.02, 0.03, 0.97),
}
BASE_PPL = 20.0
CODE = "sha256:" + "c0de" * 16  # the code identity the synthetic runs carry


def _row(metric, value, lo=None, hi=None, labels=None):
    return {"metric": metric, "value": value, "ci_low": lo, "ci_high": hi, "labels": labels or {}, "info": {}}


def perplexity_rows(scheme):
    rel, kl, top1 = PPL[scheme]
    ppl = BASE_PPL * (1 + rel)
    delta = _row("ppl_delta_rel", rel, rel - 0.002 if rel else None, rel + 0.002 if rel else None)
    delta["info"] = {"units": synthetic.units(rel, key=len(scheme))}  # per-window numbers: the paired order
    rows = [
        _row("ppl", ppl, ppl - 0.5, ppl + 0.5),
        _row("ppl_delta", ppl - BASE_PPL, None, None),
        delta,
        _row("kl_mean", kl, kl * 0.9, kl * 1.1),
        _row("top1_agreement", top1, top1 - 0.001, min(1.0, top1 + 0.001)),
        _row("p_value", 0.01 if rel else 1.0),
    ]
    for i, bucket in enumerate(["0-31", "32-63", "64-127"]):
        rows += [
            _row("ppl_delta_rel", rel * (1 + i), labels={"bucket": bucket}),
            _row("kl_mean", kl * (1 + i), labels={"bucket": bucket}),
        ]
    return rows


def retrieval_rows(scheme):
    rel = abs(PPL[scheme][0])
    rows = []
    accs = []
    for length in (256, 512):
        for depth in (0.0, 0.5, 1.0):
            acc = max(0.0, 1.0 - rel * 2 * (length / 256) * (1 + depth))
            accs.append(acc)
            rows.append(_row("accuracy", acc, labels={"task": "passkey", "length": length, "depth": depth}))
    mean = sum(accs) / len(accs)
    rows.append(_row("accuracy", mean, mean - 0.05, min(1.0, mean + 0.05)))
    rows.append(_row("accuracy_diff", mean - 1.0, mean - 1.001, min(0.0, mean - 0.999)))
    return rows


def lmeval_rows(scheme):
    rel = abs(PPL[scheme][0])
    return [
        _row("mini_mmlu/acc", 0.40 - rel, 0.35 - rel, 0.45 - rel, {"task": "mini_mmlu", "filter": "none"}),
        _row(
            "mini_mmlu/flip_rate",
            rel * 2,
            max(0.0, rel * 2 - 0.001),
            rel * 2 + 0.001,
            {"task": "mini_mmlu", "filter": "none"},
        ),
        _row("mini_ppl/word_perplexity", 80.0 * (1 + rel), None, None, {"task": "mini_ppl", "filter": "none"}),
        _row("mini_ppl/bits_per_byte", 0.9, None, None, {"task": "mini_ppl", "filter": "none"}),
    ]


def sensitivity_rows(scheme):
    return [_row("kl_mean", 0.001 * (layer + 1), labels={"layer": layer}) for layer in range(2)]


def write_store(folder: Path, model="tiny", info=None) -> Path:
    """SYNTHETIC results store written with the store's own writer."""
    from evalkit.sweep.store import ResultStore, RunOutcome

    store = ResultStore(folder)
    info = {"kv_layout": LAYOUT, "dtype": "float32", "versions": {"evalkit_code": CODE}} if info is None else info
    n = 0
    for scheme in PPL:
        for ev, maker in (("perplexity", perplexity_rows), ("retrieval", retrieval_rows), ("lmeval", lmeval_rows)):
            n += 1
            spec = {"model": {"name": model}, "scheme": scheme, "eval": ev, "params": {}}
            store.append(RunOutcome(f"{model}-{n:04d}", spec, True, maker(scheme), info=info))
    spec = {"model": {"name": model}, "scheme": "fp8_e4m3/tensor/dynamic", "eval": "sensitivity", "params": {}}
    store.append(RunOutcome(f"{model}-sens", spec, True, sensitivity_rows("fp8_e4m3/tensor/dynamic"), info=info))
    # a failed run and a crashed run (rows, no completion record): neither may count
    spec = {"model": {"name": model}, "scheme": "int8/tensor/dynamic", "eval": "perplexity", "params": {}}
    store.append(RunOutcome(f"{model}-fail", spec, False, error="boom"))
    with open(folder / "results.jsonl", "a") as fh:
        fh.write(
            json.dumps(
                {
                    "type": "metric",
                    "run_id": f"{model}-crash",
                    "attempt": "x",
                    "model": model,
                    "scheme": "int8/tensor/dynamic",
                    "eval": "perplexity",
                    **_row("ppl", 99.0),
                }
            )
            + "\n"
        )
    return folder


@pytest.fixture
def store(tmp_path):
    return write_store(tmp_path / "store")


def test_summary_numbers_and_order(store):
    frame = summary_frame(load_store(store))
    assert list(frame["scheme"]) == [
        "auto",
        "fp8_e4m3/block16/dynamic",
        "fp8_e4m3/tensor/dynamic",
        "fp8_e5m2/tensor/unit",
        "int4/token/dynamic",
    ]  # baseline first, then by bytes per token
    by = frame.set_index("scheme")
    assert "int8/tensor/dynamic" not in by.index  # failed and crashed runs do not count
    for scheme, want in BYTES.items():
        assert by.loc[scheme, "bytes_per_token"] == pytest.approx(want)
        assert by.loc[scheme, "capacity_x"] == pytest.approx(BYTES["auto"] / want)
        assert by.loc[scheme, "ppl_delta_rel"] == pytest.approx(PPL[scheme][0])
        assert by.loc[scheme, "top1_agreement"] == pytest.approx(PPL[scheme][2])
    assert by.loc["fp8_e4m3/tensor/dynamic", "retrieval_acc"] == pytest.approx(
        sum(max(0, 1 - 0.008 * (L / 256) * (1 + d)) for L in (256, 512) for d in (0, 0.5, 1)) / 6
    )
    assert by.loc["int4/token/dynamic", "mini_mmlu/acc"] == pytest.approx(0.35)
    assert by.loc["int4/token/dynamic", "mini_mmlu/flip_rate"] == pytest.approx(0.1)


def test_markdown_rounding_and_ci(store):
    text = format_table(summary_frame(load_store(store)), "md")
    lines = text.splitlines()
    assert lines[0].startswith("| scheme") and lines[2].startswith("| baseline (float32) ")
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:8] == [
        "scheme",
        "bytes/token",
        "capacity",
        "runs on",
        "ppl",
        "Δppl [95% CI]",
        "KL (nats)",
        "top-1 %",
    ]
    row = next(line for line in lines if "fp8_e4m3/tensor/dynamic" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # no engine estimates per-sequence dynamic scales: the row is marked hypothetical (its Δppl interval
    # [+0.20, +0.60] does not overlap E5M2's at the same 128 bytes, so no ≈ mark)
    assert cells[0] == "fp8_e4m3/tensor/dynamic †" and cells[3] == "hypothetical"
    assert cells[1:3] == ["128", "2.00x"] and cells[4] == "20.08"
    assert cells[5] == "+0.40% [+0.20, +0.60]"
    assert cells[6] == "0.0021" and cells[7] == "99.5"
    e5m2 = [c.strip() for c in next(line for line in lines if "fp8_e5m2/tensor/unit" in line).strip("|").split("|")]
    assert (
        e5m2[0] == "fp8_e5m2/tensor/unit" and e5m2[3] == "vllm-cuda (A100, L40S, RTX 50), sglang"
    )  # scale 1.0: what engines run
    block = next(line for line in lines if "block16" in line)
    assert "| 130 " in block and "1.97x" in block  # 128 data + 8 scales of 4 bytes per 16 tokens
    assert "mini_ppl word_perplexity" in header  # a perplexity-type lm-eval task shows its word perplexity
    assert cells[header.index("mini_ppl word_perplexity")] == "80.32"


def test_csv_is_raw_numbers(store):
    from io import StringIO

    frame = summary_frame(load_store(store))
    back = pd.read_csv(StringIO(format_table(frame, "csv")))
    assert back["bytes_per_token"].tolist() == pytest.approx(frame["bytes_per_token"].tolist())
    assert back.loc[back["scheme"] == "fp8_e4m3/tensor/dynamic", "ppl_delta_rel_lo"].item() == pytest.approx(0.002)


def test_latex_booktabs_and_escaping(store):
    tex = format_table(summary_frame(load_store(store)), "latex")
    for needle in (
        r"\toprule",
        r"\midrule",
        r"\bottomrule",
        r"\texttt{fp8\_e4m3/tensor/dynamic} $\dagger$ & 128",  # the marks after the name, in math
        r"\texttt{fp8\_e5m2/tensor/unit} & 128",
        r"\par $\dagger$ hypothetical: no engine profile",
        r"+0.40\% [+0.20, +0.60]",
    ):
        assert needle in tex
    assert all(ord(c) < 128 for c in tex)  # pdflatex's utf-8 input knows neither † nor ≈
    from evalkit.report.tables import _latex_cell

    assert (
        _latex_cell("scheme", "fp8_e4m3/head/static[1] † ≈2")
        == r"\texttt{fp8\_e4m3/head/static[1]} $\dagger$ $\approx$2"
    )
    assert tex.count(r"\\") == 1 + len(PPL)  # header + one line per scheme
    body = tex.split(r"\midrule")[1]
    assert "_" not in body.replace(r"\_", "")


def test_recommendation_is_cheapest_inside_budget(store):
    """The budget mechanics with no engine assumed (engine=None: hypothetical schemes count); which
    engine runs what, the float spread and the defaults: tests/report/test_recommend.py."""
    frame = summary_frame(load_store(store))
    line = recommend(frame, Budget(), engine=None)["tiny"]
    assert "use fp8_e4m3/tensor/dynamic" in line and "2.00x" in line and "+0.40%" in line
    assert "assumes no engine: hypothetical schemes included" in line
    # a tighter perplexity budget leaves only block16: the cheaper tensor row's interval crosses the limit
    tighter = recommend(frame, Budget(max_ppl_rel=0.0035), engine=None)["tiny"]
    assert "use fp8_e4m3/block16/dynamic" in tighter and "cheaper but unresolved: fp8_e4m3/tensor/dynamic" in tighter
    tight = recommend(frame, Budget(max_ppl_rel=0.0001), engine=None)["tiny"]  # block16's +0.10 [-0.10, +0.30]
    assert tight.startswith("tiny: the data cannot tell whether these are within the budget: fp8_e4m3/block16")
    assert "|Δppl| ≤ 0.01% unresolved: +0.10 [-0.10, +0.30]% crosses the limit (interval without float spread)" in tight
    assert "keep the unquantized baseline (auto scheme) until more windows resolve it" in tight
    # a looser one admits int4 (96 bytes) only if its KL, flips and retrieval pass too
    loose = Budget(max_ppl_rel=0.06, max_kl=0.1)
    assert "use fp8_e4m3/tensor/dynamic" in recommend(frame, loose, engine=None)["tiny"]
    loose = Budget(max_ppl_rel=0.06, max_kl=0.1, max_retrieval_drop=1, max_flip_rate=0.2)
    assert "use int4/token/dynamic" in recommend(frame, loose, engine=None)["tiny"]
    # vllm-cuda (the default) runs none of the dynamic schemes: only E5M2 with scale 1.0, which fails
    cuda = recommend(frame, Budget())["tiny"]
    assert cuda.startswith("tiny: keep kv_cache_dtype=auto") and "assumes vllm-cuda" in cuda
    assert "closest: fp8_e5m2/tensor/unit" in cuda


def test_frontier():
    pts = pd.DataFrame({"saved": [0, 50, 50, 60, 40], "loss": [0, 0.4, 0.1, 5, 1]})
    assert sorted(frontier(pts, "saved", "loss").index) == [0, 2, 3]


def test_plots_written_as_png_and_svg(store, tmp_path):
    results = load_store(store)
    paths = all_plots(results, summary_frame(results), tmp_path / "plots")
    names = {p.name for p in paths}
    for stem in ("pareto", "positions_tiny", "retrieval_tiny_passkey", "sensitivity_tiny_kl_mean"):
        assert {f"{stem}.png", f"{stem}.svg"} <= names
    for p in paths:
        assert p.stat().st_size > 1000
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_layout_from_model_config(tmp_path, tiny_llama_dir):
    """Without info.kv_layout the report reads the run's config.json (config only) for bytes per token."""
    from transformers import AutoConfig

    from evalkit.kv.memory import bytes_per_token
    from evalkit.kv.scheme import parse_scheme
    from evalkit.models.info import kv_layout

    folder = write_store(tmp_path / "s2", model="tinyllama", info={"model_path": str(tiny_llama_dir)})
    frame = summary_frame(load_store(folder)).set_index("scheme")
    layout = kv_layout(AutoConfig.from_pretrained(tiny_llama_dir))
    want = float(bytes_per_token(layout, parse_scheme("fp8_e4m3/tensor/dynamic")))
    assert frame.loc["fp8_e4m3/tensor/dynamic", "bytes_per_token"] == want
    assert frame.loc["auto", "bytes_per_token"] == 2 * want


def cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_report(store, tmp_path, capsys):
    code, out, _ = cli(capsys, "report", str(store))
    assert code == 0 and "| scheme" in out and "Recommendation: tiny: keep kv_cache_dtype=auto" in out
    code, out, _ = cli(
        capsys,
        "report",
        str(store),
        "--format",
        "latex",
        "--out",
        str(tmp_path / "t.tex"),
        "--plots",
        str(tmp_path / "figs"),
    )
    assert code == 0 and (tmp_path / "t.tex").read_text().startswith(r"\begin{table}")
    assert (tmp_path / "figs" / "pareto.svg").is_file()


def _foreign(folder: Path) -> Path:
    folder.mkdir()
    (folder / "results.jsonl").write_text('{"loss": 1.2}\nnot json\n')
    return folder


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "no results.jsonl"),
        (lambda p: _foreign(p / "foreign"), "holds no evalkit records"),
    ],
)
def test_cli_bad_folders_exit_2(tmp_path, capsys, make, message):
    code, out, err = cli(capsys, "report", str(make(tmp_path)))
    assert code == 2 and message in err and err.count("\n") == 1


def test_only_failed_runs(tmp_path):
    from evalkit.sweep.store import ResultStore, RunOutcome

    ResultStore(tmp_path).append(
        RunOutcome("r1", {"model": {"name": "m"}, "scheme": "auto", "eval": "perplexity"}, False, error="x")
    )
    with pytest.raises(EvalkitError, match="no completed runs"):
        load_store(tmp_path)


def test_sensitivity_rows_file_joins_the_plots(store, tmp_path, capsys):
    """rows.jsonl as `evalkit sensitivity --out` writes it (labels.layer) feeds the per-layer plot."""
    rows = tmp_path / "sens" / "rows.jsonl"
    rows.parent.mkdir()
    rows.write_text(
        "".join(
            json.dumps(
                {
                    "metric": "kl_mean_one_layer",
                    "value": 0.01 * i,
                    "ci_low": None,
                    "ci_high": None,
                    "labels": {"layer": i},
                    "info": {},
                    "model": "tiny",
                    "scheme": "fp8_e4m3/tensor/dynamic",
                    "eval": "sensitivity",
                }
            )
            + "\n"
            for i in range(3)
        )
    )
    code, out, _ = cli(
        capsys, "report", str(store), "--sensitivity", str(rows.parent), "--plots", str(tmp_path / "figs")
    )
    assert code == 0 and (tmp_path / "figs" / "sensitivity_tiny_kl_mean_one_layer.png").is_file()
    rows.write_text('{"foo": 1}\n')
    code, _, err = cli(capsys, "report", str(store), "--sensitivity", str(rows))
    assert code == 2 and "not an evalkit result row" in err


# ---- what a reader needs to read the table -----------------------------------------------------

STATIC_T = "fp8_e4m3/tensor/static+scales=calibration/some-model-tensor-amax.safetensors"
STATIC_H = "fp8_e4m3/head/static+scales=/data/scales/some-model-head-amax.safetensors+skip=0"


def write_ppl_store(folder: Path, schemes: dict, infos: dict | None = None, constant: bool = True) -> Path:
    """SYNTHETIC store: a perplexity run per scheme ((Δppl rel, top-1) each), plus, if ``constant``, an
    lm-eval run whose accuracy and flips are the same for every scheme."""
    from evalkit.sweep.store import ResultStore, RunOutcome

    store = ResultStore(folder)
    for i, (scheme, (rel, top1)) in enumerate(schemes.items()):
        info = {
            "kv_layout": LAYOUT,
            "dtype": "float32",
            "versions": {"evalkit_code": CODE},
            **(infos or {}).get(scheme, {}),
        }
        delta = _row("ppl_delta_rel", rel, rel - 0.0005, rel + 0.0005)
        delta["info"] = {"units": synthetic.units(rel, own=0)}  # no noise of its own: distinct rows are ordered
        rows = [
            _row("ppl", BASE_PPL * (1 + rel)),
            delta,
            _row("kl_mean", rel / 10, rel / 11, rel / 9),
            _row("top1_agreement", top1, top1 - 0.001, min(1.0, top1 + 0.001)),
        ]
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": "perplexity", "params": {}}
        store.append(RunOutcome(f"p{i}", spec, True, rows, info=info))
        if constant:
            labels = {"task": "mcq", "filter": "none"}
            rows = [_row("mcq/acc", 0.25, 0.1, 0.5, labels), _row("mcq/flip_rate", 0.0, 0.0, 0.01, labels)]
            store.append(RunOutcome(f"l{i}", {**spec, "eval": "lmeval"}, True, rows, info=info))
    return folder


def md_rows(text: str) -> tuple[list[str], dict[str, list[str]]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells
    return header, rows


def test_static_schemes_short_name_and_scale_file_in_a_note(tmp_path):
    folder = write_ppl_store(tmp_path / "s", {"auto": (0, 1), STATIC_T: (0.004, 0.995), STATIC_H: (0.003, 0.996)})
    frame = summary_frame(load_store(folder))
    text = format_table(frame, "md")
    _, rows = md_rows(text)
    assert set(rows) == {"baseline (float32)", "fp8_e4m3/head/static[1]+skip=0", "fp8_e4m3/tensor/static[2]"}
    assert "- [1] static scales from /data/scales/some-model-head-amax.safetensors\n" in text
    assert "- [2] static scales from calibration/some-model-tensor-amax.safetensors\n" in text
    assert not any("safetensors" in line for line in text.splitlines() if line.startswith("|"))
    tex = format_table(frame, "latex")
    assert r"\texttt{fp8\_e4m3/tensor/static[2]}" in tex and r"[2] static scales from calibration/some-model" in tex
    assert "+scales=" not in tex
    from io import StringIO

    csv = pd.read_csv(StringIO(format_table(frame, "csv")))
    assert set(csv["scheme"]) == {"auto", STATIC_T, STATIC_H}  # the full strings, raw
    assert set(csv["dtype"]) == {"float32"} and set(csv["code"]) == {CODE}


def test_baseline_row_names_the_dtype_the_model_ran_in(tmp_path):
    folder = write_ppl_store(tmp_path / "s", {"auto": (0, 1), "fp8_e4m3/tensor/dynamic": (0.004, 0.995)})
    text = format_table(summary_frame(load_store(folder)), "md")
    _, rows = md_rows(text)
    assert "baseline (float32)" in rows and "auto" not in rows
    assert (
        "- baseline (float32): nothing quantized, the KV cache in the dtype the model ran in; bytes/token and "
        "capacity count a bf16 cache" in text
    )
    # a store written before runs recorded their dtype: no guess
    old = write_ppl_store(
        tmp_path / "old",
        {"auto": (0, 1), "fp8_e4m3/tensor/dynamic": (0.004, 0.995)},
        infos={"auto": {"dtype": None}, "fp8_e4m3/tensor/dynamic": {"dtype": None}},
    )
    text = format_table(summary_frame(load_store(old)), "md")
    assert "baseline" in md_rows(text)[1] and "(float32)" not in text


def test_constant_columns_are_flagged(tmp_path):
    folder = write_ppl_store(
        tmp_path / "s",
        {"auto": (0, 1), "fp8_e4m3/tensor/dynamic": (0.004, 0.995), "fp8_e5m2/tensor/dynamic": (0.04, 0.95)},
    )
    text = format_table(summary_frame(load_store(folder)), "md")
    header, _ = md_rows(text)
    assert "mcq acc" in header and "mcq flips %" in header  # flagged, not dropped
    note = next(line for line in text.splitlines() if "do not separate" in line)
    assert note == "- the same on every row, so they do not separate the schemes: mcq acc = 0.250; mcq flips % = 0.0"
    assert "ppl" not in note.split(":", 1)[1] and "top-1" not in note
    tex = format_table(summary_frame(load_store(folder)), "latex")
    assert "do not separate the schemes: mcq acc = 0.250" in tex
    # with nothing constant, no note
    plain = write_ppl_store(
        tmp_path / "p",
        {"auto": (0, 1), "fp8_e4m3/tensor/dynamic": (0.004, 0.995), "fp8_e5m2/tensor/dynamic": (0.04, 0.95)},
        constant=False,
    )
    assert "do not separate" not in format_table(summary_frame(load_store(plain)), "md")


def test_recommendation_says_which_criterion_failed_and_by_how_much(tmp_path):
    folder = write_ppl_store(
        tmp_path / "s",
        {"auto": (0, 1), "fp8_e4m3/tensor/dynamic": (0.004, 0.954), "fp8_e5m2/tensor/dynamic": (0.03, 0.95)},
        constant=False,
    )
    frame = summary_frame(load_store(folder))
    line = recommend(frame, Budget(min_top1=0.99), engine=None)["tiny"]
    assert line.startswith("tiny: keep the unquantized baseline (auto scheme): no quantized scheme")
    assert "closest: fp8_e4m3/tensor/dynamic (fails top-1 ≥ 99%: 95.40 [95.30, 95.50]%, short by 3.60 pts" in line
    line = recommend(frame, Budget(max_ppl_rel=0.001), engine=None)["tiny"]
    assert "closest: fp8_e4m3/tensor/dynamic (fails |Δppl| ≤ 0.1%: +0.40 [+0.35, +0.45]%, over by 0.30 pts" in line
    # retrieval and flips say their gap too (the main fixture's int4: drop and 10 % flips)
    frame = summary_frame(load_store(write_store(tmp_path / "full")))
    line = recommend(
        frame[frame["scheme"].isin(["auto", "int4/token/dynamic"])], Budget(max_ppl_rel=0.1, max_kl=None), engine=None
    )["tiny"]
    assert "fails retrieval drop ≤ 2 pts: 22.5 [22.4, 22.6] pts, over by 20.5 pts" in line
    assert "fails mini_mmlu flips ≤ 5%: 10.0 [9.9, 10.1]%, over by 5.0 pts" in line


def test_mixed_code_identities_are_flagged_and_superseded_runs_left_out(tmp_path, capsys):
    """Runs of one spec computed by other code are superseded by the newer run; a table whose counted
    runs still come from two code identities says so, with the fix."""
    from evalkit.sweep.store import ResultStore, RunOutcome

    schemes = {"auto": (0, 1), "fp8_e4m3/tensor/dynamic": (0.004, 0.995), "fp8_e5m2/tensor/dynamic": (0.04, 0.95)}
    folder = write_ppl_store(tmp_path / "s", schemes, constant=False)
    assert not any("code" in n for n in summary_frame(load_store(folder)).attrs["store_notes"])
    # the e5m2 run recomputed by new code: the old one is superseded, one identity remains... for that row
    new = "sha256:" + "1ea" * 21 + "f"
    spec = {"model": {"name": "tiny"}, "scheme": "fp8_e5m2/tensor/dynamic", "eval": "perplexity", "params": {}}
    rows = [_row("ppl", 21.0), _row("ppl_delta_rel", 0.05), _row("kl_mean", 0.005), _row("top1_agreement", 0.94)]
    ResultStore(folder).append(
        RunOutcome(
            "p2-new",
            spec,
            True,
            rows,
            info={"kv_layout": LAYOUT, "dtype": "float32", "versions": {"evalkit_code": new}},
        )
    )
    results = load_store(folder)
    assert set(results.complete) == {"p0", "p1", "p2-new"} and set(results.superseded) == {"p2"}
    frame = summary_frame(results)
    assert frame.set_index("scheme").loc["fp8_e5m2/tensor/dynamic", "ppl_delta_rel"] == pytest.approx(0.05)
    assert frame.set_index("scheme").loc["fp8_e5m2/tensor/dynamic", "code"] == new
    text = format_table(frame, "md")
    note = next(line for line in text.splitlines() if "MIXED CODE" in line)
    assert "2 versions of evalkit's code (sha256:c0dec0de: 2 runs, sha256:1ea1ea1e: 1 runs)" in note
    assert f"python -m evalkit sweep GRID --out {folder}" in note
    assert (
        "- 1 older runs of the same specs (other code or libraries) are superseded by newer ones and not shown" in text
    )
    assert "MIXED CODE" in format_table(frame, "latex")
    # the CLI prints the notes under the table (and to stderr for CSV, which has none)
    code, out, err = cli(capsys, "report", str(folder))
    assert code == 0 and "MIXED CODE" in out
    code, out, err = cli(capsys, "report", str(folder), "--format", "csv")
    assert code == 0 and "MIXED CODE" in err and "MIXED CODE" not in out


def test_a_run_through_a_bumped_component_is_not_mixed_code(tmp_path):
    """A run whose evaluation (or codec family) has a bumped numerics version carries an identity of its own by
    design, named in its code record's components: no MIXED CODE for it; two identities for runs through the
    same components still are."""
    from evalkit.sweep.store import ResultStore, RunOutcome

    schemes = {"auto": (0, 1), "fp8_e4m3/tensor/dynamic": (0.004, 0.995), "fp8_e5m2/tensor/dynamic": (0.04, 0.95)}
    folder = write_ppl_store(tmp_path / "s", schemes, constant=False)
    spec = {"model": {"name": "tiny"}, "scheme": "fp8_e5m2/tensor/dynamic", "eval": "perplexity", "params": {}}
    rows = [_row("ppl", 21.0), _row("ppl_delta_rel", 0.05), _row("kl_mean", 0.005), _row("top1_agreement", 0.94)]

    def append(run_id: str, code: str, parts: dict) -> list[str]:
        info = {"kv_layout": LAYOUT, "dtype": "float32", "versions": {"evalkit_code": code}}
        info["code"] = {"identity": code, **({"components": parts} if parts else {})}
        ResultStore(folder).append(RunOutcome(run_id, spec, True, rows, info=info))
        return summary_frame(load_store(folder)).attrs["store_notes"]

    bumped = "sha256:" + "b0" * 32
    assert not any("MIXED CODE" in n for n in append("p2-bumped", bumped, {"eval:perplexity": 1}))
    assert any("MIXED CODE" in n for n in append("p2-other", "sha256:" + "0e" * 32, {}))


def test_runs_from_two_platforms_are_flagged(tmp_path):
    """A table whose runs were computed on two processors says so (quantization amplifies their rounding)."""
    from evalkit.sweep.store import ResultStore, RunOutcome

    schemes = {"auto": (0, 1), "fp8_e4m3/tensor/dynamic": (0.004, 0.995)}
    folder = write_ppl_store(tmp_path / "s", schemes, constant=False)
    assert not any("PLATFORM" in n for n in summary_frame(load_store(folder)).attrs["store_notes"])
    here = {"cpu": "Xeon", "cpu_id": "GenuineIntel/6/207/2", "cpu_capability": "AVX512", "mkl_cbwr": "AUTO,STRICT"}
    there = {**here, "cpu": "EPYC", "cpu_id": "AuthenticAMD/25/1/1", "cpu_capability": "AVX2"}
    rows = [_row("ppl", 21.0), _row("ppl_delta_rel", 0.05), _row("kl_mean", 0.005), _row("top1_agreement", 0.94)]
    store = ResultStore(folder)
    for run_id, scheme, where in (("q1", "fp8_e5m2/tensor/dynamic", here), ("q2", "int8/token/dynamic", there)):
        spec = {"model": {"name": "tiny"}, "scheme": scheme, "eval": "perplexity", "params": {}}
        store.append(
            RunOutcome(
                run_id,
                spec,
                True,
                rows,
                info={
                    "kv_layout": LAYOUT,
                    "dtype": "float32",
                    "device": "cpu",
                    "platform": where,
                    "versions": {"evalkit_code": CODE},
                },
            )
        )
    text = format_table(summary_frame(load_store(folder)), "md")
    note = next(line for line in text.splitlines() if "MIXED PLATFORM" in line)
    assert "2 platforms" in note and "Xeon [GenuineIntel/6/207/2], AVX512, MKL_CBWR=AUTO,STRICT: 1 runs" in note
    assert "EPYC [AuthenticAMD/25/1/1], AVX2" in note


def test_pareto_plot_is_legible(tmp_path):
    """At its default size: every text inside the figure (title not clipped), no two labels overlap,
    static schemes by their short name, and the x range is the schemes' own, not 0..50 %."""
    schemes = {"auto": (0, 1)}
    for fmt, base in (("fp8_e4m3", 0.007), ("fp8_e5m2", 0.045)):
        for j, gran in enumerate(("tensor", "head", "block16")):
            for k, src in enumerate(("dynamic", "unit")):
                schemes[f"{fmt}/{gran}/{src}"] = (base + 0.0002 * (2 * j + k), 0.98)
    schemes[STATIC_T] = (0.0071, 0.98)
    frame = summary_frame(load_store(write_ppl_store(tmp_path / "s", schemes, constant=False)))
    from matplotlib.text import Text

    from evalkit.report.pareto import pareto_figure

    fig = pareto_figure(frame)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    ax = fig.axes[0]
    texts = [
        ax.title,
        ax.xaxis.label,
        ax.yaxis.label,
        *ax.texts,
        *fig.texts,
        *(t for lg in fig.legends for t in lg.get_texts()),
    ]
    for t in texts:
        ext = Text.get_window_extent(t, renderer)
        assert ext.x0 >= box.x0 - 1 and ext.x1 <= box.x1 + 1 and ext.y0 >= box.y0 - 1 and ext.y1 <= box.y1 + 1, (
            t.get_text()
        )
    labels = [t for t in ax.texts if t.get_text() in set(scheme_labels_of(frame))]  # the table's, marks included
    shown = [t.get_text() for t in labels]
    assert len(labels) == len(schemes) - 1 and "fp8_e4m3/tensor/static[1]" in shown
    assert "fp8_e4m3/tensor/dynamic †" in shown and "fp8_e4m3/tensor/unit" in shown  # † hypothetical: no engine runs it
    footnote = " ".join(" ".join(t.get_text().split()) for t in fig.texts)
    assert "† hypothetical: no engine profile" in footnote
    extents = [Text.get_window_extent(t, renderer) for t in labels]  # the text alone, not its leader line
    for i, a in enumerate(extents):
        for b in extents[i + 1 :]:
            assert not a.overlaps(b)
    assert ax.get_xlim()[0] > 45  # not squeezed against a baseline at 0 %
    assert any("static scales from calibration/some-model-tensor-amax.safetensors" in t.get_text() for t in fig.texts)


def scheme_labels_of(frame):
    from evalkit.report.tables import scheme_labels

    return scheme_labels(frame)[0]


def test_spread_labels_keeps_order_gap_and_bounds():
    from evalkit.report.pareto import spread_labels

    ys = [0.5, 0.51, 0.5, 0.9, 0.02, 0.99]
    pos = spread_labels(ys, 0.05)
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    placed = [pos[i] for i in order]
    assert all(b - a >= 0.05 - 1e-9 for a, b in zip(placed, placed[1:]))
    assert 0 <= min(pos) and max(pos) <= 1
    assert pos[4] == pytest.approx(0.02) and spread_labels([0.3], 0.05) == [0.3]
    many = spread_labels([0.5] * 30, 0.05)  # cannot fit at 0.05: the gap shrinks, bounds hold
    assert 0 <= min(many) and max(many) <= 1 and len(set(round(p, 9) for p in many)) == 30
