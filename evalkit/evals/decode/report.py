"""What ``evalkit report`` prints under its table for the decode evaluation (declared in its ReportSpec)."""

from __future__ import annotations

import math
import re

import pandas as pd

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
        "95 % bootstrap interval over sequences"
    ]
