"""What ``evalkit report`` shows of the decode evaluation (declared in its ReportSpec): the note on the
"decode KL (last bucket)" column, and where a store holds an engine's lines, the divergence columns
both backends compute (first divergence, identical share, top-1; an engine's KL lower bound)."""

from __future__ import annotations

import math
import re

import pandas as pd

from evalkit.evals import skew_bound
from evalkit.units import value_with_interval as _ci

LAST = "decode_kl_last"  # the summary frame's column: kl_mean of the last position bucket


def _bucket_start(label) -> float:
    m = re.match(r"\s*(\d+)", str(label))
    return float(m.group(1)) if m else math.nan


def notes(frame: pd.DataFrame) -> list[str]:
    """Which generated positions the "decode KL (last bucket)" column covers, and what it is."""
    if f"{LAST}_bucket" not in frame:
        return []
    buckets = sorted(set(frame[f"{LAST}_bucket"].dropna()), key=_bucket_start)
    if not buckets:
        return []
    return [
        f"decode KL (last bucket): mean KL(baseline || scheme) per generated token at positions "
        f"{', '.join(buckets)} of teacher-forced decoding through the stored KV cache, "
        "95 % interval over sequences (its low end Student's t, studentized jackknife, held at 0 where it would "
        f"reach below it; without float spread, not measured for decode); {skew_bound.note()}"
    ]


# -- the divergence columns, beside the engine's lines (declared in DecodeEval.report) --------------------
def _with_ci(out: dict, key: str, row) -> None:
    out[key], out[f"{key}_lo"], out[f"{key}_hi"] = row["value"], row["ci_low"], row["ci_high"]


def engine_frame(rows: pd.DataFrame, slot) -> None:
    """Decode's summary numbers that the emulation and an engine both compute, for one backend's rows:
    the free-running first divergence (median; ``first_divergence_censored`` when it is "T or later",
    with T as ``first_divergence_horizon``), the share identical through T, the teacher-forced top-1
    agreement over all decode positions, and where the engine gives KL only as its top-k lower bound,
    that bound in the last position bucket (``decode_kl_bound_last``)."""
    plain = rows[~rows["labels"].map(bool)]
    for _, r in plain.iterrows():
        out = slot(r["model"], r["scheme"])
        if r["metric"] == "first_divergence":
            _with_ci(out, "first_divergence", r)
            info = r["info"] if isinstance(r["info"], dict) else {}
            out["first_divergence_censored"] = bool(info.get("censored"))
        elif r["metric"] == "identical_share":
            _with_ci(out, "identical_share", r)
        elif r["metric"] == "top1_agreement":
            _with_ci(out, "decode_top1", r)
    bounds = rows[(rows["metric"] == "kl_lower_bound") & rows["labels"].map(lambda d: "bucket" in (d or {}))]
    for (model, scheme), g in bounds.groupby(["model", "scheme"], sort=False):
        last = g.loc[g["labels"].map(lambda d: _bucket_start(d["bucket"])).idxmax()]
        out = slot(model, scheme)
        _with_ci(out, "decode_kl_bound_last", last)
        out["decode_kl_bound_last_bucket"] = last["labels"]["bucket"]


def _shown(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def engine_display(r: dict, base: bool) -> dict[str, str]:
    """The divergence columns of one summary row, where the store holds an engine's lines (a
    ``backend`` column): an engine's decode is read from these, since it has no KL estimate."""
    if "backend" not in r or "first_divergence" not in r:
        return {}

    def pct(key: str, digits: str) -> str:
        return "" if base or not _shown(r.get(key)) else _ci(r, key, 100, digits)

    fd = r.get("first_divergence")
    first = "" if base or not _shown(fd) else ("≥" if r.get("first_divergence_censored") else "") + f"{fd:.0f}"
    out = {}
    if "decode_kl_bound_last" in r:
        out["decode KL lower bound (last bucket)"] = "" if base else _ci(r, "decode_kl_bound_last", 1, ".3g")
    out["decode top-1 %"] = pct("decode_top1", ".1f")
    out["identical at T %"] = pct("identical_share", ".0f")
    out["decode first divergence"] = first
    return out


def engine_notes(frame: pd.DataFrame) -> list[str]:
    """What the divergence columns mean (the 0 of "first divergence" included)."""
    if "backend" not in frame or "first_divergence" not in frame:
        return []
    lines = [
        "decode first divergence: generated tokens before the scheme's own greedy generation first differs "
        "from the baseline's (median over the sequences): 0 means the very first generated token (the "
        "prefill's prediction) already differs, ≥T that at least half the sequences stayed identical through "
        "all T generated tokens; identical at T %: the share of sequences with no difference through T (Wilson "
        "95 % interval); decode top-1 %: teacher-forced top-1 agreement with the baseline over all decode positions"
    ]
    if "decode_kl_bound_last" in frame:
        buckets = sorted(set(frame["decode_kl_bound_last_bucket"].dropna()), key=_bucket_start)
        lines.append(
            "decode KL lower bound (last bucket): an engine returns top-k log-probs only, so its decode KL is the "
            f"proven lower bound over those tokens, not the estimate (positions {', '.join(buckets)})"
        )
    return lines
