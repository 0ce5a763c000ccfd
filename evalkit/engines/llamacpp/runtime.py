"""The thin layer evalkit uses to run llama.cpp itself (through llama-cpp-python's low-level ctypes API).

Why a layer of its own: evalkit holds its own KV-cache emulation against llama.cpp's real cache, so it needs
exactly what llama.cpp computes, with every setting that changes the numbers written down:

* :class:`LlamaCppModel` loads a GGUF once, CPU only, with ``use_extra_bufts=False``: the extra (AMX /
  repacked) weight buffers crash ``llama_decode`` on AMX hosts and change the weight matmul path, so
  evalkit never uses them (recorded in :meth:`LlamaCppModel.settings`).
* :meth:`LlamaCppModel.context` makes one llama.cpp context per cache pair (``type_k`` / ``type_v`` from
  :data:`CACHE_TYPES`, llama.cpp's ``--cache-type-k/-v`` whitelist). Flash attention is set explicitly on
  or off, never "auto", and a quantized V without it is refused before any work (llama.cpp stores V
  transposed without flash attention, one element per row, which no quant block fits).
* :class:`LlamaCppContext` gives full-vocabulary logits of a window (:meth:`~LlamaCppContext.logits`),
  greedy generation (:meth:`~LlamaCppContext.generate`), teacher-forced one-token decode steps through the
  cache (:meth:`~LlamaCppContext.step_logits`), and the KV allocation two ways
  (:meth:`~LlamaCppContext.kv_bytes`): computed ``n_layer * cells * ggml_row_size(type, n_head_kv *
  head_dim)`` and as llama.cpp itself logs it.
* llama.cpp's log goes through one callback owned here: quiet in normal use, captured while a model or
  context is created so the KV size line, the Hadamard rotation flags (``attn_rot_k`` / ``attn_rot_v``;
  off when ``LLAMA_ATTN_ROT_DISABLE`` is set) and llama.cpp's own error text can be read back.

llama.cpp rounds the context up to a multiple of :data:`N_CTX_PAD` cells; ``LlamaCppContext.n_ctx`` is
the padded value llama.cpp reports.
"""

from __future__ import annotations

import collections
import ctypes
import importlib.util
import os
import re
from pathlib import Path

import numpy as np

from evalkit.errors import EvalkitError

INSTALL_HINT = (
    "llama.cpp is not installed: pip install -e '.[llamacpp]' (builds llama-cpp-python from source, about 5 min)"
)

# llama.cpp's --cache-type-k / --cache-type-v whitelist -> ggml_type enum values.
CACHE_TYPES = {
    "f32": 0,
    "f16": 1,
    "bf16": 30,
    "q8_0": 8,
    "q4_0": 2,
    "q4_1": 3,
    "iq4_nl": 20,
    "q5_0": 6,
    "q5_1": 7,
}
QUANTIZED_TYPES = ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
# (elements per block, bytes per block): ggml's sizes, used only where libggml-base cannot be reached.
BLOCK_SIZES = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}
N_CTX_PAD = 256  # llama.cpp rounds n_ctx up to a multiple of this many cells
ROT_DISABLE_ENV = "LLAMA_ATTN_ROT_DISABLE"

# ggml_log_level as in the shipped ggml.h (NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5); llama-cpp-python's
# own logger comments an older numbering.
_LEVEL_WARN, _LEVEL_ERROR, _LEVEL_CONT = 3, 4, 5


# -- availability ---------------------------------------------------------------------------------------
def installed() -> bool:
    """Whether llama-cpp-python is importable (without importing it)."""
    return importlib.util.find_spec("llama_cpp") is not None


_state: dict = {}


def require():
    """The ``llama_cpp`` module, with its backend initialised and evalkit's quiet log callback set."""
    if "lib" in _state:
        return _state["lib"]
    try:
        import llama_cpp
    except (ImportError, OSError) as exc:
        raise EvalkitError(
            f"{INSTALL_HINT} [{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}]"
        ) from exc
    llama_cpp.llama_backend_init()
    _LOG.install(llama_cpp)
    _state["lib"] = llama_cpp
    return llama_cpp


def version() -> str:
    """``"llama-cpp-python 0.3.36"``."""
    try:
        from importlib.metadata import version as dist_version

        return f"llama-cpp-python {dist_version('llama_cpp_python')}"
    except Exception:
        return f"llama-cpp-python {require().__version__}"


