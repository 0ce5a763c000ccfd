"""``evalkit run`` sizes itself before it starts (issue 32: the README's engine commands ran for hours,
silently): a run estimated at over 10 min on this machine prints one line on stderr with the estimate
and the flags of the CPU sizes, before its first evaluation; a short run prints nothing. The estimate
is monkeypatched or computed from fixed speeds: no test here times anything."""

from __future__ import annotations

import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.evals import get_eval
from evalkit.sweep import run_size as S
from evalkit.sweep import speed_probe as P
from evalkit.sweep import throughput as T
from evalkit.sweep.spec import ModelSpec


def _fake_seconds(long: float, short: float):
    """``_seconds`` for the run's own parameters (long) and for the CPU sizes (short)."""

    def seconds(model, eval_name, params, schemes, engine, speed_for, workdir):
        small = S.smaller_params(get_eval(eval_name), params)[1] == ()  # already at the CPU sizes
        return short if small else long

    return seconds


def _ours(err: str) -> list[str]:
    """evalkit's own lines on stderr (transformers draws its "Loading weights" bar there too)."""
    return [line for line in err.splitlines() if line.startswith("evalkit: ")]


class _Stop(EvalkitError):
    pass


def _stop_at_prepare(monkeypatch, name: str):
    """The evaluation stops (one line, exit 2) where its work would begin: what came before is on stderr."""

    def prepare(self, lm, workdir):
        raise _Stop("stopped where the evaluation would begin")

    monkeypatch.setattr(get_eval(name), "prepare", prepare)


def test_a_long_run_says_its_estimate_and_the_cpu_sizes_before_it_starts(tiny_llama_dir, monkeypatch, capsys):
    monkeypatch.setattr(S, "_seconds", _fake_seconds(3 * 3600 + 40 * 60, 95.0))
    _stop_at_prepare(monkeypatch, "retrieval")
    capsys.readouterr()
    rc = main(["run", "--model", str(tiny_llama_dir), "--eval", "retrieval", "--schemes", "fp8_e4m3/tensor/unit"])
    err = capsys.readouterr().err
    assert rc == 2
    lines = _ours(err)
    assert len(lines) == 2 and lines[0].startswith("evalkit: note: this run (retrieval, 2 schemes"), err
    assert lines[1] == "evalkit: error: stopped where the evaluation would begin"  # the note came first
    note = lines[0]
    assert "about 3 h 40 min on this CPU" in note and "the evaluation's defaults are GPU sizes" in note
    for flag in ("--retrieval-tasks passkey", "--retrieval-lengths 512", "--retrieval-depths 0,100"):
        assert flag in note
    assert "--retrieval-samples 1" in note and "docs/sizing.md#what-fits-a-cpu, about 1 min 35 s)" in note


def test_an_engine_run_says_it_runs_through_vllm(tiny_llama_dir, monkeypatch):
    size = S.RunSize(7200.0, flags=("--lmeval-limit 8",), smaller_seconds=50.0, load=1.5)
    line = S.note(size, "cpu", get_eval("lmeval"), ["auto", "fp8_e4m3/tensor/unit"], "vllm")
    assert line.startswith(
        "this run (lmeval through vLLM, 2 schemes with the baseline) is estimated at about 2 h 00 min"
    )
    assert (
        "(timed at load 1.5)" in line and "try --lmeval-limit 8 (docs/sizing.md#what-fits-a-cpu, about 50.0 s)" in line
    )
    gpu = S.note(size, "cuda", get_eval("lmeval"), ["auto"], "emulation")
    assert "on this machine's cuda" in gpu and "to shorten it try --lmeval-limit 8" in gpu


def test_a_short_run_prints_no_estimate(tiny_llama_dir, monkeypatch, capsys):
    monkeypatch.setattr(S, "_seconds", _fake_seconds(240.0, 20.0))
    _stop_at_prepare(monkeypatch, "perplexity")
    capsys.readouterr()
    assert main(["run", "--model", str(tiny_llama_dir), "--schemes", "fp8_e4m3/tensor/dynamic"]) == 2
    err = capsys.readouterr().err
    assert _ours(err) == ["evalkit: error: stopped where the evaluation would begin"], err


