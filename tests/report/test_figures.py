"""Every figure of the published default store agrees with its table and is fit for a slide.

The figures are drawn from ``published/default`` (the default sweep's committed store) as the
report draws them, and read back through matplotlib's own objects: the scheme names each figure
shows (legend entries, panel titles, point labels) are the table's labels, a figure that shows a
numbered static label carries the table's footnote for it, no two series share a colour and line
style, no legend lies over a panel's data area, no text falls off the canvas, the retrieval grid
wraps at four columns and says how many samples a cell holds, and the saved PNGs are the shape of
a slide. Per-layer sensitivity rows (``labels.layer``, the form `evalkit sensitivity --out` writes)
are added for two of the store's schemes, a static one among them, so that figure is checked too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from evalkit.evals.decode.plots import decode_figures  # noqa: E402
from evalkit.report import load_store, summary_frame  # noqa: E402
from evalkit.report.plots import MAX_BANDS, figures, report_style  # noqa: E402
from evalkit.report.results import add_rows_file  # noqa: E402
from evalkit.report.style import SchemeStyle  # noqa: E402
from evalkit.report.tables import display_frame, table_notes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "published" / "default"
STATIC_HEAD = "fp8_e4m3/head/static+scales=calibration/smollm2-135m-head-amax.safetensors"
SENSITIVITY_SCHEMES = ("fp8_e4m3/tensor/unit", STATIC_HEAD)

pytestmark = pytest.mark.slow  # draws and reads back every figure of the store (tens of seconds)


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """(the table's labels by scheme, its notes, name -> figure) for the published store."""
    rows = tmp_path_factory.mktemp("sens") / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps(
                {
                    "model": "embedded",
                    "scheme": s,
                    "eval": "sensitivity",
                    "metric": metric,
                    "value": 0.001 * (layer + 1) * (k + 1),
                    "ci_low": None,
                    "ci_high": None,
                    "labels": {"layer": layer},
                    "info": {},
                }
            )
            + "\n"
            for k, s in enumerate(SENSITIVITY_SCHEMES)
            for layer in range(30)
            for metric in ("kl_mean_one_layer", "ppl_delta_rel_all_but_one")
        )
    )
    results = load_store(STORE)
    add_rows_file(results, rows)
    frame = summary_frame(results)
    table = display_frame(frame)
    labels = dict(zip(frame["scheme"], table["scheme"]))
    figs = figures(results, frame)
    for fig in figs.values():
        fig.canvas.draw()
    yield labels, table_notes(frame, table), figs, results
    for fig in figs.values():
        plt.close(fig)


def test_the_default_store_draws_every_view(drawn):
    _, _, figs, _ = drawn
    assert set(figs) == {
        "pareto",
        "pareto_decode",
        "positions_embedded",
        "decode_kl_embedded",
        "retrieval_embedded_passkey",
        "retrieval_embedded_niah_single_number",
        "sensitivity_embedded_kl_mean_one_layer",
        "sensitivity_embedded_ppl_delta_rel_all_but_one",
    }


