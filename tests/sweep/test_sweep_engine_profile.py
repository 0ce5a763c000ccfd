"""`evalkit sweep GRID --engine-profile NAME`: every scheme runs as that engine's kernels do, and a
scheme the engine cannot run is refused in one line before anything is written."""

from __future__ import annotations

from evalkit.cli import main

GRID = "name: small\nmodels: [embedded]\nschemes: [auto, {scheme}]\nevals:\n  decode: {{prefill: 16, decode: 16, sequences: 1}}\n"


def test_the_profile_rewrites_the_grids_schemes(tmp_path, capsys):
    grid = tmp_path / "small.yaml"
    grid.write_text(GRID.format(scheme="fp8_e4m3/tensor/unit"))
    out = tmp_path / "out"
    assert (
        main(
            [
                "sweep",
                str(grid),
                "--engine-profile",
                "vllm-cpu",
                "--dry-run",
                "--out",
                str(out),
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz" in text and not out.exists()


def test_a_scheme_the_engine_cannot_run_is_refused_in_one_line(tmp_path, capsys):
    grid = tmp_path / "small.yaml"
    grid.write_text(GRID.format(scheme="fp8_e4m3/head/dynamic"))
    out = tmp_path / "out"
    assert (
        main(
            [
                "sweep",
                str(grid),
                "--engine-profile",
                "vllm-cpu",
                "--out",
                str(out),
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vllm-cpu" in err[0] and "head" in err[0] and not out.exists()


def test_an_unknown_profile_names_the_known_ones(tmp_path, capsys):
    assert main(["sweep", "quick", "--engine-profile", "vllm-tpu", "--dry-run", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "vllm-cpu" in err and "tensorrt-llm" in err
