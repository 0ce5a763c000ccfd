"""`evalkit sweep GRID --dry-run`: runs, tokens from the params, time from a probe or the datasheet,
disk against free space; every grid problem listed; nothing written. Offline, on CPU."""

from __future__ import annotations

import math
import re

import pytest

from evalkit.cli import build_parser, main
from evalkit.sweep.estimate import DiskSpaceError, estimate_sweep
from evalkit.sweep.grid import parse_grid, resolve_grid


def table_rows(text: str) -> list[list[str]]:
    """The run rows of a dry run's table: model, scheme, eval, tokens, time..., split on 2+ spaces."""
    return [
        re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if line.startswith(("embedded ", "meta-llama/"))
    ]


def tokens(cell: str) -> int:
    return int(cell.rstrip("~").replace(",", ""))


@pytest.mark.slow
def test_default_dry_run_counts_tokens_from_the_params_and_writes_nothing(tmp_path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    assert main(["sweep", "default", "--dry-run", "--out", str(out), "--cache-dir", str(cache)]) == 0
    text = capsys.readouterr().out
    rows = table_rows(text)
    grid = parse_grid(resolve_grid("default"))
    assert len(rows) == len(grid.runs) == 52 and not out.exists() and not cache.exists()
    params = {r.eval: r.params for r in grid.runs}
    by = {}
    for _model, scheme, ev, tok, *rest in rows:
        by.setdefault(ev, []).append((scheme, tokens(tok), rest))
    # perplexity: max_windows x window tokens per scheme, once on the real weights and once on each of the
    # float_noise_seeds perturbed copies (3 in sweeps/default.yaml: 4 passes); the first (bf16) run also pays
    # the baselines of all those copies
    ppl = params["perplexity"]
    per_scheme = (1 + ppl["float_noise_seeds"]) * ppl["max_windows"] * ppl["window"]
    assert [t for s, t, _ in by["perplexity"]] == [2 * per_scheme] + [per_scheme] * 12
    # decode: 2 x sequences rows (teacher-forced, free-running) x (prefill + decoded)
    dec = params["decode"]
    per_scheme = 2 * dec["sequences"] * (dec["prefill"] + dec["decode"])
    assert [t for s, t, _ in by["decode"]] == [2 * per_scheme] + [per_scheme] * 12
    # retrieval: 2 tasks x 1 length x 2 depths x 1 sample of 1024 tokens, plus each answer's budget;
    # the bf16 run is the baseline pass itself
    ret = [t for s, t, _ in by["retrieval"]]
    assert all(4 * 1024 < t < 4 * 1024 + 4 * 64 for t in ret)
    assert len(set(ret[1:])) == 1
    assert all(t > 0 for _, t, _ in by["lmeval"])
    assert "baseline + model load" in rows[0][-1]
    total = re.search(r"total: 52 runs, ([\d,]+) tokens, estimated wall time (.+)", text)
    assert total and tokens(total.group(1)) == sum(tokens(r[3]) for r in rows)
    assert "speed: embedded on cpu: probe on cpu" in text
    assert all(r[4] != "?" and not r[4].startswith("0.0") for r in rows)
    assert re.search(r"^disk: .* needed, .* free: fits", text, re.M)


def test_every_grid_problem_is_listed_with_file_and_line(tmp_path, capsys):
    grid = tmp_path / "bad.yaml"
    grid.write_text(
        "models: [embedded]\nschemes:\n  - bf16\n  - fp8_e4m3/head/dynamc\n"
        "evals:\n  perplexity: {window: 1}\n  bogus: {}\n"
    )
    assert main(["sweep", str(grid), "--dry-run", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3, err
    assert err[0].startswith(f"evalkit: error: {grid}:4: schemes[1]: unknown scale source")
    assert err[1].startswith(f"evalkit: error: {grid}:6: evals.perplexity.window: window 1 is too short")
    assert err[2].startswith(f"evalkit: error: {grid}:7: evals.bogus: unknown eval")
    assert not (tmp_path / "o").exists()
    # the same for a real sweep; a single problem stays one line
    assert main(["sweep", str(grid), "--out", str(tmp_path / "o")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 3


SMALL = "name: small\nmodels: [embedded]\nschemes: [bf16, fp8_e4m3/tensor/dynamic]\nevals:\n  decode: {prefill: 16, decode: 16, sequences: 1}\n"


@pytest.mark.parametrize("dry", [True, False])
def test_a_grid_that_does_not_fit_on_the_disk_is_refused_before_any_work(tmp_path, dry):
    """The free-space query is injected: 1 MB (10**6 bytes) free refuses even this tiny grid (256 MiB headroom)."""
    from evalkit.cli.sweep import run

    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL)
    out = tmp_path / "out"
    argv = ["sweep", str(grid), "--out", str(out), "--cache-dir", str(tmp_path / "cache")] + (
        ["--dry-run"] if dry else []
    )
    args = build_parser("sweep").parse_args(argv)
    with pytest.raises(DiskSpaceError) as exc:
        run(args, free_space=lambda folder: 10**6)
    msg = str(exc.value)
    assert (
        "\n" not in msg
        and msg.startswith("sweep small needs")
        and "976.6 KiB are free" in msg
        and exc.value.exit_code == 2
    )
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_a_dry_run_sized_for_another_machine_notes_this_disk_and_plans_on(tmp_path, capsys):
    """--assume-device sizes the sweep for a GPU machine: 1 MB free here is said as a note (the same figures as
    the refusal above), and the plan exits 0; the sweep on that machine checks its own disk."""
    from evalkit.cli.sweep import run

    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL)
    argv = ["sweep", str(grid), "--dry-run", "--assume-device", "h200", "--out", str(tmp_path / "out")]
    args = build_parser("sweep").parse_args([*argv, "--cache-dir", str(tmp_path / "cache")])
    assert run(args, free_space=lambda folder: 10**6) == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("evalkit: note: this machine's disk: ")]
    assert len(notes) == 1 and "evalkit: error" not in err, err
    assert "sweep small needs" in notes[0] and "976.6 KiB are free" in notes[0]
    assert notes[0].endswith("the sweep on the h200 checks its own disk before it starts")
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


@pytest.mark.host_disk
def test_the_free_space_query_asks_the_nearest_existing_folder(tmp_path, monkeypatch):
    """disk_free of a folder not made yet asks its nearest existing parent, through shutil.disk_usage."""
    import shutil
    from collections import namedtuple

    from evalkit.sweep import estimate

    asked = []
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: asked.append(path) or usage(10, 3, 7))
    assert estimate.disk_free(tmp_path / "out" / "runs") == 7 and asked == [tmp_path]


def test_assume_device_needs_dry_run(capsys):
    assert main(["sweep", "quick", "--assume-device", "h200"]) == 2
    assert "--dry-run" in capsys.readouterr().err


GPU_SCHEMES = [
    "auto",
    "fp8_e4m3/tensor/unit+attn=fa3",
    "fp8_e5m2/tensor/unit",
    "vllm:fp8_per_token_head",
    "vllm:int8_per_token_head",
    "vllm:int4_per_token_head",
    "vllm:turboquant_k8v4",
    "vllm:turboquant_4bit_nc",
    "vllm:turboquant_k3v4_nc",
    "vllm:turboquant_3bit_nc",
    "vllm:ultraquant_4bit",
]


@pytest.mark.slow
def test_gpu_preset_runs_the_decision_evaluations_on_an_h200(tmp_path, capsys):
    """sweeps/gpu.yaml, rewritten around the long-context and reasoning evaluations (this test pinned the older
    mmlu/gsm8k/retrieval preset of about an hour before): Llama-3.1-8B-Instruct on one GPU under the KV cache
    dtypes vLLM runs on an H100/H200, RULER at 4k-128k and LongBench v2 by their lm-eval names."""
    grid = parse_grid(resolve_grid("gpu"))
    assert {r.model.name for r in grid.runs} == {"meta-llama/Llama-3.1-8B-Instruct"}
    assert {r.model.dtype for r in grid.runs} == {"bfloat16"} and {r.model.device for r in grid.runs} == {"cuda"}
    assert {r.eval for r in grid.runs} == {"perplexity", "decode", "longcontext", "lmeval", "generation"}
    assert list(dict.fromkeys(r.scheme for r in grid.runs)) == GPU_SCHEMES
    lc = next(r.params for r in grid.runs if r.eval == "longcontext")
    assert lc["tasks"] == ["ruler", "longbench2"] and lc["lengths"] == [4096, 8192, 16384, 32768, 65536, 131072]
    assert lc["limit"] == 25 and lc["limits"] == {"longbench2": None}
    gen = next(r.params for r in grid.runs if r.eval == "generation")
    assert gen["tasks"] == [
        "gsm8k_cot_llama",
        "minerva_math500",
        "gpqa_diamond_cot_zeroshot",
        "aime24",
        "aime25",
        "mrcr_2needle",
        "mrcr_4needle",
    ]
    est = estimate_sweep(grid, grid.runs, tmp_path / "out", tmp_path / "cache", assume_device="h200")
    assert len(est.speeds) == 1 and "H200" in est.speeds[0] and "datasheet" in est.speeds[0]
    # under three days on one H200 (docs/long-context.md states it): RULER at 64k-128k is most of it, then
    # generation (its reasoning tasks and openai/mrcr to 128k)
    assert 55 * 3600 < est.seconds < 75 * 3600
    per_eval = {e: sum(r.seconds for r in est.runs if r.eval == e) for e in ("longcontext", "generation")}
    assert per_eval["longcontext"] > 0.6 * est.seconds and per_eval["generation"] > 12 * 3600
    assert main(["sweep", "gpu", "--dry-run", "--assume-device", "h200", "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert len(table_rows(text)) == 55 and not (tmp_path / "o").exists()  # 11 schemes x 5 evals


@pytest.mark.slow
def test_gpu_preset_dry_run_prints_items_needed_and_time(tmp_path, capsys):
    """The decision table: per accuracy task the paired and unpaired items a 1-point drop needs and their time
    on the H200, its figures recomputed here from evalkit.planning.decision and the datasheet speed."""
    from evalkit.evals.sizing import item_forwards
    from evalkit.models.facts import model_facts
    from evalkit.planning import decision as D
    from evalkit.sweep.throughput import datasheet
    from evalkit.units import format_seconds

    assert main(["sweep", "gpu", "--dry-run", "--assume-device", "h200", "--out", str(tmp_path / "o")]) == 0
    text = capsys.readouterr().out
    assert "decision sizing: items for the budget's decision 'drop <= 1 pt' (non-inferiority" in text
    lines = {line.split()[0]: re.split(r"\s{2,}", line.strip()) for line in text.splitlines() if "  " in line}
    for label in ("ruler@4096", "ruler@131072", "longbench2", "mmlu", "gsm8k_cot_llama", "aime25"):
        assert label in lines, label
    # ruler at 128k: baseline 0.770 (RULER's Llama3.1-8B mean), prior psi = 0.1 x 2p(1-p), 13 tasks x 25 items
    row = lines["ruler@131072"]
    psi = 0.1 * 2 * 0.77 * 0.23
    zz = (1.959964 + 0.841621) ** 2  # non-inferiority against the 1-point limit, no true drop
    assert row[2] == "0.770" and row[3] == f"{psi:.4f}" and row[4] == f"{math.ceil(zz * psi / 1e-4):,}"
    assert row[5] == f"{math.ceil(zz * 2 * 0.77 * 0.23 / 1e-4):,}" and row[6] == "6,500" and row[7] == "325"
    assert row[8] == f"{100 * 2.801585 * math.sqrt(psi / 325):.1f} pts"
    # its time: the needed items' prefill of 131,072 - 99 tokens and 99 decode steps, at the H200's speed
    facts = model_facts("meta-llama/Llama-3.1-8B-Instruct", "bfloat16", "cuda")
    speed = datasheet(facts, "h200")
    n = D.items_noninferior(0.01, psi)
    assert row[9] == format_seconds(sum(speed.seconds(f, facts) for f in item_forwards(n, 131072 - 99, 99, 1, 32)))
    assert "> items" in lines["longbench2"][4]  # 1,646 needed, 503 exist
    assert "not sized" not in text


@pytest.mark.slow
def test_gpu_preset_with_another_model(tmp_path, capsys):
    """--model replaces the grid's models (dtype and device kept): the embedded model on gpu.yaml,
    its CUDA device absent here, is timed analytically from this CPU; RULER's 16k-128k contexts exceed
    its 8k maximum and are reported as not sized."""
    out = tmp_path / "o"
    assert main(["sweep", "gpu", "--dry-run", "--model", "embedded", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = table_rows(text)
    assert len(rows) == 55 and all(r[0] == "embedded" for r in rows) and "meta-llama" not in text
    assert "measured on this machine's cpu (the grid's cuda is not here)" in text
    assert "not sized: embedded longcontext: context length 16384 is above the model's maximum" in text
    assert not out.exists()


def test_model_override_keeps_the_grids_settings(tmp_path):
    from evalkit.sweep.grid import with_model

    grid = tmp_path / "g.yaml"
    grid.write_text(
        SMALL.replace(
            "models: [embedded]",
            "models:\n  - {name: a, dtype: bfloat16, device: cuda}\n  - {name: b, dtype: bfloat16, device: cuda}",
        )
    )
    g = with_model(parse_grid(grid), "embedded")
    assert {(r.model.name, r.model.dtype, r.model.device) for r in g.runs} == {("embedded", "bfloat16", "cuda")}
    assert len(g.runs) == 2 and g.data["models"] == [
        dict(
            name="embedded",
            dtype="bfloat16",
            device="cuda",
            device_map=None,
            attn_implementation="sdpa",
            trust_remote_code=False,
            gpus=0,
            decode_path="auto",
        )
    ]


@pytest.mark.slow
def test_embedded_facts_before_its_first_conversion_convert_nothing(tmp_path, monkeypatch):
    """On a machine where the embedded model was never converted, the dry run sizes it from its preset
    and writes nothing; the preset is the model's own GGUF config (read here with transformers' GGUF
    loader, the reference) with the parameter count that config builds on the meta device."""
    import evalkit.models.loading as loading
    from evalkit.models.facts import _meta_param_count, model_facts
    from evalkit.models.presets import get_preset

    def refuse(*args, **kwargs):
        raise AssertionError("the dry run converted the embedded model")

    monkeypatch.setenv("EVALKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "ensure_embedded", refuse)
    facts = model_facts("embedded")
    assert not (tmp_path / "cache").exists()
    assert facts.weights_local and facts.tokenizer is None and facts.download_bytes == 0
    assert (facts.layers, facts.attn_width, facts.kv_width, facts.vocab, facts.max_length) == (
        30,
        576,
        192,
        49152,
        8192,
    )

    from transformers import AutoConfig

    gguf = loading.embedded_gguf("smollm2-135m")
    reference = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name).to_dict()
    preset = get_preset("smollm2-135m")
    assert {k: reference[k] for k in preset["config"]} == preset["config"]
    assert facts.params == preset["params"] == _meta_param_count(reference)
