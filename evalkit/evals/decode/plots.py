"""The decode evaluation's figure: KL(baseline || scheme) against the position of the generated token
(position buckets, log y), one line per scheme: how the error grows over a generation. Declared in
:attr:`DecodeEval.report <evalkit.evals.decode.evaluation.DecodeEval>` (``plots``); the report draws it with
its scheme style (:mod:`evalkit.evals.figures`).
"""

from __future__ import annotations

import re

from evalkit.evals.figures import add_footnote, band_note, legend_outside, ordered, slug
from evalkit.evals.figures import bands as draw_bands
from evalkit.kv.scheme import Scheme

PLOT = "evalkit.evals.decode.plots:decode_figures"  # how the evaluation declares this figure (ReportSpec.plots)


def decode_figures(results, style, bands: bool | None = None) -> dict:
    """name -> figure: decode KL per position bucket, one line per quantized scheme (x: the bucket's middle
    position, y: mean KL on a log axis), one figure per model, from the store's decode rows (``results.rows``).
    ``style``: the report's :class:`~evalkit.report.style.SchemeStyle`; ``bands``: the 95 % intervals (default:
    only when at most :data:`~evalkit.evals.figures.MAX_BANDS` series). Buckets whose KL is not above zero
    cannot sit on a log axis and are left out."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    df = results.rows
    df = df[(df["metric"] == "kl_mean") & df["labels"].map(lambda d: "bucket" in (d or {}))]  # decode's rows
    df = df[(df["scheme"] != str(Scheme())) & (df["value"] > 0)]
    if df.empty:
        return {}
    bounds = df["labels"].map(lambda d: [float(v) for v in re.findall(r"\d+", d["bucket"])[:2]])
    df = df.assign(mid=bounds.map(lambda b: (b[0] + b[-1]) / 2))
    figures = {}
    for model, g in df.groupby("model", sort=False):
        schemes = ordered(style, g["scheme"])
        drawn = draw_bands(bands, len(schemes))
        fig, ax = plt.subplots(figsize=(10, 5), layout="constrained")
        for scheme in schemes:
            s = g[g["scheme"] == scheme].sort_values("mid")
            line = style.line(scheme, model)
            ax.plot(s["mid"], s["value"], ms=4, lw=1.4, **line.kw())
            band = s[s["ci_low"].notna() & (s["ci_low"] > 0)]
            if drawn and len(band) > 1:
                ax.fill_between(band["mid"], band["ci_low"], band["ci_high"], color=line.color, alpha=0.12, lw=0)
        ax.set_yscale("log")
        ax.set_xlabel("position of the generated token (middle of its bucket)")
        ax.set_ylabel("mean KL(baseline || scheme), nats/token")
        ax.set_title(f"{model}: decode-time KL by position (teacher-forced through the stored KV cache)", fontsize=11)
        ax.grid(alpha=0.3, which="both")
        handles, labels = ax.get_legend_handles_labels()
        legend_outside(fig, handles, labels, style.legend_title(schemes))
        add_footnote(fig, style.notes(schemes, model) + band_note(drawn, len(schemes), "report.plots.decode"))
        figures[f"decode_kl_{slug(model)}"] = fig
    return figures
