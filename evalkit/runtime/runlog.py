"""Where the libraries' chatter of the current run goes: a log file in the run's folder.

lm-eval logs warnings about task configs and draws a progress bar per request batch; over a sweep
that is hundreds of lines on the terminal. The sweep runner marks the run's artifacts folder
(``runs/<id16>/`` of the store) with :func:`run_folder` while the run executes (its evaluation's
preparation included); :func:`to_log` then sends, for the duration of one library call, that
library's log records and everything written to ``sys.stderr`` (progress bars, Python warnings)
or to the process's standard error itself (file descriptor 2: what a subprocess prints, such as
lm-eval's ``git describe`` outside a git checkout, ``fatal: not a git repository``) to a file in
that folder. ``evalkit run`` marks its ``--out`` folder, or a ``logs`` folder in its cache, the
same way. Both are context managers that restore what they changed; with no run folder marked
(notebooks, library use) nothing is redirected.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
from contextvars import ContextVar
from datetime import datetime, timezone
from pathlib import Path

_FOLDER: ContextVar[Path | None] = ContextVar("evalkit_run_folder", default=None)


@contextlib.contextmanager
def run_folder(folder: str | Path | None):
    """Inside the block, library calls that support it log into ``folder`` (None: to the terminal)."""
    token = _FOLDER.set(Path(folder) if folder is not None else None)
    try:
        yield
    finally:
        _FOLDER.reset(token)


def current_log(name: str) -> Path | None:
    """``<run folder>/<name>`` when a run folder is marked, else None."""
    folder = _FOLDER.get()
    return folder / name if folder is not None else None


def log_sizes(folder: str | Path) -> dict[Path, int]:
    """The size of every log in ``folder`` (to tell, after a command, which logs it wrote to)."""
    folder = Path(folder)
    return {p: p.stat().st_size for p in sorted(folder.glob("*.log"))} if folder.is_dir() else {}


def logs_written(folder: str | Path, before: dict[Path, int]) -> list[Path]:
    """The logs of ``folder`` that grew (or appeared) since ``before`` (:func:`log_sizes`)."""
    return [p for p, size in log_sizes(folder).items() if before.get(p) != size]


class _FinalLines(io.TextIOBase):
    """A text stream onto a file that keeps, of each line, only its last ``\\r``-separated state
    (a progress bar redrawn a hundred times becomes its one finished line) and drops blank lines
    and cursor movements."""

    def __init__(self, fh):
        self.fh = fh
        self.pending = ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            if _last_state(line):
                self.fh.write(_last_state(line) + "\n")
        return len(text)

    def flush(self) -> None:
        self.fh.flush()

    def finish(self) -> None:
        if _last_state(self.pending):
            self.fh.write(_last_state(self.pending) + "\n")
        self.pending = ""
        self.fh.flush()


_CURSOR = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # tqdm moves the cursor between nested bars


def _last_state(line: str) -> str:
    states = [s for s in _CURSOR.sub("", line).split("\r") if s.strip()]
    return states[-1].rstrip() if states else ""


@contextlib.contextmanager
def to_log(path: Path | None, loggers: tuple[str, ...], title: str = ""):
    """Send the named loggers (INFO and up) and ``sys.stderr`` to ``path`` (appended) inside the block.

    Their handlers, levels and propagation and ``sys.stderr`` are restored after, exception or not.
    ``path`` None: nothing changes."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        stream = _FinalLines(fh)
        stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
        fh.write(f"==== {stamp} {title}\n")
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(levelname)s [%(name)s] %(message)s"))
        saved = []
        for name in loggers:
            logger = logging.getLogger(name)
            saved.append((logger, logger.handlers[:], logger.level, logger.propagate))
            logger.handlers = [handler]
            logger.setLevel(logging.INFO)
            logger.propagate = False
        try:
            with contextlib.redirect_stderr(stream), _fd_to(fh, 2):
                yield
        finally:
            for logger, handlers, level, propagate in saved:
                logger.handlers = handlers
                logger.setLevel(level)
                logger.propagate = propagate
            stream.finish()


@contextlib.contextmanager
def _fd_to(fh, fd: int):
    """Inside the block, file descriptor ``fd`` writes to ``fh`` (opened for appending), so what
    subprocesses and C code print there lands in the log too; restored after, exception or not.
    Where the descriptor cannot be duplicated (no real file behind it) nothing changes."""
    try:
        sys.__stderr__ and sys.__stderr__.flush()
        fh.flush()
        saved = os.dup(fd)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        os.dup2(fh.fileno(), fd)
        yield
    finally:
        fh.flush()
        os.dup2(saved, fd)
        os.close(saved)
