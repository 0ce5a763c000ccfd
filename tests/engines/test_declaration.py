"""One engine declaration (evalkit.engines.declaration): each engine's folder declares its devices, versions with
their kv_cache_dtypes and schemes, profiles and codec-family prefix; one validator reads it; nothing outside an
engine's folder tests a scheme string's prefix; a test-only engine (tests/toy_engine.py) that declares its dtypes
in one file shows up in `schemes`, `capacity`, the report's "runs on" column and pre-flight."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from evalkit.cli import main
from evalkit.engines import registry
from evalkit.engines.declaration import cache_type, declared_schemes, version_of
from evalkit.engines.registry import PROFILES, get_profile
from evalkit.errors import SchemeError
from evalkit.kv.codec import families
from evalkit.kv.scheme import parse_scheme

from tests.cli_checks import one_line_exit_2

PACKAGE = Path(__file__).resolve().parents[2] / "evalkit"


@pytest.fixture
def toy_engine():
    from tests.toy_engine import registered

    with registered() as engine:
        yield engine


def _model(device="cpu", name="m"):
    return SimpleNamespace(device=device, name=name, device_map=None)


# -- the declarations ------------------------------------------------------------------------------------------
def test_every_declared_dtype_parses_to_its_scheme_and_every_family_has_its_engine():
    """Enumerated, not listed: every engine's every version's modelled dtype parses; every built-in codec family
    is some engine's, and every engine's family is registered."""
    declared = {e.codec_family: e.name for e in registry.in_order() if e.codec_family}
    assert {"vllm": "vllm", "llamacpp": "llamacpp"}.items() <= declared.items()
    assert set(declared) <= set(families())
    for engine in registry.in_order():
        assert engine.devices, engine.name
        for v in engine.versions:
            assert set(v.devices) <= set(engine.devices), (engine.name, v.version)
            for d in v.kv_cache_dtypes:
                assert d.source, (engine.name, d.name)
                if d.modelled:
                    parse_scheme(d.scheme)
                else:
                    assert d.note, (engine.name, d.name)


def test_the_profiles_keep_their_names_order_and_schemes_and_live_in_their_engines_folders():
    assert list(PROFILES) == ["vllm-cpu", "vllm-cuda", "vllm-rocm", "sglang", "tensorrt-llm"]
    assert get_profile("vllm-cpu") is registry.get_engine("vllm").profiles[0]
    assert registry.engine_of_profile("sglang").name == "sglang"
    assert registry.engine_of_profile("tensorrt-llm").name == "tensorrt_llm"
    assert str(get_profile("vllm-cpu").scheme_for("fp8")) == "fp8_e4m3/tensor/unit+recipe=vllm_cpu+rounding=rtz"
    constructed = [
        n
        for n in ast.walk(ast.parse((PACKAGE / "engines" / "profiles.py").read_text()))
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "EngineProfile"
    ]
    assert not constructed, "engines/profiles.py declares no engine's facts: they live in the engine's folder"
    assert {"sglang", "tensorrt_llm"} <= set(registry.engines())  # declared, modelled, not run:
    assert {"emulation", "llamacpp", "vllm"} <= set(registry.choices()) and "sglang" not in registry.choices()


def test_the_validator_reads_devices_and_dtypes_from_the_declaration():
    vllm, llamacpp = registry.get_engine("vllm"), registry.get_engine("llamacpp")
    plan = llamacpp.hook("plan")([parse_scheme("auto")], [_model("cuda:0")], None, {})
    assert ("models", 0) in [k for k, _ in plan.problems]
    assert any("engine llamacpp runs on cpu, not cuda:0: run m on device cpu" in m for _, m in plan.problems)
    assert [m for _, m in vllm.hook("plan")([parse_scheme("auto")], [_model("xpu")], None, {}).problems][0].startswith(
        "engine vllm runs on cuda or cpu, not xpu"
    )
    assert version_of(vllm).version == "0.34" and version_of(vllm, "0.32.0").version == "0.32"
    assert version_of(vllm, "0.34").names() == version_of(vllm, "0.33").names()  # 0.34's CacheDType is 0.33's
    v032, v033 = version_of(vllm, "0.32").names(), version_of(vllm, "0.33").names()
    assert len(v032) == 19 and len(v033) == 22 and set(v033) - set(v032) == {
        "octave_k3v4", "octave_k3v3", "octave_k3v3_compact"
    }  # fmt: skip
    with pytest.raises(SchemeError, match="declares versions 0.34, 0.33, 0.32, not 0.31"):
        version_of(vllm, "0.31")
    assert cache_type(vllm, "int8_per_token_head").scheme == "vllm:int8_per_token_head"
    assert cache_type(vllm, "octave_k3v4").scheme == "vllm:octave_k3v4" and cache_type(vllm, "octave_k3v4", "0.33")
    with pytest.raises(SchemeError, match="0.32 has no kv_cache_dtype octave_k3v4"):
        cache_type(vllm, "octave_k3v4", "0.32")
    assert vllm.cache_type(parse_scheme("vllm:int8_per_token_head+skip=0")) == "int8_per_token_head"
    assert (
        vllm.cache_type(parse_scheme("llamacpp:q8_0")) is None
        and vllm.cache_type(parse_scheme("fp8_e4m3/tensor/unit")) is None
    )
    assert registry.engine_of_scheme(parse_scheme("llamacpp:q8_0/q4_0")) is llamacpp
    assert registry.engine_of_scheme(parse_scheme("fp8_e4m3/tensor/unit")) is None


def test_sglang_0_5_23_declares_its_eight_dtypes_and_refuses_fp4_e2m1_in_one_line(capsys):
    sglang = registry.get_engine("sglang")
    v = version_of(sglang)
    assert v.version == "0.5.23" and set(v.names()) == {
        "auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"
    }  # fmt: skip
    assert {d.name for d in v.kv_cache_dtypes if not d.modelled} == {"nvfp4"}
    assert declared_schemes(sglang)["sglang_fp4"] == "fp4_mx_block16"
    with pytest.raises(SchemeError, match="sglang 0.5.23 has no kv_cache_dtype fp4_e2m1: it takes fp4_mx_block16"):
        cache_type(sglang, "fp4_e2m1")
    assert main(["schemes", "--engine-profile", "sglang"]) == 0
    out = capsys.readouterr().out
    assert "fp4_mx_block16   sglang_fp4" in out and "fp4_e2m1         not taken by SGLang 0.5.23" in out
    assert "mxfp8            sglang:mxfp8" in out and "nvfp4            not modelled" in out
    assert "arg_groups/fields/model.py" in out and "mxfp8_quant.py:98-163" in out
    assert main(["schemes", "--engine", "sglang", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    assert [r["kv_cache_dtype"] for r in table["dtypes"]] == list(v.names())
    assert table["renamed"] == {"fp4_e2m1": "fp4_mx_block16"}
    assert all(r["source"] for r in table["dtypes"])
    one_line_exit_2(["schemes", "--engine", "sglang", "--engine-version", "0.4"], capsys, "declares versions 0.5.23")
    one_line_exit_2(
        ["run", "--engine", "sglang", "--schemes", "auto"], capsys, "does not run it", "--engine-profile sglang"
    )


# -- no prefix tests outside an engine's folder ------------------------------------------------------------------
def _engine_folder(path: Path) -> bool:
    """Inside evalkit/engines/<name>/ or its codec family's evalkit/kv/codecs/<name>/."""
    rel = path.relative_to(PACKAGE).parts
    return len(rel) > 2 and (rel[0] == "engines" or rel[:2] == ("kv", "codecs"))