def series(fig) -> list[Line2D]:
    return [ln for ax in fig.axes for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def legend_texts(fig) -> list[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text() for lg in legends for t in lg.get_texts()]


def shown_scheme_labels(name: str, fig) -> list[str]:
    """The scheme names a figure shows a reader."""
    if name.startswith("pareto"):  # the label column beside the points
        return [t.get_text() for t in fig.axes[0].texts]
    if name.startswith("retrieval"):  # one panel per scheme, titles wrapped
        return [ax.get_title().replace("\n", "") for ax in fig.axes if ax.get_title()]
    return legend_texts(fig)


@pytest.mark.parametrize(
    "name",
    [
        "pareto",
        "pareto_decode",
        "positions_embedded",
        "decode_kl_embedded",
        "retrieval_embedded_passkey",
        "sensitivity_embedded_kl_mean_one_layer",
    ],
)
def test_figure_labels_are_the_tables(drawn, name):
    """The decode figure used to number the static files in its own order (tensor/static[1] where the
    table said head/static[1]): every figure now shows exactly the table's label of each scheme, its
    marks included (``†`` hypothetical, ``≈n`` not ordered by the paired Δppl intervals), with the notes of the
    static files and marks it shows."""
    labels, notes, figs, results = drawn
    fig = figs[name]
    shown = shown_scheme_labels(name, fig)
    table_labels = set(labels.values())
    assert shown and set(shown) <= table_labels, set(shown) - table_labels
    assert len(shown) == len(set(shown))
    # vllm-cuda runs per-head static scales (on its FA3 path): not hypothetical; its ≈ numbers are the data's
    # (≈? where the store has no per-window units: its order not assessed)
    assert re.fullmatch(r"fp8_e4m3/head/static\[1\]( ≈[\d?]+(,[\d?]+)*)?", labels[STATIC_HEAD]), labels[STATIC_HEAD]
    assert labels["fp8_e4m3/tensor/dynamic"].startswith("fp8_e4m3/tensor/dynamic †")  # no engine runs dynamic
    if name.startswith("sensitivity"):
        assert set(shown) == {labels[s] for s in SENSITIVITY_SCHEMES}
    elif name.startswith("retrieval"):
        assert set(shown) == table_labels  # the baseline has a panel too
    else:
        assert set(shown) == table_labels - {labels["auto"]}
    figure_text = " ".join(" ".join(t.get_text().split()) for t in fig.texts)  # footnotes wrap
    for n in sorted({label.split("[")[1][0] for label in shown if "[" in label}):
        note = next(note for note in notes if note.startswith(f"[{n}] "))
        assert note in figure_text, f"{name} shows [{n}] without its footnote"
    for symbol, head in (("†", "† hypothetical"), ("≈", "≈")):  # ≈n: and ≈?: each a note of the table
        if any(symbol in label for label in shown):
            table_notes = [note for note in notes if note.startswith(head)]
            assert table_notes and all(note in figure_text for note in table_notes), (
                f"{name} shows {symbol} without the table's note for it"
            )


@pytest.mark.parametrize("name", ["positions_embedded", "decode_kl_embedded", "sensitivity_embedded_kl_mean_one_layer"])
def test_no_two_series_look_alike(drawn, name):
    """One colour per scheme (a format's schemes share a hue in different shades), so no two series
    share colour and line style; the legend's title says what the line styles and markers mean."""
    _, _, figs, results = drawn
    fig = figs[name]
    for ax in fig.axes:
        looks = {}
        for ln in ax.get_lines():
            if ln.get_label().startswith("_"):
                continue
            look = (to_rgba(ln.get_color()), ln.get_linestyle())
            assert look not in looks, f"{ln.get_label()} looks like {looks.get(look)}"
            looks[look] = ln.get_label()
        colours = [to_rgba(ln.get_color()) for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        assert len(set(colours)) == len(colours)
    title = fig.legends[0].get_title().get_text()
    assert "line: scales" in title and "marker: granularity" in title
    by_label = {ln.get_label(): ln for ln in series(fig)}
    labels = drawn[0]  # the table's labels, marks included
    head, tensor = by_label[labels[STATIC_HEAD]], by_label[labels["fp8_e4m3/tensor/unit"]]
    assert head.get_marker() != tensor.get_marker() and head.get_linestyle() != tensor.get_linestyle()
    style = SchemeStyle.of_store(results)
    assert to_rgba(head.get_color()) == to_rgba(style.color(STATIC_HEAD))


def test_same_scheme_same_colour_in_every_figure(drawn):
    _, _, figs, _ = drawn
    seen: dict[str, tuple] = {}
    for fig in figs.values():
        for ln in series(fig):
            colour = to_rgba(ln.get_color())
            assert seen.setdefault(ln.get_label(), colour) == colour, ln.get_label()
    assert len(set(seen.values())) == len(seen)


@pytest.mark.parametrize(
    "name",
    [
        "pareto",
        "pareto_decode",
        "positions_embedded",
        "decode_kl_embedded",
        "retrieval_embedded_passkey",
        "retrieval_embedded_niah_single_number",
        "sensitivity_embedded_kl_mean_one_layer",
    ],
)
def test_legends_off_the_data_and_nothing_clipped(drawn, name):
    _, _, figs, _ = drawn
    fig = figs[name]
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.axison]
    for lg in legends:
        box = lg.get_window_extent(renderer)
        for ax in panels:
            assert not box.shrunk(0.99, 0.99).overlaps(ax.get_window_extent(renderer)), f"{name}: legend over a panel"
    texts = [*fig.texts, *(t for lg in legends for t in [*lg.get_texts(), lg.get_title()])]
    if fig._suptitle is not None:
        texts.append(fig._suptitle)
    for ax in panels:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
    canvas = fig.bbox
    for t in texts:
        if not t.get_text():
            continue
        ext = t.get_window_extent(renderer)
        assert (
            ext.x0 >= canvas.x0 - 1 and ext.x1 <= canvas.x1 + 1 and ext.y0 >= canvas.y0 - 1 and ext.y1 <= canvas.y1 + 1
        ), f"{name}: {t.get_text()!r} is cut off"


def test_retrieval_wraps_at_four_columns_and_counts_samples(drawn):
    _, _, figs, _ = drawn
    for name in ("retrieval_embedded_passkey", "retrieval_embedded_niah_single_number"):
        fig = figs[name]
        panels = [ax for ax in fig.axes if ax.get_title()]
        assert len(panels) == 13
        columns = {round(ax.get_position().x0, 3) for ax in panels}
        rows = {round(ax.get_position().y0, 3) for ax in panels}
        assert len(columns) <= 4 and len(rows) == 4
        assert "each cell is 1 sample" in fig._suptitle.get_text()
        assert fig._suptitle.get_text().count("\n") <= 2  # one title, not one per panel over each other


def test_readable_axis_labels(drawn):
    _, _, figs, _ = drawn
    for name, fig in figs.items():
        for ax in fig.axes:
            if ax.get_label() == "<colorbar>":
                continue
            assert "_" not in ax.get_ylabel(), f"{name}: raw y label {ax.get_ylabel()!r}"
    assert "only this layer quantized" in figs["sensitivity_embedded_kl_mean_one_layer"].axes[0].get_ylabel()
    assert "(%)" in figs["sensitivity_embedded_ppl_delta_rel_all_but_one"].axes[0].get_ylabel()


def test_bands_off_by_default_beyond_six_series(drawn):
    """Twelve shaded bands blur together: the decode figure draws none unless asked, and says so."""
    _, _, figs, results = drawn
    fig = figs["decode_kl_embedded"]
    assert len(series(fig)) > MAX_BANDS
    assert not fig.axes[0].collections
    assert any("intervals not drawn" in t.get_text() for t in fig.texts)
    banded = decode_figures(results, report_style(results), bands=True)["decode_kl_embedded"]
    assert len(banded.axes[0].collections) == len(series(banded))
    plt.close(banded)


def test_saved_pngs_fit_a_slide(tmp_path):
    """The PNGs `report --plots` writes: none wider than 2,400 px or flatter than 3:1 (the retrieval
    figure was 6,075 x 540 px, 13 panels in a row)."""
    from PIL import Image

    from evalkit.report.plots import all_plots

    results = load_store(STORE)
    paths = [p for p in all_plots(results, summary_frame(results), tmp_path) if p.suffix == ".png"]
    assert len(paths) == 6  # pareto, pareto_decode, positions, decode, two retrieval heatmaps
    for p in paths:
        width, height = Image.open(p).size
        assert width <= 2400 and width / height <= 3, f"{p.name}: {width} x {height} px"


def test_style_numbers_files_alike_whatever_the_order():
    """The numbering that used to follow each view's own row order: now the store's files in path
    order, so a view in any order (or one showing fewer rows) numbers a file as the table does."""
    a = "fp8_e4m3/tensor/static+scales=calibration/b-tensor.safetensors"
    b = "fp8_e4m3/head/static+scales=calibration/a-head.safetensors"
    forward, backward = SchemeStyle(["auto", a, b, "nvfp4", "mxfp4"]), SchemeStyle(["mxfp4", b, "nvfp4", a, "auto"])
    for style in (forward, backward):
        assert style.label(a) == "fp8_e4m3/tensor/static[2]" and style.label(b) == "fp8_e4m3/head/static[1]"
        assert style.notes([a]) == ["[2] static scales from calibration/b-tensor.safetensors"]
        assert style.label("auto", dtype="float32") == "baseline (float32)" and style.color("auto") == "black"
        assert style.family_label("fp4_e2m1") == "fp4_e2m1 (nvfp4, mxfp4)"
        assert style.line(a).linestyle == ":" and style.line("nvfp4").linestyle == "-"
    assert [forward.color(s) for s in (a, b, "nvfp4", "mxfp4")] == [backward.color(s) for s in (a, b, "nvfp4", "mxfp4")]
    assert len({forward.color(s) for s in (a, b, "nvfp4", "mxfp4")}) == 4
