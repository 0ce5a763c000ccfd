"""Retrieval task definitions (declarative YAML under ``tasks/retrieval/``) and seeded needles.

A task file names the haystack kind (``filler``: RULER's repeated sentences, or ``corpus``: the
prose corpus), the instruction, the needle template, the question and the answer prefix, how keys
and values are drawn, and how many keys, values per key and queried keys one sample has::

    needle: "One of the special magic numbers for {key} is: {value}."
    key: words                          # 'none' (passkey) or adjective-noun pairs
    value: {kind: number, digits: 7}    # number | word (optional words: [...]) | uuid
    keys: 4, values_per_key: 1, queries: 1, scoring: exact   # RULER niah_multikey

:func:`draw_needles` turns a task and a seed into the sample's needles (one per key and value),
the question and answer prefix with the queried keys filled in, and the expected answers. It uses
only ``random.Random(seed)`` with a string seed (hashed by SHA-512 in CPython, so stable across
runs and machines): the same seed always gives the same keys, values and answers.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from evalkit.data.resources import resource_dir
from evalkit.errors import EvalkitError

TASK_DIR = resource_dir("tasks") / "retrieval"
DEFAULT_TASKS = (
    "passkey",
    "niah_single_number",
    "niah_single_word",
    "niah_single_uuid",
    "niah_multikey",
    "niah_multivalue",
    "niah_multiquery",
)
HAYSTACK_KINDS = ("filler", "corpus")
SCORINGS = ("exact", "recall")
VALUE_KINDS = ("number", "word", "uuid")

ADJECTIVES = (
    "amber",
    "ancient",
    "bitter",
    "brave",
    "bright",
    "calm",
    "clever",
    "cold",
    "crimson",
    "curious",
    "dark",
    "eager",
    "early",
    "fancy",
    "fierce",
    "gentle",
    "golden",
    "green",
    "happy",
    "hidden",
    "honest",
    "humble",
    "icy",
    "jolly",
    "kind",
    "lazy",
    "little",
    "lively",
    "loud",
    "lucky",
    "mighty",
    "modern",
    "narrow",
    "noble",
    "odd",
    "pale",
    "proud",
    "purple",
    "quick",
    "quiet",
    "rapid",
    "rare",
    "rough",
    "royal",
    "rusty",
    "shiny",
    "silent",
    "silver",
    "sleepy",
    "smooth",
    "solid",
    "sour",
    "steady",
    "stormy",
    "sunny",
    "swift",
    "tall",
    "tiny",
    "vivid",
    "wild",
)
NOUNS = (
    "anchor",
    "apple",
    "arrow",
    "badger",
    "banner",
    "basket",
    "beacon",
    "bridge",
    "candle",
    "canyon",
    "castle",
    "cedar",
    "comet",
    "copper",
    "coral",
    "falcon",
    "feather",
    "forest",
    "fountain",
    "garden",
    "glacier",
    "harbor",
    "helmet",
    "island",
    "jacket",
    "jungle",
    "kettle",
    "ladder",
    "lantern",
    "lemon",
    "meadow",
    "mirror",
    "monkey",
    "needle",
    "ocean",
    "orchard",
    "otter",
    "palace",
    "pepper",
    "pillow",
    "planet",
    "pocket",
    "rabbit",
    "river",
    "saddle",
    "shadow",
    "spider",
    "summit",
    "thunder",
    "tiger",
    "tower",
    "tulip",
    "valley",
    "violin",
    "wagon",
    "walnut",
    "window",
    "winter",
    "wizard",
    "zebra",
)
# answer words (niah_single_word) are kept apart from key words so a key never answers itself
WORDS = (
    "acrobat",
    "almanac",
    "avocado",
    "ballad",
    "biscuit",
    "blizzard",
    "bonfire",
    "cactus",
    "caravan",
    "carousel",
    "cathedral",
    "chimney",
    "compass",
    "cricket",
    "cucumber",
    "dolphin",
    "dragonfly",
    "eclipse",
    "elephant",
    "emerald",
    "fiddle",
    "flamingo",
    "galaxy",
    "giraffe",
    "gondola",
    "hammock",
    "harmonica",
    "hedgehog",
    "horizon",
    "iceberg",
    "igloo",
    "jasmine",
    "kangaroo",
    "lighthouse",
    "lobster",
    "magnet",
    "mandolin",
    "marble",
    "meteor",
    "mosaic",
    "nectar",
    "notebook",
    "octopus",
    "origami",
    "paddle",
    "parrot",
    "pelican",
    "penguin",
    "pyramid",
    "quartz",
    "raccoon",
    "rainbow",
    "sapphire",
    "scarecrow",
    "seahorse",
    "snowflake",
    "squirrel",
    "telescope",
    "tornado",
    "trumpet",
    "umbrella",
    "volcano",
    "waffle",
    "walrus",
    "whistle",
    "yogurt",
)


@dataclass(frozen=True)
class TaskSpec:
    name: str
    haystack: str
    intro: str
    needle: str
    question: str
    answer_prefix: str
    key: str
    value: dict
    keys: int = 1
    values_per_key: int = 1
    queries: int = 1
    scoring: str = "exact"
    description: str = ""
    source: str = ""

    def __post_init__(self):
        where = f"retrieval task {self.name!r} ({self.source})"
        if self.haystack not in HAYSTACK_KINDS:
            raise EvalkitError(f"{where}: haystack must be one of {', '.join(HAYSTACK_KINDS)}, got {self.haystack!r}")
        if self.scoring not in SCORINGS:
            raise EvalkitError(f"{where}: scoring must be one of {', '.join(SCORINGS)}, got {self.scoring!r}")
        if not isinstance(self.value, dict) or self.value.get("kind") not in VALUE_KINDS:
            raise EvalkitError(f"{where}: value kind must be one of {', '.join(VALUE_KINDS)}, got {self.value!r}")
        words = self.value.get("words")
        if words is not None and (
            not isinstance(words, list)
            or len(set(words)) < self.values_per_key * self.keys
            or not all(isinstance(w, str) and w.strip() for w in words)
        ):
            raise EvalkitError(
                f"{where}: value words must be a list of at least {self.values_per_key * self.keys} distinct words"
            )
        if self.key not in ("none", "words"):
            raise EvalkitError(f"{where}: key must be 'none' or 'words', got {self.key!r}")
        if not 1 <= self.queries <= self.keys or self.values_per_key < 1:
            raise EvalkitError(f"{where}: need 1 <= queries <= keys and values_per_key >= 1")
        if self.key == "none" and self.keys != 1:
            raise EvalkitError(f"{where}: a task without keys has exactly one needle key: set keys: 1")
        if "{value}" not in self.needle:
            raise EvalkitError(f"{where}: the needle template must contain {{value}}")
        if self.scoring == "exact" and (self.queries > 1 or self.values_per_key > 1):
            raise EvalkitError(f"{where}: several expected answers need scoring: recall")


def available_tasks(task_dir: Path = TASK_DIR) -> list[str]:
    return sorted(p.stem for p in Path(task_dir).glob("*.yaml"))


def load_task(name_or_path: str, task_dir: Path = TASK_DIR) -> TaskSpec:
    """A task by name (a file in ``tasks/retrieval/``) or by path to a YAML file."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = Path(task_dir) / f"{name_or_path}.yaml"
    if not path.is_file():
        raise EvalkitError(
            f"unknown retrieval task {name_or_path!r}: use one of {', '.join(available_tasks(task_dir))} "
            "or a path to a task .yaml file"
        )
    import yaml  # here: the task names and defaults (run --help) need no YAML parser

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise EvalkitError(f"retrieval task file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise EvalkitError(f"retrieval task file {path} must hold a mapping of fields")
    known = set(TaskSpec.__dataclass_fields__) - {"source"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise EvalkitError(
            f"retrieval task file {path} has unknown fields {', '.join(unknown)}: allowed are {', '.join(sorted(known))}"
        )
    try:
        return TaskSpec(**data, source=str(path))
    except TypeError as exc:
        raise EvalkitError(f"retrieval task file {path} is incomplete: {exc}") from None


@dataclass(frozen=True)
class Needles:
    """What one sample hides and asks: needle sentences (queried ones first) and expected answers."""

    needles: tuple[str, ...]  # needles[0] is the one placed at the cell's depth
    question: str
    answer_prefix: str
    answers: tuple[str, ...]
    keys: tuple[str, ...] = field(default=())


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _value(spec: dict, rng: random.Random, used: set[str]) -> str:
    for _ in range(1000):
        kind = spec["kind"]
        if kind == "number":
            digits = int(spec.get("digits", 7))
            v = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
        elif kind == "word":
            v = rng.choice(spec.get("words") or WORDS)
        else:
            v = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if v not in used:
            used.add(v)
            return v
    raise EvalkitError(f"cannot draw distinct values of kind {spec['kind']!r}: ask for fewer values per sample")


def draw_needles(task: TaskSpec, seed: str) -> Needles:
    """The needles, question and answers of one sample, a pure function of ``(task, seed)``."""
    rng = random.Random(seed)
    keys: list[str] = []
    if task.key == "words":
        while len(keys) < task.keys:
            k = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
            if k not in keys:
                keys.append(k)
    else:
        keys = [""]
    used: set[str] = set()
    pairs = [(k, _value(task.value, rng, used)) for k in keys for _ in range(task.values_per_key)]
    queried = keys[: task.queries]
    answers = tuple(v for k, v in pairs if k in queried)
    # needles of queried keys first (needles[0] goes to the depth), the rest shuffled after them
    first = [(k, v) for k, v in pairs if k in queried]
    rest = [(k, v) for k, v in pairs if k not in queried]
    tail = first[1:] + rest
    rng.shuffle(tail)
    ordered = [first[0]] + tail
    needles = tuple(task.needle.format(key=k, value=v) for k, v in ordered)
    joined = _join(queried) if task.key == "words" else ""
    return Needles(
        needles, task.question.format(key=joined), task.answer_prefix.format(key=joined), answers, tuple(keys)
    )