def test_a_run_that_cannot_be_sized_runs_all_the_same(tiny_llama_dir, monkeypatch, capsys):
    def broken(*a, **k):
        raise RuntimeError("no facts")

    monkeypatch.setattr(S, "estimate_run", broken)
    _stop_at_prepare(monkeypatch, "perplexity")
    capsys.readouterr()
    assert main(["run", "--model", str(tiny_llama_dir), "--schemes", "fp8_e4m3/tensor/dynamic"]) == 2
    assert _ours(capsys.readouterr().err) == ["evalkit: error: stopped where the evaluation would begin"]


def test_bad_size_flags_are_still_one_line_before_any_estimate(tiny_llama_dir, monkeypatch, capsys):
    from tests.cli_checks import one_line_exit_2

    def never(*a, **k):
        raise AssertionError("sized before the flags were checked")

    monkeypatch.setattr(S, "estimate_run", never)
    one_line_exit_2(
        ["run", "--model", str(tiny_llama_dir), "--eval", "retrieval", "--retrieval-samples", "0"],
        capsys,
        "--retrieval-samples",
    )


# -- the CPU sizes the line names -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, given, flags",
    [
        (
            "retrieval",
            {},
            (
                "--retrieval-tasks passkey",
                "--retrieval-lengths 512",
                "--retrieval-depths 0,100",
                "--retrieval-samples 1",
            ),
        ),
        ("retrieval", {"tasks": ["passkey"], "lengths": [512], "samples": 1}, ("--retrieval-depths 0,100",)),
        (
            "retrieval",
            {"lengths": [256, 512], "depths": [50], "samples": 2},
            ("--retrieval-tasks passkey", "--retrieval-lengths 512", "--retrieval-samples 1"),
        ),
        ("lmeval", {}, ("--lmeval-limit 8",)),
        ("lmeval", {"limit": 4}, ()),
        ("decode", {}, ("--decode-prefill 128", "--decode-tokens 64", "--decode-sequences 2")),
        ("decode", {"prefill": 64, "decode": 32, "sequences": 1}, ()),
        ("perplexity", {}, ("--perplexity-window 512", "--perplexity-stride 512", "--perplexity-max-windows 4")),
    ],
)
def test_the_line_names_only_the_cpu_sizes_that_shrink_the_run(name, given, flags):
    cls = get_eval(name)
    params = cls.validate(given)
    small, named = S.smaller_params(cls, params)
    assert named == flags
    assert S.smaller_params(cls, small)[1] == ()  # at the CPU sizes, nothing left to name


# -- the estimate: analytic first, the loaded model's probe only when that is not small --------------------
def _speed(tokens_per_s: float, kind: str) -> T.Speed:
    return T.Speed(270e6 * tokens_per_s, 1e12, 0.0, 0.0, kind, f"{kind} at {tokens_per_s} tokens/s")


@pytest.fixture
def speeds(monkeypatch):
    calls = {"analytic": 0, "probe": 0}

    def analytic(facts, device, dtype_bytes, compiled=None):
        calls["analytic"] += 1
        return _speed(2000.0, "measured device")

    def probe(lm, facts, load_seconds=0.0, compiled=None):
        calls["probe"] += 1
        return _speed(100.0, "probe")

    monkeypatch.setattr(P, "measured_device", analytic)
    monkeypatch.setattr(P, "probe_model", probe)
    return calls


MODEL = ModelSpec(name="embedded", dtype="float32", device="cpu")


def test_a_small_run_is_priced_without_the_probe(speeds, tmp_path):
    cls = get_eval("perplexity")
    size = S.estimate_run(
        MODEL, cls, cls.validate({"window": 512, "max_windows": 2}), ["auto"], "emulation", object(), tmp_path
    )
    assert speeds == {"analytic": 1, "probe": 0} and size.seconds is not None and not size.long


def test_a_large_run_is_priced_by_the_probe_and_given_the_cpu_sizes(speeds, tmp_path):
    cls = get_eval("retrieval")
    size = S.estimate_run(MODEL, cls, cls.validate({}), ["auto", "fp8_e4m3/tensor/unit"], "vllm", object(), tmp_path)
    assert speeds == {"analytic": 1, "probe": 1}  # the probe once, for both the run and its CPU sizes
    assert size.long and size.speed == "probe at 100.0 tokens/s"
    assert size.flags[0] == "--retrieval-tasks passkey" and size.smaller_seconds < S.LONG_S < size.seconds
