"""The report's intervals held inside their metrics' domains (:mod:`evalkit.evals.metric_domains`): the stores
keep the evaluation's interval as computed and the report clips on reading, so the tables, the
recommendation and the figures all read the same clipped ends.
"""

from __future__ import annotations

import pandas as pd

from evalkit.evals.metric_domains import clip_interval


def clip_to_domains(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (metric records) with each ``ci_low``/``ci_high`` held inside its metric's domain
    (:func:`clip_interval` on every row with an interval)."""
    out = rows.copy()
    has_interval = out["ci_low"].notna() & out["ci_high"].notna()
    for i in out.index[has_interval]:
        out.loc[i, ["ci_low", "ci_high"]] = clip_interval(
            out.at[i, "metric"], out.at[i, "ci_low"], out.at[i, "ci_high"]
        )
    return out
