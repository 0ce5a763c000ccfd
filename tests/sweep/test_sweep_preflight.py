"""Every problem of a grid's runs, found before any model loads and listed in one report: `sweep` and
`sweep --dry-run` (which prints its estimate, then the problems, and exits 2), one line each at the grid
line that gives the scheme. Loading a model fails these tests (``no_model_loads``): the report comes first.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.sweep.preflight import commands
from evalkit.sweep.preflight.planned import PlannedRun, Problem

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """Loading (or converting) a model fails the test: every check comes first."""
    import evalkit.models.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the grid was checked")

    monkeypatch.setattr(evalkit.models.loading, "load_model", refuse)
    monkeypatch.setattr(evalkit.models.loading, "ensure_embedded", refuse)


def line_of(path: Path, text: str) -> int:
    """The 1-based line of the first line of ``path`` that holds ``text``."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("evalkit: error: ")]


def test_gpu_grid_lists_every_scheme_vllm_cuda_cannot_run(tmp_path, capsys):
    """The issue's case: the vllm-cuda profile (the rounding of vLLM's FP8 per-tensor store) runs the gpu
    grid's two FP8 rows only; its eight vllm: rows are vLLM's other store kernels themselves (this test
    listed the older preset's five evalkit-only schemes before); all eight, each at its line."""
    grid = REPO / "sweeps" / "gpu.yaml"
    out = tmp_path / "out"
    argv = ["sweep", "gpu", "--dry-run", "--assume-device", "h200", "--engine-profile", "vllm-cuda"]
    assert main([*argv, "--out", str(out), "--cache-dir", str(tmp_path / "cache")]) == 2
    captured = capsys.readouterr()
    assert "dry run of sweep gpu" in captured.out and "total: 55 runs" in captured.out  # the estimate too
    lines = errors(captured.err)
    refused = [
        "vllm:fp8_per_token_head",
        "vllm:int8_per_token_head",
        "vllm:int4_per_token_head",
        "vllm:turboquant_k8v4",
        "vllm:turboquant_4bit_nc",
        "vllm:turboquant_k3v4_nc",
        "vllm:turboquant_3bit_nc",
        "vllm:ultraquant_4bit",
    ]
    assert len(lines) == len(refused), captured.err
    for line, scheme in zip(lines, refused):
        assert line.startswith(f"evalkit: error: {grid}:{line_of(grid, '- ' + scheme)}: schemes["), line
        assert f"vllm-cuda cannot run {scheme}: " in line
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_profile_problems_are_all_listed_by_a_real_sweep(tmp_path, capsys):
    grid = tmp_path / "g.yaml"
    grid.write_text(
        "name: g\nmodels: [embedded]\nschemes:\n  - auto\n  - fp8_e4m3/head/dynamic\n  - fp8_e4m3/tensor/unit\n"
        "  - nvfp4\nevals:\n  decode: {prefill: 16, decode: 16, sequences: 1}\n"
    )
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--engine-profile", "vllm-cpu", "--out", str(out), "--no-progress"]) == 2
    lines = errors(capsys.readouterr().err)
    assert [re.match(rf"evalkit: error: {re.escape(str(grid))}:(\d+): ", x).group(1) for x in lines] == ["5", "7"]
    assert "fp8_e4m3/head/dynamic" in lines[0] and "nvfp4" in lines[1] and not out.exists()


MIXED = """name: mixed
models: [embedded]
schemes:
  - auto
  - fp8_e4m3/tensor/static+scales={scales}
  - vllm:fp8_ds_mla
  - expand:
      formats: [fp8_e4m3]
      granularities: [tensor, group48]
      scales: [dynamic]
evals:
  decode: {{prefill: 16, decode: 16, sequences: 1}}
"""


