"""The sweep's spec model: a model's settings (:class:`ModelSpec`), one frozen run (:class:`RunSpec`,
with its content-addressed run id: the SHA-256 of its canonical spec with the versions that decide its
numbers, :mod:`evalkit.sweep.run_versions`, the content of the local corpus files it reads, and of
the model's weights and the static scale table it reads, :mod:`evalkit.sweep.run_inputs`), and a
grid's runs (:class:`Grid`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any

from evalkit.sweep.run_versions import versions


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    dtype: str = "auto"
    device: str = "cpu"
    device_map: str | None = None
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    gpus: int = 0  # GPUs one run of this model needs (executor resources); 0 = derived from device
    decode_path: str = "auto"  # how decode steps run (evalkit.integration.static_decode): auto, eager, static, compiled

    @property
    def num_gpus(self) -> int:
        if self.gpus:
            return self.gpus
        return 1 if self.device.startswith("cuda") or self.device_map is not None else 0

    def canonical(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("gpus")  # resources do not change numbers
        if d["decode_path"] == "auto":  # auto is decided by the device, already in the spec
            d.pop("decode_path")
        return d

    @property
    def key(self) -> str:
        return canonical_json(self.canonical())


@dataclass(frozen=True)
class RunSpec:
    model: ModelSpec
    scheme: str  # canonical scheme string
    eval: str
    params_json: str  # canonical JSON of the eval's number-deciding parameters
    run_params_json: str = "{}"  # every parameter the eval gets (canonical ones plus e.g. output paths)
    engine: str = "emulation"  # who computes the numbers (evalkit.engines.registry); in the run id unless the emulation
    engine_options_json: str = "{}"  # the engine's scale-out options the grid sets; in the run id when any

    @classmethod
    def of(
        cls, model: ModelSpec, scheme, eval: str, params_json: str, run_params_json: str = "{}", **engine
    ) -> RunSpec:
        """The run of a :class:`~evalkit.kv.scheme.Scheme` value: its canonical string (what the run id
        hashes) is written here, once, from the value; :attr:`scheme_value` gives the value back."""
        return cls(model, str(scheme), eval, params_json, run_params_json, **engine)

    @cached_property
    def scheme_value(self):
        """The run's :class:`~evalkit.kv.scheme.Scheme` (parsed once from its canonical string)."""
        from evalkit.kv.scheme import parse_scheme

        return parse_scheme(self.scheme)

    @property
    def params(self) -> dict[str, Any]:
        return json.loads(self.run_params_json)

    def canonical(self) -> dict[str, Any]:
        spec = {
            "model": self.model.canonical(),
            "scheme": self.scheme,
            "eval": self.eval,
            "params": json.loads(self.params_json),
        }
        if self.engine == "emulation":
            return spec  # emulation run ids as before
        options = json.loads(self.engine_options_json)
        return {**spec, "engine": self.engine, **({"engine_options": options} if options else {})}

    @property
    def engine_options(self) -> dict[str, Any]:
        return json.loads(self.engine_options_json)

    @property
    def components(self) -> dict[str, int]:
        """The bumped numerics versions of this run's codec family (or format) and evaluation
        (:func:`evalkit.sweep.code_identity.components`): in its run id and its completion record."""
        from evalkit.models.decode_path import resolve_decode_path
        from evalkit.sweep.code_identity import components

        path = resolve_decode_path(self.model.decode_path, self.model.device)
        return components(self.scheme, self.eval, path)

    @property
    def run_id(self) -> str:
        from evalkit.data.corpus_check import input_hashes
        from evalkit.sweep.run_inputs import run_inputs

        inputs = input_hashes(json.loads(self.params_json))  # local corpus files by content
        ident = {
            "spec": self.canonical(),
            "versions": versions(self.engine, self.components),
            **({"inputs": inputs} if inputs else {}),
            **run_inputs(self.model.name, self.scheme, self.eval),  # weights, scale tables, task files
        }
        text = canonical_json(ident)
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def eval_key(self) -> str:
        """Runs sharing this key share one prepared evaluation (data, baseline) on a model."""
        return (
            self.eval
            + canonical_json(self.params)
            + ("" if self.engine == "emulation" else f" engine={self.engine} {self.engine_options_json}")
        )

    def label(self) -> str:
        return f"{self.model.name} {self.scheme} {self.eval}" + (
            "" if self.engine == "emulation" else f" ({self.engine})"
        )

    def to_dict(self) -> dict[str, Any]:
        d = {
            "model": asdict(self.model),
            "scheme": self.scheme,
            "eval": self.eval,
            "params": json.loads(self.params_json),
            "run_params": self.params,
        }
        if self.engine == "emulation":
            return d
        return {**d, "engine": self.engine, **({"engine_options": self.engine_options} if self.engine_options else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunSpec:
        return cls(
            ModelSpec(**d["model"]),
            d["scheme"],
            d["eval"],
            canonical_json(d["params"]),
            canonical_json(d.get("run_params", d["params"])),
            d.get("engine", "emulation"),
            canonical_json(d.get("engine_options", {})),
        )


@dataclass(frozen=True)
class Grid:
    name: str
    path: str
    runs: tuple[RunSpec, ...]
    out: str | None = None
    executor: str | None = None
    data: dict[str, Any] = field(default_factory=dict, compare=False)  # the parsed file, for the folder copy

    @property
    def identity(self) -> str:
        """Hash of what the grid asks for (its run specs), independent of comments, key order, --out,
        --shard and package versions (a new torch gives new run ids in the same folder, not a new grid)."""
        specs = sorted(canonical_json(r.canonical()) for r in self.runs)
        return hashlib.sha256(canonical_json(specs).encode()).hexdigest()
