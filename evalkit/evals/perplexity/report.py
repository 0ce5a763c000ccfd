"""What the report shows of the perplexity eval beyond its plain columns: whether its intervals include
the float spread (``float_noise_seeds``), as a summary-frame column and a note under the table, and
which rows' one-forward measures read no quantized K/V (the engine dtypes whose first-chunk prefill
attends the raw K/V)."""

from __future__ import annotations

import pandas as pd

from evalkit.evals import skew_bound

FLOAT_COLUMN = "float_noise_seeds"  # summary column: perturbed-weight reruns behind a row's intervals (0: none)


def float_noise_frame(rows: pd.DataFrame, slot) -> None:
    """``float_noise_seeds`` (and the Δppl float SD, ``ppl_delta_rel_float_sd``) per model x scheme,
    from the unlabelled Δppl row's info; 0 where the row has no float spread."""
    sel = rows[(rows["metric"] == "ppl_delta_rel") & ~rows["labels"].map(bool)]
    for _, r in sel.iterrows():
        noise = (r["info"] or {}).get("float_noise") or {}
        out = slot(r["model"], r["scheme"])
        out[FLOAT_COLUMN] = float(len(noise.get("seeds") or ()))
        if noise.get("sd") is not None:
            out["ppl_delta_rel_float_sd"] = float(noise["sd"])


def raw_prefill_schemes(frame: pd.DataFrame) -> list[str]:
    """The frame's schemes whose engine attends a one-chunk prefill from the raw K/V (their slot codec's)."""
    from evalkit.kv.scheme import one_forward_reads_raw

    out = []
    for text in sorted(set(frame["scheme"])) if "scheme" in frame else ():
        if one_forward_reads_raw(text):
            out.append(text)
    return out


def notes(frame: pd.DataFrame) -> list[str]:
    """Which intervals include the float spread, and how; the other columns' are sampling-only; and
    which rows' perplexity and lm-eval columns cannot show their cache's cost."""
    if FLOAT_COLUMN not in frame or "ppl_delta_rel" not in frame:
        return []
    return _float_notes(frame) + _raw_prefill_notes(frame)


def _raw_prefill_notes(frame: pd.DataFrame) -> list[str]:
    raw = raw_prefill_schemes(frame)
    if not raw:
        return []
    from evalkit.kv.codec import codec_for
    from evalkit.kv.scheme import parse_scheme

    codecs = {t: codec_for(parse_scheme(t).kv_format.recipe) for t in raw}
    kept = [t for t, c in codecs.items() if c.boundary_layers]
    longer = {t: c.raw_prefill_over for t, c in codecs.items() if c.raw_prefill_over}
    how, which = "", ""
    if kept:  # TurboQuant, UltraQuant
        how += f"; {', '.join(kept)} also keep the first and last two attention layers in the model's dtype"
    if longer:  # Octave: a step of at most 128 query tokens reads the cache
        n = max(longer.values())
        how += f"; {', '.join(longer)} only a chunk of more than {n} tokens (a shorter one reads the cache)"
        which = f" (for {', '.join(longer)}: one of more than {n} tokens; shorter ones are marked too)"
    return [
        f"{', '.join(raw)}: vLLM attends a one-chunk prefill from the raw K/V it was given{how}. So one forward "
        f"per window or request{which} reads no quantized value: their perplexity, KL, top-1, Δp and one-forward lm-eval "
        "columns are not measured by this protocol (‡), not the baseline's numbers. Their decode KL (every step "
        "reads the quantized cache) measures their cache; the recommendation never counts the unmeasured criteria "
        "as met"
    ]


def _float_notes(frame: pd.DataFrame) -> list[str]:
    seeds = sorted({int(n) for n in frame[FLOAT_COLUMN].dropna()})
    if seeds and seeds != [0]:
        n = ", ".join(str(s) for s in seeds if s)
        return [
            f"intervals of ppl, Δppl, KL, top-1 and Δp: 95 % over windows (the studentized jackknife t unless the "
            f"row's info.ci says otherwise), widened by the float spread of {n} perturbed-weight reruns (every weight "
            "moved by a few ulps of its dtype); the value is the mean of the realisations, the interval says where "
            "another float realisation of the same scheme would land. The ≈ marks come from the paired intervals of "
            "two rows' Δppl difference, not from these marginal intervals. The other columns' intervals lack float "
            f"spread (not measured for them). KL: {skew_bound.note()}"
        ]
    return [
        "intervals: 95 % sampling intervals over one float realisation; the float-rounding spread is not measured "
        "(perplexity float_noise_seeds measures it), and it can exceed the difference between FP8 rows. "
        f"KL: {skew_bound.note()}"
    ]
