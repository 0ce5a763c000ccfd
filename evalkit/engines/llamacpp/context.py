"""One llama.cpp context (one sequence) with a fixed KV cache pair: what evalkit reads out of llama.cpp.

* :meth:`LlamaCppContext.logits`: full-vocabulary logits of a window, decoded from an empty cache;
* :meth:`LlamaCppContext.generate`: greedy generation, one token per ``llama_decode`` after the prompt, with
  an optional stop hook (a function of the tokens so far) called after each token;
* :meth:`LlamaCppContext.step_logits`: teacher-forced one-token decode steps through the cache;
* :meth:`LlamaCppContext.kv_bytes`: the KV allocation two ways, computed ``n_layer * cells *
  ggml_row_size(type, n_head_kv * head_dim)`` and as llama.cpp itself logs it.

Flash attention is set explicitly on or off, never "auto". llama.cpp rounds the context up to a multiple
of :data:`N_CTX_PAD` cells; ``LlamaCppContext.n_ctx`` is the padded value llama.cpp reports. The model it
is made from is a :class:`~evalkit.engines.llamacpp.model.LlamaCppModel` (which makes it, so this module does
not import it).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from evalkit.engines.llamacpp.cache_types import CACHE_TYPES, row_size
from evalkit.engines.llamacpp.llama_log import LOG, error_text, parse_kv_log
from evalkit.engines.llamacpp.runtime import Closing, loaded, require, version
from evalkit.errors import EvalkitError

N_CTX_PAD = 256  # llama.cpp rounds n_ctx up to a multiple of this many cells
ROT_DISABLE_ENV = "LLAMA_ATTN_ROT_DISABLE"


class LlamaCppContext(Closing):
    """One llama.cpp context (one sequence) with a fixed cache pair; see the module docstring."""

    def __init__(self, model, type_k, type_v, flash_attn, n_ctx, n_batch, n_threads):
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
        LOG.start()
        try:
            handle = lib.llama_init_from_model(model._handle, params)
        finally:
            lines = LOG.stop()
        if not handle:
            raise EvalkitError(
                f"llama.cpp could not create a context (K {type_k}, V {type_v}, flash_attn={flash_attn}, "
                f"n_ctx={n_ctx}): {error_text(lines)}"
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
                    f"llama_decode failed (code {rc}) at position {pos0 + start}: {error_text([])}; "
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
        lib = loaded()
        if self._batch is not None and lib is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
        if self._handle is not None and lib is not None:
            lib.llama_free(self._handle)
            self._handle = None