SPLITS = ("split", "rsplit", "partition", "rpartition")


def _cuts_a_scheme(node) -> bool:
    """``<x>.split(":")`` (or rsplit/partition/rpartition) where ``<x>`` reads a scheme (its source names one:
    ``scheme``, ``str(s.scheme)``, ``family.scheme_name(s)``): a scheme string cut at its family prefix."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SPLITS):
        return False
    if not (node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value == ":"):
        return False
    return "scheme" in ast.unparse(node.func.value).lower()


def _family_identity(node) -> bool:
    """``family is VLLM_FAMILY`` / ``== LLAMACPP_FAMILY``: one engine's codec family picked out by name."""
    if not isinstance(node, ast.Compare):
        return False
    names = [node.left, *node.comparators]
    return any(isinstance(n, ast.Name) and n.id.endswith("_FAMILY") and n.id != "FAMILY" for n in names)


def prefix_tests(source: str, prefixes) -> list[str]:
    """Lines that test a scheme string's family prefix: a ``"<prefix>:"`` constant outside an f-string (as
    ``startswith``, ``removeprefix``, ``in`` or slicing use it), a ``startswith``/``removeprefix`` argument that
    begins with one, a scheme string cut at ``":"`` (split/partition), or a codec family compared with one
    engine's family constant."""
    heads = tuple(f"{p}:" for p in prefixes)
    tree = ast.parse(source)
    in_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in in_fstring:
            if node.value in heads:
                found.append(f"line {node.lineno}: {node.value!r}")
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("startswith", "removeprefix"):
            for arg in node.args:
                values = arg.elts if isinstance(arg, ast.Tuple) else [arg]
                if any(isinstance(v, ast.Constant) and str(v.value).startswith(heads) for v in values):
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if _cuts_a_scheme(node) or _family_identity(node):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return sorted(set(found))


