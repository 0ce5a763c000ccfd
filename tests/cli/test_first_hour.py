"""What an operator's first hour on the engine path hit (issue 32), each now one line before any work:

- argparse's errors come before torch is imported (``run --bogus`` used to import every evaluation first);
- ``capacity --engine vllm`` checks ``--out``, the model's config.json, ``--context`` against the model's
  context and ``--budget-gib`` against the memory before it starts an engine (each start takes 30-60 s);
- vLLM's start-up errors are their cause in evalkit's flag names, not pydantic's wrapper;
- ``sweep`` refuses a grid whose engine is not installed, at validation, writing nothing;
- an environment whose torchvision/torchaudio/torchcodec cannot load beside torch, or that asks vLLM for an
  engine subprocess, is one line with the fix (at engine start, in ``sweep``'s validation and in ``doctor``).

These run in the main environment (no vLLM); where a check needs vLLM to be installed, it is made to pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.errors import EngineUnavailableError

from tests.cli_checks import one_line_exit_2
from tests.engines.vllm_env import MISSING

REPO = Path(__file__).resolve().parents[2]
LLAMA = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=576,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
)


# -- argparse first ------------------------------------------------------------------------------------
def test_run_argparse_errors_come_before_torch_is_imported():
    code = (
        "import sys\nfrom evalkit.cli import main\n"
        "for argv in (['run', '--bogus'], ['run', '--eval', 'nope'], ['run', '--decode-tokens', '8', '--bogus']):\n"
        "    try:\n        rc = main(argv)\n    except SystemExit as e:\n        rc = e.code\n"
        "    print(rc, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.stdout.split("\n")[:3] == ["2 False"] * 3, (out.stdout, out.stderr)
    lines = out.stderr.splitlines()
    assert len(lines) == 3 and all(line.startswith("evalkit: error: ") for line in lines), out.stderr
    assert "--bogus" in lines[0] and "invalid choice: 'nope'" in lines[1] and "--bogus" in lines[2]


def test_eval_flags_still_parse_after_the_light_check(capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's own exit, after the evaluations' flags are known
        main(["run", "--perplexity-bogus", "3"])
    assert exc.value.code == 2 and "unrecognized arguments: --perplexity-bogus" in capsys.readouterr().err
    from evalkit.cli import build_parser, light_check

    argv = ["run", "--eval", "decode", "--decode-tokens", "8", "--no-decode-bos", "--no-progress"]
    light_check("run", argv)  # passes: eval flags are left to the full parser
    args = build_parser("run").parse_args(argv)
    assert args.eval_name == "decode" and args.no_progress


# -- capacity --engine: every check before an engine starts --------------------------------------------
@pytest.fixture
def no_engine(monkeypatch):
    """vLLM counts as installed (the checks after it are the ones under test); starting one fails the test."""
    import evalkit.engines.vllm.kernel as vk
    import evalkit.engines.vllm.serving as vs

    monkeypatch.setattr(vk, "check_vllm_available", lambda flags=None: None)

    def refuse(*args, **kwargs):
        raise AssertionError("an engine was started before the input was checked")

    monkeypatch.setattr(vs, "measure", refuse)


def _folder(tmp_path, text: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    return folder


def test_capacity_engine_refuses_an_unwritable_out_at_once(capsys, tmp_path, no_engine):
    folder = _folder(tmp_path, json.dumps(LLAMA))
    argv = ["capacity", "--engine", "vllm", "--model", str(folder), "--out", "/proc/x"]
    one_line_exit_2(argv, capsys, "cannot write to /proc/x", "--out")


@pytest.mark.skipif(MISSING is None, reason="vLLM is installed here: the unpatched check passes")
def test_capacity_engine_out_is_checked_before_vllm_is_looked_for(capsys):
    one_line_exit_2(["capacity", "--engine", "vllm", "--model", "embedded", "--out", "/proc/x"], capsys, "/proc/x")


def test_capacity_engine_refuses_a_corrupt_config_in_one_line(capsys, tmp_path, no_engine):
    folder = _folder(tmp_path, '{"model_type": "llama", "hidden_size": ')
    one_line_exit_2(
        ["capacity", "--engine", "vllm", "--model", str(folder)], capsys, "is not a JSON config", "config.json"
    )
    (folder / "config.json").write_text("[1, 2]")
    one_line_exit_2(["capacity", "--engine", "vllm", "--model", str(folder)], capsys, "not a config object")


def test_capacity_engine_refuses_a_context_longer_than_the_model(capsys, tmp_path, no_engine):
    folder = _folder(tmp_path, json.dumps(LLAMA))
    one_line_exit_2(
        ["capacity", "--engine", "vllm", "--model", str(folder), "--context", "10000000", "--budget-gib", "0.5"],
        capsys,
        "--context 10,000,000 is longer than the model's context",
        "max_position_embeddings 8,192",
        "lower --context",
    )


def test_capacity_engine_refuses_a_budget_beyond_memory(capsys, tmp_path, no_engine):
    from evalkit.engines.vllm.capacity import available_memory, check_memory

    folder = _folder(tmp_path, json.dumps(LLAMA))
    one_line_exit_2(
        ["capacity", "--engine", "vllm", "--model", str(folder), "--budget-gib", "1e6"],
        capsys,
        "--budget-gib 1e+06",
        "more than the memory this machine has available",
        "lower --budget-gib",
    )
    assert available_memory() is None or available_memory() > 0
    check_memory(2 << 30, available=3 << 30)  # fits: nothing raised
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:   2048 kB\n")
    assert available_memory(str(meminfo)) == 2048 * 1024
    assert available_memory(str(tmp_path / "none")) is None


# -- vLLM's start-up errors -----------------------------------------------------------------------------
class FakeValidationError(ValueError):
    """pydantic's shape: str() is the wrapper, errors() the causes."""

    def __init__(self, msg):
        super().__init__(f"1 validation error for ModelConfig\n  {msg} [type=value_error, input_value=...]")
        self.msg = msg

    def errors(self):
        return [{"type": "value_error", "loc": (), "msg": self.msg}]