@pytest.mark.parametrize("dry", [True, False])
def test_missing_scale_file_and_mla_row_on_gqa_listed_together(tmp_path, capsys, dry):
    """The issue's other case: a missing scale file and an MLA row on a GQA model (the embedded SmolLM2),
    and a group width that does not divide head_dim 64, in one report, without loading the model."""
    grid = tmp_path / "mixed.yaml"
    grid.write_text(MIXED.format(scales=tmp_path / "nope.safetensors"))
    out = tmp_path / "out"
    argv = ["sweep", str(grid), "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-progress"]
    assert main(argv + (["--dry-run", "--assume-device", "h200"] if dry else [])) == 2
    captured = capsys.readouterr()
    lines = errors(captured.err)
    assert len(lines) == 3, captured.err
    scale, mla, group = lines
    assert scale.startswith(f"evalkit: error: {grid}:5: schemes[1]: static scale file ") and "does not exist" in scale
    assert mla.startswith(f"evalkit: error: {grid}:6: schemes[2]: vllm:fp8_ds_mla on embedded (llama: 3 KV heads")
    assert "does not apply to standard attention" in mla
    assert group.startswith(f"evalkit: error: {grid}:7: schemes[3].expand: fp8_e4m3/group48/dynamic on embedded")
    assert "group48 does not divide head_dim 64" in group
    assert ("dry run of sweep mixed" in captured.out) == dry
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_a_clean_grid_passes_and_a_hub_model_without_config_is_a_note(tmp_path, capsys):
    grid = tmp_path / "g.yaml"
    grid.write_text(
        "name: g\nmodels: [embedded, example-org/not-a-cached-model]\n"
        "schemes: [auto, fp8_e4m3/tensor/dynamic, vllm:int8_per_token_head]\n"
        "evals:\n  decode: {prefill: 16, decode: 16, sequences: 1}\n"
    )
    argv = ["sweep", str(grid), "--dry-run", "--assume-device", "h200", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert errors(err) == []
    (note,) = [line for line in err.splitlines() if "not-a-cached-model" in line and line.startswith("evalkit: note:")]
    assert "neither in the local Hugging Face cache nor an evalkit preset" in note and "once it loads" in note


def test_an_engine_that_cannot_start_here_is_a_note_in_a_dry_run(tmp_path, capsys, monkeypatch):
    """A dry run plans for any machine: the engine is checked where the sweep runs; the sweep refuses it here."""
    from evalkit.errors import EngineUnavailableError

    def missing(name):
        raise EngineUnavailableError(f"engine {name} is not installed (test)")

    monkeypatch.setattr("evalkit.sweep.preflight.engines.engine_ready", missing)
    grid = tmp_path / "g.yaml"
    grid.write_text("models: [embedded]\nschemes: [auto]\nengine: vllm\nevals:\n  perplexity: {max_windows: 1}\n")
    out = tmp_path / "out"
    assert main(["sweep", str(grid), "--dry-run", "--assume-device", "h200", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert (
        f"evalkit: note: {grid}:3: engine: engine vllm cannot run on this machine: engine vllm is not installed" in err
    )
    assert main(["sweep", str(grid), "--out", str(out)]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith(f"evalkit: error: {grid}:3: engine: 2 run(s) on engine vllm, which cannot run here")
    assert not out.exists()


def test_one_more_check_is_one_more_entry(tmp_path, capsys, monkeypatch):
    """The extension point a GPU table plugs into: a ``(runs) -> problems`` callable in COMMON_CHECKS sees
    each planned run with the GPU it is planned for (``--assume-device``) and its problems join the report."""
    seen: list[PlannedRun] = []

    def no_fp4_on_hopper(runs):
        seen.extend(runs)
        return [
            Problem(r.scheme_key, f"{r.scheme} needs a Blackwell GPU, not {r.gpu}")
            for r in runs
            if r.gpu == "h200" and r.scheme == "nvfp4"
        ]

    monkeypatch.setattr(commands, "COMMON_CHECKS", [*commands.COMMON_CHECKS, no_fp4_on_hopper])
    grid = tmp_path / "g.yaml"
    grid.write_text(
        "models: [embedded]\nschemes: [auto, nvfp4]\nevals:\n  decode: {prefill: 16, decode: 16, sequences: 1}\n"
    )
    assert main(["sweep", str(grid), "--dry-run", "--assume-device", "h200", "--out", str(tmp_path / "o")]) == 2
    assert errors(capsys.readouterr().err) == [
        f"evalkit: error: {grid}:2: schemes[1]: nvfp4 needs a Blackwell GPU, not h200"
    ]
    assert {r.gpu for r in seen} == {"h200"} and {r.here for r in seen} == {False}


def test_a_grid_engine_profile_key_places_each_problem_once_at_its_entry(tmp_path):
    from evalkit.sweep.grid import GridError, parse_grid

    text = (
        "models: [embedded]\nschemes:\n  - auto\n  - fp8_bogus/tensor/unit\n  - fp8_e4m3/head/dynamic\n"
        "engine_profile: vllm-cpu\nevals:\n  decode: {prefill: 16, decode: 16, sequences: 1}\n"
    )
    with pytest.raises(GridError) as err:
        parse_grid(tmp_path / "g.yaml", text)
    bad, head = err.value.problems
    assert ":4: schemes[1]: unknown KV format 'fp8_bogus'" in bad
    assert ":5: schemes[2]: vllm-cpu cannot run fp8_e4m3/head/dynamic" in head
