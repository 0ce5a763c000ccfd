"""llama.cpp's log, read back: one ggml log callback for the whole process, and what evalkit reads in it.

Why evalkit owns the callback: llama.cpp prints through ggml's logger, which is noisy in normal use and
is the only place some facts appear. :data:`LOG` drops INFO lines unless it is capturing; while a model or
a context is created (:meth:`Log.start` / :meth:`Log.stop`) it keeps every line, so the KV size line, the
Hadamard rotation flags (``attn_rot_k`` / ``attn_rot_v``; off when ``LLAMA_ATTN_ROT_DISABLE`` is set) and
llama.cpp's own error text can be read back (:func:`parse_kv_log`, :func:`error_text`).
"""

from __future__ import annotations

import collections
import ctypes
import re

# ggml_log_level as in the shipped ggml.h (NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5); llama-cpp-python's
# own logger comments an older numbering.
_LEVEL_WARN, _LEVEL_ERROR, _LEVEL_CONT = 3, 4, 5


class Log:
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


LOG = Log()


def error_text(lines) -> str:
    """llama.cpp's last error lines among ``lines`` (else the recent warnings and errors), in one line."""
    errors = [line.strip() for level, line in lines if level == _LEVEL_ERROR and line.strip()]
    errors = errors or list(LOG.recent)
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
