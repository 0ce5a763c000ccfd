"""What evalkit uses of vLLM's Python API, read from evalkit's own source with :mod:`ast` (vLLM is not imported).

:func:`evalkit_uses` walks every module of the ``evalkit`` package and lists each place it reaches into
vLLM as a :class:`Use`:

- ``import vllm.x.y`` (a module that must exist) and ``from vllm.x import a`` (a name or submodule);
- a call of a name bound that way (``SamplingParams(max_tokens=1, ...)``, ``vllm.LLM(model=..., ...)``,
  ``_custom_ops.reshape_and_cache_flash(...)``): its keywords, including the string keys of a dict
  literal the call spreads with ``**name`` in the same function, and its positional count, so the
  checker (:mod:`evalkit.engines.vllm.api_check`) can hold them against the callee's signature;
- an attribute read on such a name (``vllm.__version__``, ``RequestOutputKind.FINAL_ONLY``);
- a vLLM source file evalkit loads by path (``"vllm/v1/attention/ops/....py"``, also through module
  constants joined with ``+``), and a call on the module :func:`load_with_triton` returns for it.

A variable named ``vllm`` (``vllm = import_vllm()``) is the ``vllm`` package. What the source cannot
show mechanically, the objects vLLM hands back (``LLM.llm_engine``, the scheduler, the attention
layers' ``_k_scale_float``) and the keywords that another function forwards to ``vllm.LLM`` (the
engine options of the registry; lm-eval's ``VLLM`` model), is listed by hand in :data:`RUNTIME`
and added by :func:`all_uses`, each with the evalkit file that relies on it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

FILE_PREFIX = "vllm/"
LOADERS = ("load_with_triton", "load_kernel_module")  # evalkit functions that load a vLLM file as a module


@dataclass(frozen=True)
class Use:
    """One thing evalkit uses: ``kind`` is ``module``, ``name``, ``call``, ``method`` (a call on an instance
    of the class that ``target`` names up to its last part) or ``file``; ``where`` is ``path:line``."""

    kind: str
    target: str
    keywords: tuple[str, ...] = ()
    positional: int | None = 0  # None: not known (a *args spread)
    where: str = ""


# -- the objects vLLM hands back, and forwarded keywords (by hand; each names the evalkit file using it) ------------
_LLM = "vllm.entrypoints.llm.LLM"
_ENGINE = "vllm.v1.engine.llm_engine.LLMEngine"
_SCHED = "vllm.v1.core.sched.scheduler.Scheduler"
_ATTN = "vllm.model_executor.layers.attention.attention.Attention"
RUNTIME: tuple[tuple[str, str, tuple[str, ...], int], ...] = (
    # (kind, target, keywords, positional count); kind "name": an attribute of an instance of the class
    ("name", f"{_LLM}.llm_engine", (), 0),
    ("method", f"{_LLM}.apply_model", (), 1),
    ("method", f"{_LLM}.generate", ("use_tqdm",), 1),  # vllm_lmeval: lm-eval's generate calls, with vLLM's bar
    ("method", f"{_ENGINE}.add_request", (), 3),
    ("method", f"{_ENGINE}.step", (), 0),
    ("method", f"{_ENGINE}.has_unfinished_requests", (), 0),
    ("name", f"{_ENGINE}.engine_core", (), 0),
    ("name", f"{_ENGINE}.vllm_config", (), 0),
    ("name", f"{_ENGINE}.model_config", (), 0),
    ("name", "vllm.v1.engine.core_client.InprocClient.engine_core", (), 0),
    ("method", "vllm.v1.engine.core_client.InprocClient.shutdown", (), 0),
    ("name", "vllm.v1.engine.core.EngineCore.scheduler", (), 0),
    ("name", f"{_SCHED}.requests", (), 0),
    ("name", f"{_SCHED}.kv_cache_config", (), 0),
    ("name", f"{_SCHED}.kv_cache_manager", (), 0),
    ("method", f"{_SCHED}.get_request_counts", (), 0),
    ("name", "vllm.v1.core.kv_cache_manager.KVCacheManager.block_pool", (), 0),
    ("method", "vllm.v1.core.block_pool.BlockPool.get_num_free_blocks", (), 0),
    ("name", "vllm.v1.request.Request.num_computed_tokens", (), 0),
    ("name", "vllm.v1.request.Request.num_preemptions", (), 0),
    ("name", "vllm.v1.kv_cache_interface.KVCacheConfig.num_blocks", (), 0),
    ("name", "vllm.v1.kv_cache_interface.KVCacheConfig.kv_cache_tensors", (), 0),
    ("name", "vllm.v1.kv_cache_interface.KVCacheConfig.kv_cache_groups", (), 0),
    ("name", "vllm.config.cache.CacheConfig.kv_cache_max_concurrency", (), 0),
    ("method", "vllm.config.model.ModelConfig.get_vocab_size", (), 0),
    ("name", "vllm.outputs.RequestOutput.prompt_logprobs", (), 0),
    ("name", "vllm.outputs.RequestOutput.outputs", (), 0),
    ("name", "vllm.outputs.RequestOutput.finished", (), 0),
    ("name", "vllm.outputs.RequestOutput.request_id", (), 0),
    ("name", "vllm.outputs.CompletionOutput.token_ids", (), 0),
    ("name", "vllm.logprobs.FlatLogprobs.start_indices", (), 0),
    ("name", "vllm.logprobs.FlatLogprobs.end_indices", (), 0),
    ("name", "vllm.logprobs.FlatLogprobs.logprobs", (), 0),
    ("name", "vllm.logprobs.FlatLogprobs.token_ids", (), 0),
    ("method", "vllm.sampling_params.SamplingParams.clone", (), 0),
    ("name", "vllm.sampling_params.SamplingParams.output_kind", (), 0),
    ("name", f"{_ATTN}._k_scale_float", (), 0),  # vllm_runner._attention_layers: the scales each layer uses
    ("name", f"{_ATTN}._v_scale_float", (), 0),
    ("name", f"{_ATTN}._k_scale", (), 0),
    ("name", f"{_ATTN}.kv_cache_dtype", (), 0),
    ("name", f"{_ATTN}.attn_backend", (), 0),  # the backend vLLM selected for the layer (get_attn_backend)
    ("name", f"{_ATTN}.impl", (), 0),
    ("name", f"{_ATTN}.query_quant", (), 0),  # set where the backend takes FP8 queries with an FP8 cache
    ("name", "vllm.v1.attention.backends.flash_attn.FlashAttentionImpl.vllm_flash_attn_version", (), 0),
    ("method", "vllm.v1.attention.backend.AttentionBackend.get_name", (), 0),
    ("method", "vllm.model_executor.models.registry._ModelRegistry.get_supported_archs", (), 0),
    ("name", "vllm.platforms.interface.Platform.device_type", (), 0),
    ("method", "vllm.platforms.interface.Platform.is_rocm", (), 0),
    ("name", "vllm.model_executor.layers.quantization.turboquant.config.TurboQuantConfig.slot_size_aligned", (), 0),
)
RUNTIME_WHERE = "evalkit/engines (objects vLLM returns: vllm/runner, vllm/serving, vllm/lmeval, vllm/triton_rotations)"
# lm-eval's VLLM model hands the keywords it does not take itself to vllm.LLM (lm_eval/models/vllm_causallms.py)
FORWARDS_TO_LLM = {"lm_eval.models.vllm_causallms.VLLM": "vllm.LLM"}


# -- reading evalkit's source --------------------------------------------------------------------------------
def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level string constants (``OPS = "vllm/v1/..."``, ``X = OPS + "f.py"``)."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _string(node.value, out)
            if value is not None:
                out[node.targets[0].id] = value
    return out


def _string(node, consts: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _string(node.left, consts), _string(node.right, consts)
        return left + right if left is not None and right is not None else None
    return None


def _dotted(node, bound: dict[str, str]) -> str | None:
    """The vLLM dotted name an expression (``a.b.c`` rooted at a bound name) stands for."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in bound:
        return None
    return ".".join([bound[node.id], *reversed(parts)])


