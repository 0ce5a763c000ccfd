"""The report holds each interval inside what its metric can be (evalkit.report.domains)."""

from __future__ import annotations

import math

import pandas as pd

from evalkit.evals.metric_domains import clip_interval, domain
from evalkit.report.domains import clip_to_domains
from evalkit.sweep.run_table import rows_table


def rows(*records):
    return pd.DataFrame(records, columns=["metric", "value", "ci_low", "ci_high"])


def test_bounded_metrics_are_clipped_and_values_are_not():
    frame = clip_to_domains(
        rows(
            ("kl_mean", 0.01, -0.03, 0.05),  # a KL below 0
            ("top1_agreement", 0.91, 0.81, 1.013),  # a share above 1
            ("ppl", 14.25, -24.45, 52.96),  # a perplexity below 0
            ("ppl_delta_rel", -0.2, -1.7, 1.3),  # a ratio minus 1 below -1
            ("evalkit_mmlu4/acc", 0.25, -0.1, 0.59),  # lm-eval's TASK/metric names
            ("nll_delta", 0.01, -0.05, 0.07),  # no bound: left as computed
            ("kl_mean", 0.0, math.nan, math.nan),  # no interval: stays none
        )
    )
    plain = [
        (max(lo, a), min(hi, b))
        for (lo, hi), (a, b) in zip(
            [(-0.03, 0.05), (0.81, 1.013), (-24.45, 52.96), (-1.7, 1.3), (-0.1, 0.59)],
            [(0, math.inf), (0, 1), (0, math.inf), (-1, math.inf), (0, 1)],
        )
    ]
    assert list(zip(frame["ci_low"][:5], frame["ci_high"][:5])) == plain
    assert list(frame["value"]) == [0.01, 0.91, 14.25, -0.2, 0.25, 0.01, 0.0]
    assert (frame.loc[5, "ci_low"], frame.loc[5, "ci_high"]) == (-0.05, 0.07)
    assert frame.loc[6, ["ci_low", "ci_high"]].isna().all()


def test_an_interval_inside_its_domain_is_unchanged():
    assert clip_interval("kl_mean", 0.001, 0.02) == (0.001, 0.02)
    assert clip_interval("identical_share", 0.34, 1.0) == (0.34, 1.0)
    assert clip_interval("decode_tok_s", -5.0, 5.0) == (-5.0, 5.0) and domain("decode_tok_s") is None


def test_runs_printed_table_shows_the_clipped_interval():
    table = rows_table(
        [
            {"scheme": "fp8", "metric": "kl_mean", "value": 0.0154, "ci_low": -0.004, "ci_high": 0.0233, "labels": {}},
            {
                "scheme": "fp8",
                "metric": "top1_agreement",
                "value": 0.935,
                "ci_low": 0.836,
                "ci_high": 1.03,
                "labels": {},
            },
        ]
    )
    assert "0.0154 [0, 0.0233]" in table and "0.935 [0.836, 1]" in table
