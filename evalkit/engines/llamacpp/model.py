"""One GGUF loaded by llama.cpp on the CPU: its shape, metadata, tokenizer, and the contexts made from it.

:meth:`LlamaCppModel.open` loads with ``use_extra_bufts=False``: the extra (AMX / repacked) weight buffers
crash ``llama_decode`` on AMX hosts and change the weight matmul path, so evalkit never uses them
(recorded in :meth:`LlamaCppModel.settings`). :meth:`LlamaCppModel.context` makes one llama.cpp context per
cache pair (:mod:`~evalkit.engines.llamacpp.context`), refusing a pair llama.cpp cannot hold in one line
before anything is built (:func:`~evalkit.engines.llamacpp.cache_types.check_cache_types`).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from evalkit.engines.llamacpp.cache_types import check_cache_types
from evalkit.engines.llamacpp.context import LlamaCppContext
from evalkit.engines.llamacpp.llama_log import LOG, error_text
from evalkit.engines.llamacpp.runtime import Closing, require, version
from evalkit.errors import EvalkitError


class LlamaCppModel(Closing):
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
        LOG.start()
        try:
            handle = lib.llama_model_load_from_file(str(path).encode(), params)
        finally:
            lines = LOG.stop()
        if not handle:
            raise EvalkitError(f"llama.cpp could not load {path.name}: {error_text(lines)}")
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
