"""Scale tables that know what they are for: a table without its JSON sidecar is refused (one line,
exit 2 at the command line) unless the user names its model and format (``--scales-model`` /
``--scales-format``, the scheme options ``+scales_model=``/``+scales_format=``); shape, format and
model are checked on every load, the declared ones as a sidecar's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from evalkit.cli import main
from evalkit.errors import ScaleError, SchemeError
from evalkit.integration.binding import BoundScheme
from evalkit.kv.scale_table import ScaleTable, save_scale_table
from evalkit.kv.scheme import parse_scheme
from evalkit.sweep.store import ResultStore


def bare(path: Path, layers: int = 2, value: float = 0.01) -> Path:
    """A table of the right (tiny llama) shape with no sidecar."""
    save_file({"k_scale": torch.full((layers,), value), "v_scale": torch.full((layers,), value)}, str(path))
    return path


def static(path, fmt="fp8_e4m3", model=None) -> str:
    text = f"{fmt}/tensor/static+scales={path}"
    return text + (f"+scales_model={model}+scales_format=fp8_e4m3" if model else "")


def other_model_dir(tmp_path: Path, tiny_llama_dir) -> Path:
    """A model folder whose config differs from the tiny llama's in one setting (same layers and heads)."""
    folder = tmp_path / "other"
    folder.mkdir()
    config = json.loads((Path(tiny_llama_dir) / "config.json").read_text())
    config["intermediate_size"] = 2 * config["intermediate_size"]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_bare_table_is_refused_and_accepted_with_its_model_and_format_named(tmp_path, tiny, tiny_llama_dir):
    path = bare(tmp_path / "bare.safetensors")
    with pytest.raises(ScaleError) as err:
        BoundScheme(parse_scheme(static(path)), tiny.layout, tiny.config_hash)
    message = str(err.value)
    assert "no sidecar bare.safetensors.json" in message and "evalkit calibrate" in message
    assert "--scales-model" in message and "\n" not in message
    bound = BoundScheme(parse_scheme(static(path, model=tiny_llama_dir)), tiny.layout, tiny.config_hash)
    assert torch.equal(bound.table.k_scale, torch.full((2,), 0.01)) and bound.table.meta["format"] == "fp8_e4m3"


def test_a_sidecar_that_names_no_format_or_model_is_refused(tmp_path, tiny):
    path = tmp_path / "t.safetensors"
    save_scale_table(path, ScaleTable(torch.ones(2), torch.ones(2), {"model": "tiny"}))
    with pytest.raises(ScaleError, match="names no format or config hash"):
        BoundScheme(parse_scheme(static(path)), tiny.layout, tiny.config_hash)


def test_the_table_format_is_checked_sidecar_or_declared(tmp_path, tiny, tiny_llama_dir):
    side = tmp_path / "side.safetensors"
    save_scale_table(
        side, ScaleTable(torch.ones(2), torch.ones(2), {"format": "fp8_e4m3", "config_hash": tiny.config_hash})
    )
    BoundScheme(parse_scheme(static(side)), tiny.layout, tiny.config_hash)  # its own format: fine
    with pytest.raises(ScaleError, match="calibrated for fp8_e4m3 .*not fp8_e5m2"):
        BoundScheme(parse_scheme(static(side, fmt="fp8_e5m2")), tiny.layout, tiny.config_hash)
    declared = bare(tmp_path / "bare.safetensors")  # declared E4M3, run under E5M2: 128x off, refused
    with pytest.raises(ScaleError, match="calibrated for fp8_e4m3 .*not fp8_e5m2"):
        BoundScheme(parse_scheme(static(declared, fmt="fp8_e5m2", model=tiny_llama_dir)), tiny.layout, tiny.config_hash)
    # a declaration that contradicts the sidecar is refused too
    contra = f"fp8_e5m2/tensor/static+scales={side}+scales_model={tiny_llama_dir}+scales_format=fp8_e5m2"
    with pytest.raises(ScaleError, match="its sidecar says format fp8_e4m3, not the declared fp8_e5m2"):
        BoundScheme(parse_scheme(contra), tiny.layout, tiny.config_hash)


def test_the_table_model_is_checked_sidecar_or_declared(tmp_path, tiny, tiny_llama_dir):
    other = other_model_dir(tmp_path, tiny_llama_dir)
    path = bare(tmp_path / "bare.safetensors")
    with pytest.raises(ScaleError, match="calibrated on model .*other.* not this one"):
        BoundScheme(parse_scheme(static(path, model=other)), tiny.layout, tiny.config_hash)
    side = tmp_path / "side.safetensors"
    save_scale_table(
        side,
        ScaleTable(
            torch.ones(2), torch.ones(2), {"format": "fp8_e4m3", "config_hash": "0123456789abcdef", "model": "x/y"}
        ),
    )
    with pytest.raises(ScaleError, match="calibrated on model x/y"):
        BoundScheme(parse_scheme(static(side)), tiny.layout, tiny.config_hash)