def test_the_prefix_finder_finds_prefix_tests():
    prefixes = ["vllm", "llamacpp"]
    assert prefix_tests('x.startswith("vllm:")', prefixes) and prefix_tests('s.removeprefix("llamacpp:q")', prefixes)
    assert prefix_tests('HEAD = "vllm:"', prefixes) and prefix_tests('x.startswith(("a", "llamacpp:"))', prefixes)
    assert not prefix_tests('f"vllm:{name}"', prefixes) and not prefix_tests('"vllm:<dtype> names a cache"', prefixes)
    assert prefix_tests('family.scheme_name(s).partition(":")[2]', prefixes)  # a scheme cut at its prefix
    assert prefix_tests('str(run.scheme).split(":")[0] in families()', prefixes)
    assert prefix_tests("x if family is VLLM_FAMILY else None", prefixes)
    assert not prefix_tests('path.partition(":")', prefixes) and not prefix_tests('scheme.split("/")', prefixes)
    assert not prefix_tests("FAMILY = register_family(VllmFamily())", prefixes)


def test_no_module_outside_an_engines_folder_tests_a_scheme_prefix():
    prefixes = list(families())
    found = {
        str(path.relative_to(PACKAGE)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if not _engine_folder(path)
        for hits in [prefix_tests(path.read_text(), prefixes)]
        if hits
    }
    assert not found, f"ask the engine registry (engine_of_scheme, Engine.cache_type), not a prefix: {found}"


# -- a test-only engine shows up everywhere, from its one file ---------------------------------------------------
def test_the_toy_engine_declares_its_dtypes_and_the_validator_reads_them(toy_engine):
    schemes = [parse_scheme(t) for t in ("toy:i8h", "int8/token/dynamic", "int4/token/dynamic")]
    plan = toy_engine.hook("plan")(schemes, [_model("cuda")], None, {})
    assert plan.schemes == schemes[:2]  # the plan speaks Scheme values: what it runs comes back as values
    messages = [m for _, m in plan.problems]
    assert messages[0] == "engine toy runs on cpu, not cuda: run m on device cpu"
    assert "engine toy cannot run int4/token/dynamic: its kv_cache_dtypes run auto (kv_cache_dtype auto)" in messages[1]
    assert registry.engine_of_scheme(parse_scheme("toy:i8h")) is toy_engine
    assert toy_engine.cache_type(parse_scheme("toy:i8h")) == "i8h"


def test_the_toy_engine_shows_up_in_schemes(toy_engine, capsys):
    capsys.readouterr()
    assert main(["schemes", "--engine", "toy", "--model", "llama-3.1-8b", "--json"]) == 0
    rows = {r["kv_cache_dtype"]: r for r in json.loads(capsys.readouterr().out)["dtypes"]}
    assert rows["i8h"]["scheme"] == "toy:i8h"
    assert rows["i8h"]["bytes_per_token"] == 32 * 8 * 2 * (128 + 2)  # layers x KV heads x (K, V) x (codes + f16)
    assert rows["int8"]["bytes_per_token"] == 32 * 8 * 2 * 128 + 32 * 8 * 2 * 4  # int8 codes + a float32 per token
    assert rows["int4"]["bytes_per_token"] is None and rows["int4"]["note"].startswith("not modelled")
    assert main(["schemes", "--engine-profile", "toy-cpu"]) == 0
    assert "fp8_e4m3         fp8_e4m3/tensor/unit+rounding=rtz" in capsys.readouterr().out


def test_the_toy_engine_shows_up_in_capacity(toy_engine, capsys):
    capsys.readouterr()
    assert main(["capacity", "--engine", "toy", "--preset", "llama-3.1-8b"]) == 0
    head, _, table = capsys.readouterr().out.partition("\n")
    assert head == (
        "engine toy 1.0 (counted from its declaration): auto = auto, fp8 = fp8_e4m3/tensor/dynamic, "
        "int8 = int8/token/dynamic, i8h = toy:i8h"
    )
    row = next(line for line in table.splitlines() if line.startswith("| toy:i8h "))
    assert row.split("|")[2].strip() == f"{32 * 8 * 2 * (128 + 2):,}"  # bytes per token: layers x heads x K,V x slot
    assert main(["capacity", "--engine", "toy", "--preset", "llama-3.1-8b", "--json"]) == 0
    assert {r["scheme"] for r in json.loads(capsys.readouterr().out)["rows"]} >= {"toy:i8h", "int8/token/dynamic"}
    one_line_exit_2(["capacity", "--engine", "toy", "--preset", "llama-3.1-8b", "--load"], capsys, "drop --load")


def test_the_toy_engine_shows_up_in_the_reports_runs_on_column(toy_engine):
    from evalkit.report import engine_fit

    assert engine_fit.runs_on("toy:i8h") == "toy"
    assert "toy-cpu" in engine_fit.runs_on("fp8_e4m3/tensor/unit+rounding=rtz").split(", ")  # as measured
    assert "~toy-cpu" in engine_fit.runs_on("fp8_e4m3/tensor/unit").split(", ")
    assert engine_fit.setting("toy-cpu", "fp8_e4m3/tensor/unit+rounding=rtz").startswith("kv_cache_dtype=fp8_e4m3")
    assert engine_fit.setting("toy-cpu", "toy:i8h") == "kv_cache_dtype=i8h"


def test_without_the_toy_engine_its_cache_type_is_hypothetical(toy_engine):
    from evalkit.report import engine_fit

    registry.unregister_engine("toy")
    assert engine_fit.runs_on("toy:i8h") == engine_fit.HYPOTHETICAL
    assert "toy-cpu" not in PROFILES
    registry.register_engine(toy_engine)


def test_the_toy_engine_shows_up_in_pre_flight(toy_engine, tiny_llama_dir, tmp_path, capsys):
    argv = ["run", "--model", str(tiny_llama_dir), "--cache-dir", str(tmp_path), "--eval", "perplexity"]
    one_line_exit_2(
        [*argv, "--engine", "toy", "--schemes", "int4/token/dynamic"],
        capsys,
        "engine toy cannot run int4/token/dynamic",
        "toy:i8h (kv_cache_dtype i8h)",
    )
    one_line_exit_2(
        [*argv, "--engine-profile", "toy-cpu", "--schemes", "fp8_e4m3/head/dynamic"], capsys, "toy-cpu cannot run"
    )
