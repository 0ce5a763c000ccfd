"""YAML with line numbers: plain Python values built from a YAML file's nodes, with the line of every
key path (:class:`Located`), so a grid's problems read ``FILE:LINE: KEY: what is wrong``; every problem
is collected (:class:`GridError` lists them all, one line each).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import yaml

from evalkit.errors import EvalkitError


class GridError(EvalkitError):
    """A grid file that cannot be used (reported with file, line and key); ``problems`` lists every
    problem found, one line each (the message is the first, plus how many more there are)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        problems = list(problems or [message])
        if len(problems) > 1:
            message = (
                f"{problems[0]} (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''} in the grid)"
            )
        super().__init__(message)
        self.problems = [str(EvalkitError(p)) for p in problems]


# -- YAML with marks ---------------------------------------------------------------------------
class Located:
    """Plain Python values built from YAML nodes, with the line of every key path; or, from
    :meth:`given`, a grid description that no file holds (``evalkit run``'s flags), whose problems are
    their message alone."""

    def __init__(self, path: Path, text: str):
        self.file: str | None = str(path)
        self.lines: dict[tuple, int] = {}
        self.problems: list[str] = []  # every problem found so far, one line each
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            self.value = self._build(loader, node, ()) if node is not None else None
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            line = mark.line + 1 if mark else 0
            raise GridError(f"{self.file}:{line}: malformed YAML: {exc.problem or exc.context}") from None
        except yaml.YAMLError as exc:
            raise GridError(f"{self.file}: malformed YAML: {exc}") from None
        finally:
            loader.dispose()

    def _build(self, loader, node, path: tuple):
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            loader.flatten_mapping(node)
            out: dict[str, Any] = {}
            for knode, vnode in node.value:
                key = loader.construct_object(knode, deep=True)
                if not isinstance(key, str):
                    self.problems.append(
                        f"{self.file}:{knode.start_mark.line + 1}: {self.where(path)}: keys must be names, got {key!r}"
                    )
                    continue
                if key in out:
                    self.problems.append(
                        f"{self.file}:{knode.start_mark.line + 1}: {self.where(path + (key,))}: duplicate key"
                    )
                    continue
                out[key] = self._build(loader, vnode, path + (key,))
                self.lines[path + (key,)] = knode.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self._build(loader, v, path + (i,)) for i, v in enumerate(node.value)]
        return loader.construct_object(node, deep=True)

    @classmethod
    def given(cls, value) -> Located:
        """A description built in code (the same keys a grid file holds): no file, no lines; a problem is
        its message alone (the command line names its own flags)."""
        doc = cls.__new__(cls)
        doc.file, doc.lines, doc.problems, doc.value = None, {}, [], value
        return doc

    @staticmethod
    def where(path: tuple) -> str:
        text = ""
        for p in path:
            text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else p)
        return text or "(top level)"

    def error(self, path: tuple, message: str) -> GridError:
        if self.file is None:
            return GridError(message)
        line = self.lines.get(path)
        while line is None and path:
            path = path[:-1]
            line = self.lines.get(path)
        return GridError(f"{self.file}:{line or 1}: {self.where(path)}: {message}")

    @contextlib.contextmanager
    def collecting(self):
        """Record a GridError raised inside the block and go on after it (one problem per block)."""
        try:
            yield
        except GridError as exc:
            self.problems.extend(exc.problems)

    def raise_problems(self) -> None:
        if self.problems:
            raise GridError(self.problems[0], self.problems)