def check_cache_types(type_k: str, type_v: str, flash_attn: bool) -> None:
    """llama.cpp's refusals for a cache pair, in one line, before any model is loaded."""
    for which, name in (("K", type_k), ("V", type_v)):
        if name not in CACHE_TYPES:
            raise EvalkitError(f"llama.cpp has no {which} cache type {name!r}: use one of {', '.join(CACHE_TYPES)}")
    if type_v in QUANTIZED_TYPES and not flash_attn:
        raise EvalkitError(
            f"llama.cpp needs flash attention for a quantized V cache ({type_v}): "
            "turn flash attention on (flash_attn=true), or store V as f16"
        )


# -- llama.cpp's log ------------------------------------------------------------------------------------
class _Log:
    """The one llama.cpp/ggml log callback: drops INFO unless capturing, keeps recent warnings/errors."""

    def __init__(self):
        self.lines: list[tuple[int, str]] | None = None  # captured (level, line) while capturing
        self.recent: collections.deque = collections.deque(maxlen=20)  # recent warnings / errors
        self._partial = ""
        self._level = 0
        self._callback = None  # the ctypes function object: must stay alive as long as llama.cpp may call it

    def install(self, llama_cpp) -> None:
        if self._callback is None:
            self._callback = llama_cpp.llama_log_callback(self._on_log)
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))

    def _on_log(self, level, text, _user_data):
        try:
            if level != _LEVEL_CONT:
                self._level = level
            self._partial += (text or b"").decode("utf-8", "replace")
            while "\n" in self._partial:
                line, self._partial = self._partial.split("\n", 1)
                self._emit(self._level, line)
        except Exception:  # never raise into C
            pass

    def _emit(self, level, line):
        if self.lines is not None:
            self.lines.append((level, line))
        if level in (_LEVEL_WARN, _LEVEL_ERROR):
            self.recent.append(line.strip())

    def start(self) -> None:
        self._flush()
        self.lines = []
        self.recent.clear()

    def stop(self) -> list[tuple[int, str]]:
        self._flush()
        lines, self.lines = self.lines or [], None
        return lines

    def _flush(self):
        if self._partial:
            line, self._partial = self._partial, ""
            self._emit(self._level, line)


_LOG = _Log()


def _error_text(lines) -> str:
    errors = [line.strip() for level, line in lines if level == _LEVEL_ERROR and line.strip()]
    errors = errors or list(_LOG.recent)
    return "; ".join(errors[-3:]) if errors else "no error text logged"


_KV_SIZE = re.compile(
    r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\), "
    r"K \((\w+)\):\s*([\d.]+) MiB, V \((\w+)\):\s*([\d.]+) MiB"
)
_KV_BUFFER = re.compile(r"llama_kv_cache:\s*(\S+) KV buffer size =\s*([\d.]+) MiB")
_ROT = re.compile(r"attn_rot_([kv]) = (\d+)")


def parse_kv_log(lines) -> dict:
    """The KV cache figures llama.cpp logs at context creation (MiB as printed, 2 decimals) and the
    Hadamard rotation flags."""
    out: dict = {}
    for _level, line in lines:
        m = _KV_SIZE.search(line)
        if m:
            out.update(
                log_total=float(m[1]),
                log_cells=int(m[2]),
                log_layers=int(m[3]),
                log_seqs=f"{m[4]}/{m[5]}",
                log_type_k=m[6],
                log_k=float(m[7]),
                log_type_v=m[8],
                log_v=float(m[9]),
            )
        m = _KV_BUFFER.search(line)
        if m:
            out.setdefault("log_buffers", {})[m[1]] = float(m[2])
        for which, value in _ROT.findall(line):
            out[f"attn_rot_{which}"] = bool(int(value))
    return out


# -- ggml row sizes -------------------------------------------------------------------------------------
def row_size(type_name: str, n: int) -> int:
    """Bytes of one row of ``n`` elements of a cache type: ggml's own ``ggml_row_size`` when its library
    can be reached, else ggml's block table (identical for the whitelisted types)."""
    fn = _row_size_fn()
    if fn is not None:
        return int(fn(CACHE_TYPES[type_name], n))
    blck, size = BLOCK_SIZES[type_name]
    if n % blck:
        raise EvalkitError(f"a {type_name} row of {n} elements is not whole {blck}-element blocks: use another type")
    return n // blck * size


def _row_size_fn():
    if "row_size" not in _state:
        fn = None
        try:
            lib_dir = Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"
            base = ctypes.CDLL(str(lib_dir / "libggml-base.so"), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
            fn = base.ggml_row_size
            fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int64], ctypes.c_size_t
        except (OSError, AttributeError, TypeError):
            fn = None
        _state["row_size"] = fn
    return _state["row_size"]