def _file_module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


class _Scanner:
    def __init__(self, rel: str, consts: dict[str, str]):
        self.rel, self.consts, self.uses = rel, consts, []

    def add(self, kind, target, node, keywords=(), positional=0):
        self.uses.append(Use(kind, target, tuple(keywords), positional, f"{self.rel}:{node.lineno}"))

    def scan(self, body: list, inherited: dict[str, str]) -> None:
        """One scope (a module, function or class body): its bindings, then its uses, then its inner scopes."""
        bound, dicts = dict(inherited), {}
        nodes, inner = _flat(body)
        for node in nodes:  # bindings first (imports inside functions come before their uses)
            self._bind(node, bound, dicts)
        callees = {id(n.func) for n in nodes if isinstance(n, ast.Call)}
        inside = {id(n.value) for n in nodes if isinstance(n, ast.Attribute)}  # ``a.b`` within ``a.b.c``
        for node in nodes:
            if isinstance(node, ast.Call):
                self._call(node, bound, dicts)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                target = _dotted(node, bound) if id(node) not in callees | inside else None
                if target is not None:
                    self.add("name", target, node)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith(FILE_PREFIX) and node.value.endswith(".py") and "\n" not in node.value:
                    self.add("file", node.value, node)
        for scope in inner:
            self.scan(scope.body if not isinstance(scope, ast.Lambda) else [ast.Expr(scope.body)], bound)

    def _bind(self, node, bound: dict[str, str], dicts: dict[str, set[str]]) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "vllm":
                    self.add("module", a.name, node)
                    bound[a.asname or "vllm"] = a.name if a.asname else "vllm"
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            root = node.module.split(".")[0]
            for a in node.names:
                if root == "vllm":
                    self.add("name", f"{node.module}.{a.name}", node)
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
                elif f"{node.module}.{a.name}" in FORWARDS_TO_LLM:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, value = node.targets[0].id, node.value
            if name == "vllm":
                bound["vllm"] = "vllm"
            elif _dict_keys(value):
                dicts[name] = _dict_keys(value)
            elif isinstance(value, ast.Call) and getattr(value.func, "id", None) in LOADERS and value.args:
                path = _string(value.args[0], self.consts)
                if path and path.startswith(FILE_PREFIX):
                    bound[name] = _file_module(path)

    def _call(self, node: ast.Call, bound: dict[str, str], dicts: dict[str, set[str]]) -> None:
        target = _dotted(node.func, bound)
        if target is None:
            return
        keywords = [k.arg for k in node.keywords if k.arg is not None]
        for k in node.keywords:
            if k.arg is None and isinstance(k.value, ast.Name):
                keywords += sorted(dicts.get(k.value.id, ()))
        positional = None if any(isinstance(a, ast.Starred) for a in node.args) else len(node.args)
        if target in FORWARDS_TO_LLM:
            self.add("forward", target, node, keywords, positional)
        else:
            self.add("call", target, node, keywords, positional)


