"""benchmarks/gpu_check.py: its CPU mode passes with lm-eval, datasets and gguf blocked, its budget
skips sections with a reason and still writes valid JSON, and its pieces (scheduler, reference
rounding, model configs) are right."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SECTIONS = ["identity", "casts", "storage", "speed", "memory", "estimator", "vllm_dtypes", "vllm_engine", "vllm_native"]
BLOCKED = ("lm_eval", "datasets", "gguf")

# Runs a script (argv[1]) with argv[2:] as its arguments while lm_eval, datasets and gguf cannot be
# imported (as on the GPU image); writes the names whose import was attempted, and whether any is
# in sys.modules, to the file named by the environment variable GPU_CHECK_IMPORTS.
BLOCKING_RUNNER = r"""
import importlib.abc, json, os, runpy, sys
BLOCKED = @BLOCKED@
attempts = []
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            attempts.append(name)
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: not on the GPU image)", name=name)
        return None
sys.meta_path.insert(0, Block())
def report():
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    with open(os.environ["GPU_CHECK_IMPORTS"], "w") as f:
        json.dump({"attempts": attempts, "loaded": loaded}, f)
script, *args = sys.argv[1:]
if script == "-m":
    import importlib
    for name in args:
        importlib.import_module(name)
    report()
else:
    sys.argv = [script, *args]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
    report()
    sys.exit(code)
""".replace("@BLOCKED@", repr(BLOCKED))


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gc():
    return load_gpu_check()


@pytest.fixture(scope="module")
def casts(gc):
    """Section 2's module and its rounding reference (the script puts its folder on sys.path)."""
    return importlib.import_module("gpu_check_casts")


@pytest.fixture(scope="module")
def models(gc):
    return importlib.import_module("gpu_check_models")


@pytest.fixture(scope="module")
def vllm_dtypes(gc):
    return importlib.import_module("gpu_check_vllm_dtypes")


def run_blocked(tmp_path, *args, timeout=300):
    imports = tmp_path / "imports.json"
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKING_RUNNER, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "GPU_CHECK_IMPORTS": str(imports)},
    )
    return proc, json.loads(imports.read_text()) if imports.is_file() else None


def evalkit_modules_gpu_check_imports() -> list[str]:
    """Every evalkit module the script or one of its section modules (benchmarks/gpu_check_*.py) names in an
    import statement (top level or inside a function)."""
    names = set()
    nodes = (node for path in SCRIPT.parent.glob("gpu_check*.py") for node in ast.walk(ast.parse(path.read_text())))
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("evalkit"):
            names.add(node.module)
            for alias in node.names:  # `from evalkit.kv import rounding` names a module too
                if (
                    importlib.util.find_spec(node.module).submodule_search_locations
                    and importlib.util.find_spec(f"{node.module}.{alias.name}") is not None
                ):
                    names.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith("evalkit"))
    return sorted(names)


