"""Grid files: expansion into run specs, content-addressed run ids, errors with file/line/key,
shard partitions, and named grids."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.sweep import grid as grid_mod
from evalkit.sweep import spec as spec_mod
from evalkit.sweep.grid import GridError, parse_grid, resolve_grid
from evalkit.sweep.shard import ShardError, assign, parse_shard, select

GRID = """\
name: g
models:
  - tiny
  - {name: other, dtype: float32}
schemes:
  - auto
  - fp8_e4m3/head/dynamic
  - expand:
      formats: [fp8_e4m3, fp8_e5m2]
      granularities: [tensor, head, block16]
      scales: [dynamic, unit]
evals:
  toy: {max_tokens: 8, sleep: 0.5}
"""


def write(tmp_path: Path, text: str, name: str = "g.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_expansion_and_run_ids(tmp_path, toy_eval):
    g = parse_grid(write(tmp_path, GRID))
    schemes = list(dict.fromkeys(r.scheme for r in g.runs))
    # bf16 + head/dynamic (duplicate of one expansion) + 2 x 3 x 2 expansions, deduplicated
    assert len(schemes) == 1 + 12
    assert schemes[:2] == ["auto", "fp8_e4m3/head/dynamic"]
    assert "fp8_e5m2/block16/unit" in schemes
    assert len(g.runs) == 2 * 13
    ids = [r.run_id for r in g.runs]
    assert len(set(ids)) == len(ids) and all(len(i) == 64 for i in ids)
    # ids are stable across parses and ignore non-number-deciding params (sleep)
    g2 = parse_grid(write(tmp_path, GRID.replace("sleep: 0.5", "sleep: 0"), "g2.yaml"))
    assert [r.run_id for r in g2.runs] == ids and g2.identity == g.identity
    assert g2.runs[0].params["sleep"] == 0 and g.runs[0].params["sleep"] == 0.5
    # a number-deciding parameter changes every id
    g3 = parse_grid(write(tmp_path, GRID.replace("max_tokens: 8", "max_tokens: 9"), "g3.yaml"))
    assert not set(r.run_id for r in g3.runs) & set(ids) and g3.identity != g.identity


def test_run_id_includes_versions(tmp_path, toy_eval, monkeypatch):
    g = parse_grid(write(tmp_path, GRID))
    before = g.runs[0].run_id
    fake = {**grid_mod.versions(), "torch": "0.0.1"}
    monkeypatch.setattr(spec_mod, "versions", lambda engine="emulation", parts=None: fake)  # what RunSpec.run_id reads
    assert g.runs[0].run_id != before
    assert set(fake) == {"torch", "transformers", "lm_eval", "python", "evalkit_code"}


def test_run_id_changes_with_the_code_identity(tmp_path, toy_eval, monkeypatch):
    """The hash of evalkit's number-deciding source is in every run id (not the version string,
    which stayed 0.1.0 while the numerics changed); the grid itself stays the same grid."""
    from evalkit.sweep import code_identity

    g = parse_grid(write(tmp_path, GRID))
    before, identity = [r.run_id for r in g.runs], g.identity
    assert grid_mod.versions()["evalkit_code"] == code_identity.code_identity()
    monkeypatch.setattr(code_identity, "code_identity", lambda parts=None: "sha256:" + "0" * 64)
    after = [r.run_id for r in parse_grid(write(tmp_path, GRID)).runs]
    assert not set(after) & set(before) and len(set(after)) == len(after)
    assert parse_grid(write(tmp_path, GRID)).identity == identity


def test_seeds_expand_runs(tmp_path, toy_eval):
    g = parse_grid(write(tmp_path, GRID + "seeds: [1, 2]\n"))
    assert len(g.runs) == 2 * 13 * 2
    assert {r.params["seed"] for r in g.runs} == {1, 2}


@pytest.mark.parametrize(
    "text,line,key,words",
    [
        ("models: [a]\nschemes: [auto]\nevals:\n  toy: {max_tokens: 8\n", 5, "", "malformed YAML"),
        ("models: [a]\nschemes: [auto]\nevals: {toy: {}}\nmodles: [b]\n", 4, "modles", "unknown key"),
        (
            "models: [a]\nschemes:\n  - auto\n  - fp8_e4m3/head/dynamc\nevals: {toy: {}}\n",
            4,
            "schemes[1]",
            "scale source",
        ),
        (
            "models: [a]\nschemes:\n  - auto\n  - fp9/head/dynamic\nevals: {toy: {}}\n",
            4,
            "schemes[1]",
            "unknown KV format",
        ),
        ("models: [a]\nschemes: [auto]\nevals:\n  toy: {}\n  nonsense: {}\n", 5, "evals.nonsense", "unknown eval"),
        (
            "models: [a]\nschemes: [auto]\nevals:\n  toy:\n    max_tokens: 8\n    bogus: 1\n",
            6,
            "evals.toy.bogus",
            "unknown toy parameter",
        ),
        ("models: [a]\nschemes: [auto]\nevals:\n  toy:\n    max_tokens: 2\n", 5, "evals.toy.max_tokens", ">= 4"),
        (
            "models:\n  - {name: a, dtipe: x}\nschemes: [auto]\nevals: {toy: {}}\n",
            2,
            "models[0].dtipe",
            "unknown model setting",
        ),
        ("models: [a]\nschemes: [auto]\nschemes: [auto]\nevals: {toy: {}}\n", 3, "schemes", "duplicate key"),
        (
            "models: [a]\nschemes:\n  - expand: {formats: [fp8_e4m3], scales: [unit]}\nevals: {toy: {}}\n",
            3,
            "schemes[0].expand",
            "granularities",
        ),
        (
            "models: [a]\nschemes:\n  - expand: {formats: [fp8_e4m3], granularities: [blok], scales: [unit]}\nevals: {toy: {}}\n",
            3,
            "schemes[0].expand",
            "unknown granularity",
        ),
        ("models: [a]\nschemes: [auto]\nevals: {toy: {}}\nseeds: [x]\n", 4, "seeds", "integers"),
        ("schemes: [auto]\nevals: {toy: {}}\n", 1, "(top level)", "missing 'models'"),
    ],
)
def test_bad_grids_name_file_line_key(tmp_path, toy_eval, text, line, key, words):
    path = write(tmp_path, text)
    with pytest.raises(GridError) as exc:
        parse_grid(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:{line}: "), msg
    assert key in msg and words in msg and "\n" not in msg


def test_cli_bad_input_one_line_exit_2(tmp_path, toy_eval, capsys):
    bad = write(tmp_path, "models: [a]\nschemes:\n  - fp8_e4m3/head/sometimes\nevals: {toy: {}}\n")
    assert main(["sweep", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{bad}:3: schemes[0]" in err
    assert not (tmp_path / "o").exists()
    good = write(tmp_path, GRID, "good.yaml")
    for spec in ("3/2", "2/2", "a/b", "1", "-1/2"):
        assert main(["sweep", str(good), f"--shard={spec}", "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("evalkit: error: shard") and "\n" not in err
    assert main(["sweep", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_shard_partition(tmp_path, toy_eval):
    g = parse_grid(write(tmp_path, GRID))
    assert parse_shard("1/3") == (1, 3)
    for bad in ("3/2", "0/0", "x"):
        with pytest.raises(ShardError):
            parse_shard(bad)
    for n in (1, 2, 3, 5):
        parts = assign(g.runs, n)
        flat = [r.run_id for p in parts for r in p]
        assert sorted(flat) == sorted(r.run_id for r in g.runs)  # every run exactly once
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 13  # whole models (13 runs each) or round-robin
        # same partition whatever the input order
        rev = assign(list(reversed(g.runs)), n)
        assert [sorted(r.run_id for r in p) for p in rev] == [sorted(r.run_id for r in p) for p in parts]
    # 2 models, 2 shards: each shard holds one whole model (loads it once)
    parts = assign(g.runs, 2)
    assert [len({r.model for r in p}) for p in parts] == [1, 1]
    # 2 models, 3 shards: runs dealt round-robin per model, balanced to within one run per model
    parts = assign(g.runs, 3)
    assert sorted(len(p) for p in parts) == [8, 9, 9]
    assert select(g.runs, None) == list(g.runs)


def test_named_grids_resolve(tmp_path, monkeypatch):
    assert resolve_grid("quick").name == "quick.yaml"
    assert resolve_grid("default").name == "default.yaml"
    monkeypatch.setenv("EVALKIT_SWEEPS", str(tmp_path))
    write(tmp_path, GRID, "mine.yaml")
    assert resolve_grid("mine") == tmp_path / "mine.yaml"
    with pytest.raises(GridError, match="no grid named 'nope'.*quick"):
        resolve_grid("nope")


def test_named_grids_parse():
    """sweeps/default.yaml and sweeps/quick.yaml are valid against the evals they name."""
    for name in ("quick", "default"):
        g = parse_grid(resolve_grid(name))
        assert g.runs and "auto" in {r.scheme for r in g.runs}
    default = parse_grid(resolve_grid("default"))
    schemes = {r.scheme for r in default.runs}
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        assert f"{fmt}/tensor/unit" in schemes  # unit scales are one constant whatever the granularity
        for gran in ("tensor", "head", "block16"):
            assert f"{fmt}/{gran}/dynamic" in schemes
    assert {"nvfp4", "mxfp4"} <= schemes and sum("/static+" in s for s in schemes) == 2


def test_sweep_help():
    out = subprocess.run(
        [sys.executable, "-m", "evalkit", "sweep", "--help"], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0 and "--shard" in out.stdout and "--executor" in out.stdout


def test_gpus_place_the_model_on_them(tmp_path, toy_eval):
    """A model that asks for GPUs and names no device goes on them: one GPU -> cuda, several ->
    device_map auto (the Ray worker sees only its own GPUs); an explicit device or map is kept."""
    models = """\
models:
  - {name: a, gpus: 1}
  - {name: b, gpus: 4}
  - {name: c, gpus: 2, device: cpu}
  - {name: d, gpus: 2, device_map: balanced}
  - e
schemes: [auto]
evals:
  toy: {}
"""
    g = parse_grid(write(tmp_path, models))
    placed = {r.model.name: (r.model.device, r.model.device_map, r.model.num_gpus) for r in g.runs}
    assert placed == {
        "a": ("cuda", None, 1),
        "b": ("cpu", "auto", 4),
        "c": ("cpu", None, 2),
        "d": ("cpu", "balanced", 2),
        "e": ("cpu", None, 0),
    }