def test_startup_errors_are_their_cause_in_the_callers_flags():
    from evalkit.engines.vllm.startup import startup_error

    too_long = FakeValidationError(
        "Value error, User-specified max_model_len (10000000) is greater than the derived max_model_len "
        "(max_position_embeddings=8192.0 or model_max_length=None in model's config.json). To allow overriding "
        "this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
    )
    line = startup_error(too_long, {"context": "--context", "budget": "--budget-gib"})
    assert line.startswith("--context 10,000,000 is longer than the model's context") and "lower --context" in line
    assert "validation error" not in line and "\n" not in line
    memory = ValueError(
        "Available memory on node 0 (10.0/14.84 GiB) on kv cache allocation is less than requested memory for kv "
        "(1000000.0 GiB). Decrease --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE, or reduce CPU memory used by "
        "other processes."
    )
    line = startup_error(memory, {"budget": "--budget-gib"})
    assert "1000000.0 GiB" in line and "lower --budget-gib" in line and "--kv-cache-memory-bytes" not in line
    other = FakeValidationError("Value error, Something else went wrong. More detail here.")
    assert startup_error(other) == "Something else went wrong"
    assert startup_error(ValueError("first line\nsecond")) == "first line"


# -- sweep refuses an engine that is not installed, at validation ----------------------------------------
@pytest.mark.skipif(MISSING is None, reason="vLLM is installed here")
def test_sweep_refuses_a_grid_whose_engine_is_not_installed(capsys, tmp_path):
    out = tmp_path / "out"
    one_line_exit_2(["sweep", "engine", "--out", str(out)], capsys, "run(s) on engine vllm", "cannot run here", MISSING)
    assert not out.exists()
    grid = tmp_path / "g.yaml"
    grid.write_text("models: [embedded]\nschemes: [auto]\nengine: vllm\nevals:\n  perplexity: {max_windows: 1}\n")
    one_line_exit_2(["sweep", str(grid), "--out", str(out)], capsys, "engine vllm", "drop the engine")
    assert not out.exists()