# -- the model ------------------------------------------------------------------------------------------
class LlamaCppModel:
    """One GGUF loaded on the CPU; make contexts (one per cache pair) with :meth:`context`."""

    def __init__(self, path: Path, handle, n_threads: int, load_log):
        self.path = Path(path)
        self._handle = handle
        self.n_threads = n_threads
        self._contexts: list[LlamaCppContext] = []
        lib = require()
        self._vocab = lib.llama_model_get_vocab(handle)
        self.vocab = int(lib.llama_vocab_n_tokens(self._vocab))
        self.n_layer = int(lib.llama_model_n_layer(handle))
        self.n_head = int(lib.llama_model_n_head(handle))
        self.n_head_kv = int(lib.llama_model_n_head_kv(handle))
        self.n_embd = int(lib.llama_model_n_embd(handle))
        self.n_ctx_train = int(lib.llama_model_n_ctx_train(handle))
        self.arch = self.meta("general.architecture") or "llama"
        self.head_dim = self._meta_int(f"{self.arch}.attention.key_length") or self.n_embd // self.n_head
        self.head_dim_v = self._meta_int(f"{self.arch}.attention.value_length") or self.head_dim
        self.eos = int(lib.llama_vocab_eos(self._vocab))
        self.load_log = load_log

    @classmethod
    def open(cls, path, n_threads: int = 2) -> LlamaCppModel:
        """Load ``path`` (a GGUF) on the CPU without extra weight buffers (``use_extra_bufts=False``)."""
        lib = require()
        path = Path(path)
        if not path.is_file():
            raise EvalkitError(f"{path}: no such GGUF file: give the path of a .gguf model")
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = False
        _LOG.start()
        try:
            handle = lib.llama_model_load_from_file(str(path).encode(), params)
        finally:
            lines = _LOG.stop()
        if not handle:
            raise EvalkitError(f"llama.cpp could not load {path.name}: {_error_text(lines)}")
        return cls(path, handle, n_threads, lines)

    # metadata -------------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None."""
        lib = require()
        buf = ctypes.create_string_buffer(512)
        n = lib.llama_model_meta_val_str(self._handle, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def _meta_int(self, key: str) -> int | None:
        value = self.meta(key)
        try:
            return int(value) if value is not None else None
        except ValueError:
            return None

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """llama.cpp's own tokenizer."""
        lib = require()
        data = text.encode("utf-8")
        cap = len(data) + 8
        out = (lib.llama_token * cap)()
        n = lib.llama_tokenize(self._vocab, data, len(data), out, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            out = (lib.llama_token * cap)()
            n = lib.llama_tokenize(self._vocab, data, len(data), out, cap, add_special, parse_special)
        return list(out[:n])

    def piece(self, token: int) -> str:
        """The text of one token (special tokens rendered)."""
        lib = require()
        buf = ctypes.create_string_buffer(256)
        n = lib.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, True)
        return buf.raw[: max(n, 0)].decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(require().llama_vocab_is_eog(self._vocab, int(token)))

    def settings(self) -> dict:
        return {
            "gguf": self.path.name,
            "engine_version": version(),
            "use_extra_bufts": False,
            "n_gpu_layers": 0,
            "n_layer": self.n_layer,
            "n_head_kv": self.n_head_kv,
            "head_dim": self.head_dim,
            "vocab": self.vocab,
        }

    # contexts -------------------------------------------------------------------------------------------
    def context(
        self,
        type_k: str = "f16",
        type_v: str = "f16",
        flash_attn: bool = True,
        n_ctx: int = 512,
        n_batch: int = 512,
        n_threads: int | None = None,
    ) -> LlamaCppContext:
        """A llama.cpp context with this cache pair (refusals in one line before anything is built)."""
        check_cache_types(type_k, type_v, flash_attn)
        if self._handle is None:
            raise EvalkitError(f"the llama.cpp model {self.path.name} is closed: open it again")
        if n_ctx < 1 or n_batch < 1:
            raise EvalkitError(f"n_ctx={n_ctx} n_batch={n_batch}: give at least 1 for each")
        ctx = LlamaCppContext(
            self, type_k, type_v, bool(flash_attn), int(n_ctx), int(n_batch), int(n_threads or self.n_threads)
        )
        self._contexts.append(ctx)
        return ctx

    def close(self) -> None:
        for ctx in self._contexts:
            ctx.close()
        self._contexts = []
        if self._handle is not None:
            require().llama_model_free(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class LlamaCppContext:
    """One llama.cpp context (one sequence) with a fixed cache pair; see the module docstring."""

    def __init__(self, model: LlamaCppModel, type_k, type_v, flash_attn, n_ctx, n_batch, n_threads):
        lib = require()
        self.model = model
        self.type_k, self.type_v, self.flash_attn = type_k, type_v, flash_attn
        self.n_ctx_requested, self.n_batch, self.n_threads = n_ctx, n_batch, n_threads
        self.rot_disable_env = os.environ.get(ROT_DISABLE_ENV)
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_outputs_max = 0  # = n_batch: every position of a batch may return logits
        params.n_outputs_max_per_seq = 0
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.type_k = CACHE_TYPES[type_k]
        params.type_v = CACHE_TYPES[type_v]
        params.embeddings = False
        params.no_perf = True
        self._handle = None
        self._batch = None
        _LOG.start()
        try:
            handle = lib.llama_init_from_model(model._handle, params)
        finally:
            lines = _LOG.stop()
        if not handle:
            raise EvalkitError(
                f"llama.cpp could not create a context (K {type_k}, V {type_v}, flash_attn={flash_attn}, "
                f"n_ctx={n_ctx}): {_error_text(lines)}"
            )
        self._handle = handle
        self._mem = lib.llama_get_memory(handle)
        self._batch = lib.llama_batch_init(n_batch, 0, 1)
        self.n_ctx = int(lib.llama_n_ctx(handle))
        self.create_log = lines
        self._kv_log = parse_kv_log(lines)

    # decoding -------------------------------------------------------------------------------------------
    def _check_open(self):
        if self._handle is None:
            raise EvalkitError("this llama.cpp context is closed: make a new one with LlamaCppModel.context")

    def _check_ids(self, ids, decoded: int, what: str):
        if decoded > self.n_ctx:
            raise EvalkitError(
                f"{what} needs {decoded} cells but the llama.cpp context has {self.n_ctx}: make the context with n_ctx>={decoded}"
            )
        bad = [t for t in ids if not 0 <= int(t) < self.model.vocab]
        if bad:
            raise EvalkitError(
                f"token id {bad[0]} is outside the vocabulary of {self.model.vocab}: tokenize for this model"
            )

    def _clear(self):
        require().llama_memory_clear(self._mem, True)

    def _decode(self, ids, pos0: int, out: np.ndarray | None = None, first: int = 0) -> None:
        """Decode ``ids`` at positions ``pos0...``, one llama_decode per ``n_batch`` tokens. With ``out``
        ([len(ids) - first, vocab]) the logits of positions ``first...`` are written there (only those
        are computed); without it only the last position has logits (read with :meth:`_last`)."""
        lib = require()
        b = self._batch
        n = len(ids)
        vocab = self.model.vocab
        for start in range(0, n, self.n_batch):
            chunk = ids[start : start + self.n_batch]
            for i, tok in enumerate(chunk):
                b.token[i] = int(tok)
                b.pos[i] = pos0 + start + i
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = 0
                b.logits[i] = 1 if (out is not None and start + i >= first) or start + i == n - 1 else 0
            b.n_tokens = len(chunk)
            rc = lib.llama_decode(self._handle, b)
            if rc != 0:
                raise EvalkitError(
                    f"llama_decode failed (code {rc}) at position {pos0 + start}: {_error_text([])}; "
                    "check n_ctx and the token ids"
                )
            asked = len(chunk) - max(0, first - start)  # the chunk's positions at or after `first`
            if out is not None and asked > 0:  # their logits are one [asked, vocab] block, in order
                ptr = ctypes.cast(lib.llama_get_logits(self._handle), ctypes.POINTER(ctypes.c_float))
                lo = max(0, start - first)
                out[lo : lo + asked] = np.ctypeslib.as_array(ptr, shape=(asked, vocab))

    def _last(self) -> np.ndarray:
        ptr = require().llama_get_logits_ith(self._handle, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.model.vocab,)).copy()

    def logits(self, ids, first: int = 0) -> np.ndarray:
        """Full-vocabulary logits for the positions ``first...`` of ``ids`` (float32 [len(ids) - first,
        vocab]; every position by default), decoded from an empty cache."""
        self._check_open()
        ids = [int(t) for t in ids]
        if not ids:
            raise EvalkitError("logits of an empty window: give at least one token")
        if not 0 <= first < len(ids):
            raise EvalkitError(f"first={first}: give a position of the window (0 to {len(ids) - 1})")
        self._check_ids(ids, len(ids), f"a window of {len(ids)} tokens")
        self._clear()
        out = np.empty((len(ids) - first, self.model.vocab), np.float32)
        self._decode(ids, 0, out, first)
        return out

    def _prompt(self, prompt_ids) -> np.ndarray:
        self._clear()
        self._decode(prompt_ids, 0)
        return self._last()

    def generate(self, prompt_ids, max_new_tokens: int, eos_ids=None, stop=None) -> list[int]:
        """Greedy continuation (argmax, ties to the lowest id), one token per llama_decode after the prompt;
        stops after an EOS (included). ``eos_ids=None``: the model's end-of-generation tokens. ``stop``: a
        function of the tokens generated so far, called after each; True stops there (that token included)."""
        self._check_open()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EvalkitError("generate from an empty prompt: give at least one token")
        self._check_ids(
            prompt, len(prompt) + max(max_new_tokens - 1, 0), f"a prompt of {len(prompt)} + {max_new_tokens} new tokens"
        )
        eos = None if eos_ids is None else {int(t) for t in eos_ids}
        out: list[int] = []
        if max_new_tokens <= 0:
            return out
        row = self._prompt(prompt)
        while True:
            tok = int(np.argmax(row))
            out.append(tok)
            if len(out) >= max_new_tokens or (self.model.is_eog(tok) if eos is None else tok in eos):
                return out
            if stop is not None and stop(out):
                return out
            self._decode([tok], len(prompt) + len(out) - 1)
            row = self._last()

    def step_logits(self, prompt_ids, teacher_ids) -> np.ndarray:
        """Teacher-forced decode through the cache: row i is the distribution predicting ``teacher_ids[i]``
        (row 0 from the prompt's last position, then one llama_decode of one teacher token per row).

        On the CPU with flash attention these rows came out bit-equal to :meth:`logits` of the same tokens
        as one window; without flash attention the one-token steps take another attention path and differ
        (measured up to ~1.2 in a logit on SmolLM2-135M f16)."""
        self._check_open()
        prompt = [int(t) for t in prompt_ids]
        teacher = [int(t) for t in teacher_ids]
        if not prompt:
            raise EvalkitError("step_logits from an empty prompt: give at least one token")
        self._check_ids(
            prompt + teacher,
            len(prompt) + max(len(teacher) - 1, 0),
            f"{len(prompt)} prompt + {len(teacher)} teacher tokens",
        )
        out = np.empty((len(teacher), self.model.vocab), np.float32)
        if not teacher:
            return out
        out[0] = self._prompt(prompt)
        for i, tok in enumerate(teacher[:-1], start=1):
            self._decode([tok], len(prompt) + i - 1)
            out[i] = self._last()
        return out

    # the cache and the settings -------------------------------------------------------------------------
    def kv_bytes(self) -> dict:
        """The KV allocation: computed ``k``/``v`` bytes (``n_layer * cells * ggml_row_size(type,
        n_head_kv * head_dim)``) and ``cells``, plus llama.cpp's logged figures (``log_k``, ``log_v``,
        ``log_total`` in MiB as printed, ``log_cells``, ``log_layers``) when the line was logged."""
        m = self.model
        cells = self.n_ctx
        row_k = row_size(self.type_k, m.n_head_kv * m.head_dim)
        row_v = row_size(self.type_v, m.n_head_kv * m.head_dim_v)
        out = {
            "k": m.n_layer * cells * row_k,
            "v": m.n_layer * cells * row_v,
            "cells": cells,
            "n_layer": m.n_layer,
            "row_bytes_k": row_k,
            "row_bytes_v": row_v,
        }
        out.update({k: v for k, v in self._kv_log.items() if k.startswith("log_")})
        return out

    def settings(self) -> dict:
        return {
            "type_k": self.type_k,
            "type_v": self.type_v,
            "flash_attn": self.flash_attn,
            "n_ctx": self.n_ctx,
            "n_ctx_requested": self.n_ctx_requested,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_batch,
            "n_threads": self.n_threads,
            "use_extra_bufts": False,
            "attn_rot_k": self._kv_log.get("attn_rot_k"),
            "attn_rot_v": self._kv_log.get("attn_rot_v"),
            ROT_DISABLE_ENV: self.rot_disable_env,
            "engine_version": version(),
        }

    def close(self) -> None:
        lib = _state.get("lib")
        if self._batch is not None and lib is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
        if self._handle is not None and lib is not None:
            lib.llama_free(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