def test_the_table_shape_is_checked_when_declared(tmp_path, tiny, tiny_llama_dir):
    path = bare(tmp_path / "five.safetensors", layers=5)
    with pytest.raises(ScaleError, match=r"has shape \(5,\) but this model needs \(2,\)"):
        BoundScheme(parse_scheme(static(path, model=tiny_llama_dir)), tiny.layout, tiny.config_hash)


def test_the_declaration_options_are_checked_and_round_trip():
    text = "fp8_e4m3/tensor/static+scales=a.safetensors+scales_model=org/name+scales_format=fp8_e4m3"
    assert str(parse_scheme(text)) == text
    for bad, words in [
        ("fp8_e4m3/tensor/static+scales=a.safetensors+scales_model=org/name", "go together"),
        ("fp8_e4m3/tensor/dynamic+scales_model=m+scales_format=fp8_e4m3", "describe a static table"),
        ("fp8_e4m3/tensor/static+scales=a.safetensors+scales_model=m+scales_format=fp9", "not a format"),
    ]:
        with pytest.raises(SchemeError, match=words):
            parse_scheme(bad)


def test_cli_run_refuses_a_bare_table_in_one_line_exit_2(tmp_path, tiny_llama_dir, capsys):
    path = bare(tmp_path / "bare.safetensors")
    code = main(["run", "--model", str(tiny_llama_dir), "--schemes", static(path), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "does not say which model and format" in err
    code = main(["run", "--model", str(tiny_llama_dir), "--schemes", "fp8_e4m3/tensor/dynamic", "--scales-model", "x"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "go together" in err


def test_cli_sweep_refuses_a_bare_table_and_runs_it_with_the_flags(tmp_path, tiny_llama_dir, toy_eval, capsys):
    path = bare(tmp_path / "bare.safetensors")
    grid = tmp_path / "g.yaml"
    grid.write_text(
        f"name: bare\nmodels: ['{tiny_llama_dir}']\nschemes: ['{static(path)}']\nevals:\n  toy: {{max_tokens: 16}}\n"
    )
    out = tmp_path / "out"
    argv = ["sweep", str(grid), "--out", str(out), "--no-progress", "--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not say which model and format" in err and "--scales-model" in err
    assert main(argv + ["--scales-model", str(tiny_llama_dir), "--scales-format", "fp8_e4m3"]) == 0
    (rec,) = ResultStore(out).read().complete.values()
    assert rec["scheme"] == static(path, model=tiny_llama_dir)
    shutil.rmtree(out)
    assert (
        main(argv + ["--scales-model", str(other_model_dir(tmp_path, tiny_llama_dir)), "--scales-format", "fp8_e4m3"])
        != 0
    )
    (failed,) = ResultStore(out).read().failed.values()
    assert "not this one" in failed["error"]


def test_cli_sensitivity_refuses_a_bare_table_and_reads_it_with_the_flags(tmp_path, tiny_llama_dir, capsys):
    path = bare(tmp_path / "bare.safetensors")
    argv = ["sensitivity", "--model", str(tiny_llama_dir), "--scheme", static(path), "--layers", "0"]
    argv += ["--perplexity-max-windows", "1", "--perplexity-window", "32", "--perplexity-stride", "32"]
    argv += ["--cache-dir", str(tmp_path / "cache")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the weights' loading bar: the table is read then
    assert (
        err.startswith("evalkit: error:") and "does not say which model and format" in err and "--scales-model" in err
    )
    assert main(argv + ["--scales-model", str(tiny_llama_dir), "--scales-format", "fp8_e4m3"]) == 0
    assert "all layers quantized" in capsys.readouterr().out
    assert main(argv[:4] + ["fp8_e4m3/tensor/dynamic", "--scales-model", "x", "--scales-format", "fp8_e4m3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no scheme reads one" in err


def test_cli_conformance_takes_the_flags_only_where_a_table_is_read(tmp_path, capsys):
    flags = ["--scales-model", "embedded", "--scales-format", "fp8_e4m3"]
    for argv, words in (
        (["conformance", "--engine", "llamacpp", *flags], "conformance --engine llamacpp reads none"),
        (["conformance", "--from", str(tmp_path), *flags], "--from and --kernel triton read none"),
        (
            ["conformance", "--schemes", "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz", *flags],
            "no scheme reads one",
        ),
        (["conformance", "--scales-model", "embedded"], "go together"),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, (argv, err)