def _dict_keys(value) -> set[str]:
    """The constant keys of a dict literal (either branch of ``{...} if c else {...}``)."""
    if isinstance(value, ast.IfExp):
        return _dict_keys(value.body) | _dict_keys(value.orelse)
    if isinstance(value, ast.Dict):
        return {str(k.value) for k in value.keys if isinstance(k, ast.Constant)}
    return set()


def _flat(body: list) -> tuple[list, list]:
    """The nodes of one scope, not descending into the functions, lambdas and classes inside it (returned apart)."""
    nodes, inner, stack = [], [], list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            inner.append(node)
            if not isinstance(node, ast.Lambda):
                nodes += [*node.decorator_list]
            continue
        nodes.append(node)
        stack += reversed(list(ast.iter_child_nodes(node)))
    return nodes, inner


def source_uses(root: Path, package: str = "evalkit") -> list[Use]:
    """Every :class:`Use` of vLLM in ``root/package/**/*.py`` (paths in ``where`` relative to ``root``)."""
    out: list[Use] = []
    for path in sorted((root / package).rglob("*.py")):
        if "_data" in path.parts or "__pycache__" in path.parts:
            continue
        text = path.read_text()
        if "vllm" not in text:
            continue
        tree = ast.parse(text, filename=str(path))
        scanner = _Scanner(path.relative_to(root).as_posix(), _constants(tree))
        scanner.scan(tree.body, {})
        out += scanner.uses
    return list(dict.fromkeys(out))


def engine_option_uses() -> list[Use]:
    """The vLLM engine options of the registry (:mod:`evalkit.engines.vllm.options`) and the memory arguments
    of :func:`evalkit.engines.vllm.gpu.start_memory`: keywords of ``vllm.LLM`` (evalkit spreads them into its
    calls, and lm-eval's, as ``**`` arguments)."""
    from evalkit.engines.vllm.gpu import MEMORY_ARGUMENTS
    from evalkit.engines.vllm.options import NOT_KEYWORDS, OPTIONS

    keywords = tuple(o.name for o in OPTIONS if o.name not in NOT_KEYWORDS)  # the others: environment, evalkit's
    return [
        Use("call", "vllm.LLM", keywords, None, "evalkit/engines/vllm/options.py (OPTIONS)"),
        Use("call", "vllm.LLM", MEMORY_ARGUMENTS, None, "evalkit/engines/vllm/gpu.py (start_memory)"),
    ]


def all_uses(root: Path | None = None) -> list[Use]:
    """:func:`source_uses` of the installed evalkit, :func:`engine_option_uses` and :data:`RUNTIME`."""
    root = root or Path(__file__).resolve().parents[3]
    runtime = [Use(kind, target, kw, n, RUNTIME_WHERE) for kind, target, kw, n in RUNTIME]
    return [*source_uses(root), *engine_option_uses(), *runtime]
