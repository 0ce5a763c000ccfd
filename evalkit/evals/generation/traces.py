"""An operator's own prompts as a generation workload: the JSONL file, checked line by line, and each
line's prompt as token ids.

One JSON object per line (blank lines skipped)::

    {"prompt": "Summarise this ticket: ...", "reference": "refund"}
    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}]}

* ``prompt`` (a string) or ``messages`` (a chat: a list of ``{"role", "content"}`` with roles system,
  user, assistant or tool, not ending with the assistant's turn), exactly one of them;
* ``reference`` (optional, a string or number): what a right answer contains. A generation is right
  when the reference occurs in it as a whole phrase: case and runs of whitespace ignored, not inside
  a longer word or number (``7`` is not found in ``17``);
* ``id`` (optional): the operator's own name for the line, kept with its results.

Any other field, or a malformed line, is refused in one line naming the file, the line number and
the problem, before a model loads. A ``prompt`` goes through the chat template as the user's turn when
the evaluation uses the template (and as plain text otherwise); ``messages`` need the template. The
evaluation's system prompt is added only to lines whose chat has no system turn of its own.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from evalkit.errors import EvalkitError

FIELDS = ("prompt", "messages", "reference", "id")
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Trace:
    """One line of a traces file: its 1-based line number, prompt or chat, optional reference and id."""

    line: int
    prompt: str | None = None
    messages: tuple[dict, ...] | None = None
    reference: str | None = None
    id: str | None = None

    def chat(self, system_prompt: str | None) -> list[dict]:
        """The line as chat messages, the evaluation's system prompt first where the chat has none."""
        messages = list(self.messages) if self.messages is not None else [{"role": "user", "content": self.prompt}]
        if system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": system_prompt})
        return messages


def _fail(path: Path, line: int, problem: str) -> EvalkitError:
    return EvalkitError(f"traces file {path} line {line}: {problem}")


def _message(path: Path, line: int, k: int, m) -> dict:
    if not isinstance(m, dict) or set(m) - {"role", "content"} or not {"role", "content"} <= set(m):
        raise _fail(path, line, f"messages[{k}] must be an object with exactly role and content")
    if m["role"] not in ROLES:
        raise _fail(path, line, f"messages[{k}] has role {m['role']!r}: use one of {', '.join(ROLES)}")
    if not isinstance(m["content"], str):
        raise _fail(path, line, f"messages[{k}] content must be a string")
    return {"role": m["role"], "content": m["content"]}


def parse_line(path: Path, line: int, text: str) -> Trace:
    """One non-blank line of a traces file as a :class:`Trace` (EvalkitError naming the problem)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(
            path, line, f"not valid JSON ({exc.msg} at column {exc.colno}): write one JSON object per line"
        ) from None
    if not isinstance(obj, dict):
        raise _fail(path, line, f"a JSON {type(obj).__name__}, not an object: write one JSON object per line")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise _fail(path, line, f"unknown field {', '.join(map(repr, unknown))}: use {', '.join(FIELDS)}")
    if ("prompt" in obj) == ("messages" in obj):
        raise _fail(path, line, "give exactly one of prompt (a string) or messages (a chat)")
    prompt, messages = obj.get("prompt"), obj.get("messages")
    if "prompt" in obj and (not isinstance(prompt, str) or not prompt.strip()):
        raise _fail(path, line, "prompt must be a non-empty string")
    if "messages" in obj:
        if not isinstance(messages, list) or not messages:
            raise _fail(path, line, "messages must be a non-empty list of {role, content} objects")
        messages = tuple(_message(path, line, k, m) for k, m in enumerate(messages))
        if messages[-1]["role"] == "assistant":
            raise _fail(path, line, "messages end with the assistant's turn: end with the turn to answer")
    reference = obj.get("reference")
    if reference is not None:
        if isinstance(reference, bool) or not isinstance(reference, (str, int, float)) or not str(reference).strip():
            raise _fail(path, line, "reference must be a non-empty string or a number")
        reference = str(reference)
    ident = obj.get("id")
    return Trace(line, prompt, messages, reference, None if ident is None else str(ident))


def read_traces(path: str | Path) -> list[Trace]:
    """Every line of a traces file, checked (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise EvalkitError(f"traces file {path} does not exist: pass a JSONL file of prompts")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalkitError(f"traces file {path} cannot be read as UTF-8 text ({exc}): pass a JSONL file") from None
    traces = [parse_line(path, i, line) for i, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not traces:
        raise EvalkitError(f"traces file {path} holds no prompts: one JSON object per line")
    return traces


def prompt_ids(trace: Trace, tokenizer, chat_template: bool, system_prompt: str | None) -> list[int]:
    """The token ids a server would feed for ``trace``: through the chat template with the generation
    prompt appended, or as plain text (the system prompt, a blank line, the prompt)."""
    if chat_template:
        text = tokenizer.apply_chat_template(trace.chat(system_prompt), add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if trace.messages is not None:
        raise EvalkitError(
            f"traces line {trace.line} is a chat (messages), which needs the chat template: keep chat_template on"
        )
    text = f"{system_prompt}\n\n{trace.prompt}" if system_prompt else trace.prompt
    return list(tokenizer(text)["input_ids"])


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def matches_reference(generated: str, reference: str) -> bool:
    """Whether ``reference`` occurs in ``generated`` as a whole phrase (case and whitespace runs ignored)."""
    pattern = rf"(?<![0-9a-z]){re.escape(_normal(reference))}(?![0-9a-z])"
    return re.search(pattern, _normal(generated)) is not None