def test_storage_path_and_everything_gpu_check_imports_pull_in_no_lmeval_datasets_or_gguf(tmp_path):
    modules = [
        "evalkit.integration.install",
        *evalkit_modules_gpu_check_imports(),
        "evalkit.evals.decode.loop",  # the probe's
        "transformers",
        "safetensors.torch",
    ]
    assert "evalkit.sweep.throughput" in modules and "evalkit.kv.rounding" in modules
    proc, seen = run_blocked(tmp_path, "-m", *modules, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert seen == {"attempts": [], "loaded": []}, seen


@pytest.mark.slow
def test_cpu_mode_passes_every_section_with_lmeval_datasets_and_gguf_blocked(tmp_path):
    out = tmp_path / "check.json"
    proc, seen = run_blocked(tmp_path, str(SCRIPT), "--device", "cpu", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert seen == {"attempts": [], "loaded": []}, seen
    result = json.loads(out.read_text())
    assert result["failed"] == 0 and result["passed"] > 40 and result["complete"]
    assert [s["key"] for s in result["sections"]] == SECTIONS
    # section 8 runs the vLLM engine where vLLM is importable, and says why it skips where not
    vllm_here = importlib.util.find_spec("vllm") is not None
    vllm_keys = ("vllm_engine", "vllm_native")
    assert all(s["status"] == "pass" or (s["key"] in vllm_keys and not vllm_here) for s in result["sections"]), result[
        "sections"
    ]
    if not vllm_here:  # each vLLM section says why in one line
        (native,) = [c for c in result["checks"] if c["section"] == "vllm_native"]
        assert native["status"] == "skipped" and native["reason"].startswith("no engine-native run: vLLM is not")
    assert set(result["versions"]) >= {"python", "torch", "transformers", "cuda", "device"}
    for check in result["checks"]:
        assert set(check) >= {"section", "name", "status", "figures"} and check["status"] in ("pass", "fail", "skipped")
    by_section = {key: [c for c in result["checks"] if c["section"] == key] for key in SECTIONS}
    assert len(by_section["casts"]) >= 4 * 3  # every float format, every rounding mode
    names = " ".join(c["name"] for c in by_section["storage"])
    for needed in (
        "tensor/static",
        "head/static",
        "/unit",
        "block16",
        "token",
        "group32",
        "nvfp4",
        "mxfp4",
        "int4_asym",
    ):
        assert needed in names
    # the model, 2 contexts x 2 batch sizes, the eager pair at the first, the long context
    assert len(by_section["speed"]) == 1 + 4 + 1 + 1
    assert len(by_section["memory"]) == 5 + 6  # held bytes per compiled storage run, then every FP8 scheme's peak
    assert (
        len(by_section["vllm_dtypes"]) == 15
    )  # every modelled vllm: dtype but the per-tensor FP8 ones (12, and the 3 Octave caches)
    assert result["wall_s"] < result["budget_s"]
    assert "passed, 0 failed" in proc.stdout


def test_tiny_budget_skips_sections_with_a_reason_and_writes_json(gc, tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gc.main(["--device", "cpu", "--budget-s", "1"]) == 0
    result = json.loads((tmp_path / "gpu_check.json").read_text())  # the default --out under $OUT
    assert [s["key"] for s in result["sections"]] == SECTIONS
    assert result["failed"] == 0 and result["passed"] == 0
    for section in result["sections"]:
        assert section["status"] == "skipped", section
        assert (
            section["reason"] == "section 4 made no decode runs to measure"
            if section["key"] == "memory"
            else section["reason"].startswith("budget:")
        ), section
    assert result["versions"]["torch"] == torch.__version__


def test_cuda_without_a_device_is_one_failed_check_and_every_section_skipped(gc, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    out = tmp_path / "c.json"
    assert gc.main(["--device", "cuda", "--budget-s", "30", "--out", str(out)]) == 1
    result = json.loads(out.read_text())
    assert result["failed"] == 1 and [c["name"] for c in result["checks"] if c["status"] == "fail"] == [
        "a CUDA device is present"
    ]
    assert all(s["status"] == "skipped" and s["reason"] == "no CUDA device" for s in result["sections"])


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_scheduler_skips_starts_and_cuts_by_the_budget(gc):
    clock, report = FakeClock(), gc.Report()
    ran = []

    def work(seconds, items=1):
        def run(sec):
            ran.append(sec.key)
            for i in range(items):
                if not sec.fits(seconds):
                    sec.cut([f"{sec.key} item {j}" for j in range(i, items)])
                    return
                clock.now += seconds
                sec.check(f"{sec.key} item {i}", True)

        return run

    plans = [
        gc.Plan("a", "A", work(2.0), min_s=1, share_s=5),
        gc.Plan("b", "B", work(3.0, items=4), min_s=1, share_s=7),  # 2 items fit its share, 2 are cut
        gc.Plan("c", "C", work(1.0), min_s=2, share_s=2, needs=lambda: "no CUDA device"),
        gc.Plan("d", "D", work(1.0), min_s=1, share_s=5),
        gc.Plan("e", "E", work(1.0), min_s=50, share_s=60),
    ]  # never enough left
    gc.run_sections(plans, report, end=12.0, budget_s=12.0, clock=clock)
    status = {s["key"]: s for s in report.sections}
    assert ran == ["a", "b", "d"]
    assert status["a"]["status"] == "pass" and status["b"]["status"] == "pass" and status["b"]["cut"]
    assert [c["status"] for c in report.checks if c["section"] == "b"] == ["pass", "pass", "skipped", "skipped"]
    assert status["c"]["reason"] == "no CUDA device"
    assert status["e"]["status"] == "skipped" and status["e"]["reason"].startswith("budget:")
    assert report.count("fail") == 0


def test_scheduler_keeps_the_later_sections_minimum(gc):
    clock, report = FakeClock(), gc.Report()
    seen = {}

    def first(sec):
        seen["left"] = sec.left()

    gc.run_sections(
        [gc.Plan("a", "A", first, min_s=1, share_s=100), gc.Plan("b", "B", lambda s: None, min_s=30, share_s=30)],
        report,
        end=100.0,
        budget_s=100.0,
        clock=clock,
    )
    assert seen["left"] == 70.0  # its share is cut to what leaves the next section its minimum


def test_a_section_that_raises_is_one_failed_check_and_the_rest_still_run(gc):
    clock, report = FakeClock(), gc.Report()

    def boom(sec):
        raise RuntimeError("no kernel image")

    gc.run_sections(
        [gc.Plan("a", "A", boom, 0, 10), gc.Plan("b", "B", lambda s: s.check("b ok", True), 0, 10)],
        report,
        end=100.0,
        budget_s=100.0,
        clock=clock,
    )
    assert [(s["key"], s["status"]) for s in report.sections] == [("a", "fail"), ("b", "pass")]
    assert "RuntimeError: no kernel image" in report.checks[0]["reason"]


def test_reference_rounding_is_the_cast_for_nearest_even_and_known_values_for_the_other_modes(casts):
    from evalkit.kv.formats import FORMATS

    for name in ("fp8_e4m3", "fp8_e4m3fnuz", "fp8_e5m2"):
        fmt = FORMATS[name]
        x = casts.cast_inputs(fmt, 4096, torch.device("cpu"), seed=0)
        cast = x.to(fmt.torch_dtype).float()
        assert casts.same_bits(casts.reference_round(x, fmt, "rne"), cast)[0], name
    e4m3, e2m1 = FORMATS["fp8_e4m3"], FORMATS["fp4_e2m1"]
    x = torch.tensor([1.0625, -1.0625, 1.07, 1.0624, 2.0**-10, -(2.0**-10), -(2.0**-11), 448.0])
    expect = {
        "rne": [1.0, -1.0, 1.125, 1.0, 0.0, -0.0, -0.0, 448.0],
        "rtz": [1.0, -1.0, 1.0, 1.0, 0.0, -0.0, -0.0, 448.0],
        "rna": [1.125, -1.125, 1.125, 1.0, 2.0**-9, -(2.0**-9), -0.0, 448.0],
    }
    for mode, values in expect.items():
        assert casts.same_bits(casts.reference_round(x, e4m3, mode), torch.tensor(values))[0], mode
    y = torch.tensor([0.25, 0.75, 2.5, -2.5, 5.0, 0.2])
    assert casts.reference_round(y, e2m1, "rna").tolist() == [0.5, 1.0, 3.0, -3.0, 6.0, 0.0]
    assert casts.reference_round(y, e2m1, "rne").tolist() == [0.0, 1.0, 2.0, -2.0, 4.0, 0.0]
    assert casts.reference_round(y, e2m1, "rtz").tolist() == [0.0, 0.5, 2.0, -2.0, 4.0, 0.0]


def test_embedded_config_is_the_embedded_models_architecture(models):
    from evalkit.models.loading import EMBEDDED_MODELS, embedded_dense_dir

    cfg = models.EMBEDDED_CONFIG
    assert (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (
        30,
        9,
        3,
        64,
    )
    assert (
        "30 layers, 9 query / 3 KV heads, head_dim 64, 8192 context" in EMBEDDED_MODELS["smollm2-135m"]["description"]
    )
    dense = embedded_dense_dir("smollm2-135m") / "config.json"
    if not dense.is_file():
        pytest.skip("the embedded model's dense copy is not on this machine")
    shipped = json.loads(dense.read_text())
    for key, value in cfg.items():
        if key in ("initializer_range",) or key not in shipped:
            continue
        assert shipped[key] == pytest.approx(value) if isinstance(value, float) else shipped[key] == value, key


def test_real_size_config_is_llama_31_8b_from_the_preset(models):
    from transformers import AutoConfig, AutoModelForCausalLM

    from evalkit.models.presets import get_preset

    preset = get_preset(models.REAL_PRESET)
    fields = models.real_config(cpu=False)
    assert {k: fields[k] for k in preset["config"]} == preset["config"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**fields), dtype=torch.bfloat16)
    assert models.unique_params(model) == pytest.approx(preset["params"], rel=0.005)  # 8.03e9 published
    standin = models.real_config(cpu=True)
    assert standin["model_type"] == "llama" and standin["rope_parameters"]["rope_type"] == "llama3"


def run_vllm_section(gc):
    ctx = gc.Context("cpu", gc.sizes_for("cpu"))
    report = gc.Report()
    import time

    gc.vllm_dtypes(gc.Section(report, "vllm_dtypes", "7", time.perf_counter() + 600, time.perf_counter), ctx)
    return {c["name"].split(":")[1]: c for c in report.checks}


def test_vllm_section_covers_every_modelled_dtype_and_records_its_casts(gc):
    from evalkit.kv import microscaling
    from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Status

    grid = microscaling.round_to_grid
    checks = run_vllm_section(gc)
    assert microscaling.round_to_grid is grid  # the recorder put it back
    want = {n for n, d in VLLM_DTYPES.items() if d.status is Status.MODELLED} - {"fp8", "fp8_e4m3", "fp8_e5m2"}
    assert set(checks) == want
    assert all(c["status"] == "pass" for c in checks.values()), [c for c in checks.values() if c["status"] != "pass"]
    casts = {n: {r: e["casts"] for r, e in c["figures"]["roles"].items()} for n, c in checks.items()}
    # which casts each dtype makes, read from the kernels' descriptions: E4M3 codes, E4M3 group scales, E2M1 data
    assert set(casts["fp8_per_token_head"]["k"]) == {"fp8_e4m3"} and set(casts["turboquant_k8v4"]["k"]) == {"fp8_e4m3"}
    assert set(casts["nvfp4"]["v"]) == {"fp8_e4m3", "fp4_e2m1"} and set(casts["nvfp4_ds_mla"]["k"]) == {
        "fp8_e4m3",
        "fp4_e2m1",
    }
    for name in ("int8_per_token_head", "int4_per_token_head", "turboquant_3bit_nc", "ultraquant_4bit"):
        assert all(isinstance(c, str) and c.startswith("none") for c in casts[name].values()), name
    nv = casts["nvfp4"]["k"]["fp4_e2m1"]
    assert nv["count"] == 4 * 8 * 8 * 64 and nv["emulation_vs_rule"]["mismatches"] == 0
    assert "float4" in nv["conversion"]


def test_vllm_section_fails_a_cast_that_breaks_the_rule(gc, vllm_dtypes, monkeypatch):
    """An E2M1 rounding toward zero (not the hardware's nearest even) is caught by the rule comparison."""
    from evalkit.kv import microscaling
    from evalkit.kv.rounding import Rounding

    real = microscaling.round_to_grid
    monkeypatch.setattr(microscaling, "round_to_grid", lambda y, fmt, rounding=None: real(y, fmt, Rounding.RTZ))
    nvfp4 = [item for item in vllm_dtypes.vllm_dtype_items() if item[0] == "nvfp4"]
    monkeypatch.setattr(vllm_dtypes, "vllm_dtype_items", lambda: nvfp4)
    checks = run_vllm_section(gc)
    assert checks["nvfp4"]["status"] == "fail"
    assert checks["nvfp4"]["figures"]["roles"]["k"]["casts"]["fp4_e2m1"]["emulation_vs_rule"]["mismatches"] > 0