def test_sweep_engine_check_names_a_broken_environment(monkeypatch):
    import evalkit.engines.vllm.install as vi
    import evalkit.engines.vllm.kernel as vk
    from evalkit.sweep.grid import parse_grid
    from evalkit.sweep.preflight.engines import check_engines, engine_ready
    from evalkit.sweep.preflight.planned import PlannedRun

    grid = parse_grid(REPO / "sweeps" / "engine.yaml")
    monkeypatch.setattr(vk, "check_vllm_available", lambda flags=None: None)
    monkeypatch.setattr(
        vi, "broken_companions", lambda: {"torchvision": "RuntimeError: operator torchvision::nms does not exist"}
    )
    with pytest.raises(EngineUnavailableError, match="pip uninstall -y torchvision torchaudio torchcodec"):
        engine_ready("vllm")
    planned = [PlannedRun(r.model, r.scheme, r.engine) for r in grid.runs]
    (problem,) = check_engines(planned)
    n = sum(r.engine == "vllm" for r in grid.runs)
    assert problem.message.startswith(f"{n} run(s) on engine vllm, which cannot run here: ") and not problem.note
    assert "pip uninstall -y torchvision torchaudio torchcodec" in problem.message
    (note,) = check_engines([PlannedRun(r.model, r.scheme, r.engine, here=False) for r in grid.runs])
    assert note.note  # planned for another machine (a dry run): said, not refused
    assert check_engines([p for p in planned if p.engine == "emulation"]) == []  # no engine: nothing checked


# -- the environment vLLM needs -------------------------------------------------------------------------
@pytest.fixture
def fake_companions(tmp_path, monkeypatch):
    """torchvision that fails to import as the CUDA build does beside the CPU torch; torchaudio that imports."""
    (tmp_path / "torchvision").mkdir()
    (tmp_path / "torchvision" / "__init__.py").write_text(
        'raise RuntimeError("operator torchvision::nms does not exist")\n'
    )
    (tmp_path / "torchaudio").mkdir()
    (tmp_path / "torchaudio" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("torchvision", "torchaudio"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("torchvision", "torchaudio"):
        sys.modules.pop(name, None)


def test_broken_companions_are_found_with_their_fix(fake_companions):
    from evalkit.engines.vllm import install as vi

    broken = vi.broken_companions()
    assert list(broken) == ["torchvision"] and "torchvision::nms does not exist" in broken["torchvision"]
    with pytest.raises(EngineUnavailableError) as exc:
        vi.check_companions()
    assert "\n" not in str(exc.value) and str(exc.value).endswith(vi.COMPANION_FIX)


def test_multiprocessing_is_set_in_process_or_refused(monkeypatch):
    from evalkit.engines.vllm import install as vi

    monkeypatch.delenv(vi.MULTIPROCESSING, raising=False)
    vi.set_in_process()
    import os

    assert os.environ[vi.MULTIPROCESSING] == "0"
    monkeypatch.setenv(vi.MULTIPROCESSING, "1")
    with pytest.raises(EngineUnavailableError, match="unset VLLM_ENABLE_V1_MULTIPROCESSING"):
        vi.set_in_process()


def test_doctor_prints_each_fix(monkeypatch, capsys, fake_companions):
    from evalkit.cli import doctor

    versions = {"vllm-cpu": "0.32.0", "transformers": "5.24.0", "torch": "2.13.0+cpu"}
    monkeypatch.setattr(doctor, "_version", versions.get)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    rows = {what: (status, detail) for status, what, detail in doctor.vllm_checks()}
    assert rows["vLLM"][0] == doctor.OK
    assert rows["transformers"][0] == doctor.FIX and '"transformers>=5.17,<5.20"' in rows["transformers"][1]
    assert rows["VLLM_ENABLE_V1_MULTIPROCESSING"][0] == doctor.FIX
    status, detail = rows["torchvision/torchaudio/torchcodec"]
    assert status == doctor.FIX and detail.endswith("pip uninstall -y torchvision torchaudio torchcodec")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "FIX" in out and "problem(s) to fix" in out


def test_doctor_on_this_environment_runs_and_names_the_embedded_model(capsys):
    rc = main(["doctor"])
    out = capsys.readouterr().out
    assert "embedded model" in out and rc in (0, 1)
    assert ("nothing to fix" in out) == (rc == 0)
