"""The published table of vLLM's kv_cache_dtypes reproduces: the README's ``vllm-dtypes`` block is
`report` of the committed store ``published/vllm-dtypes``, the store is the grid ``sweeps/vllm-dtypes.yaml``
from this tree's code with nothing failed, and it holds every vLLM dtype that applies to the embedded
model. Re-running two of its perplexity runs gives the stored rows: that check shares the default store's
baseline (the same perplexity parameters), in ``tests/report/test_published.py``.

Made by ``python -m evalkit sweep vllm-dtypes --out published/vllm-dtypes`` and rendered by
``python -m evalkit report published/vllm-dtypes --format md`` (no vLLM needed for either).
"""

from __future__ import annotations

from pathlib import Path

from tests.doc_blocks import doc_block
from tests.report.test_published import check_store_is_its_grid, report_md, store_records

ROOT = Path(__file__).resolve().parents[2]
STORE = ROOT / "published" / "vllm-dtypes"
SPEC_KEYS = ("model", "scheme", "eval", "params")


def records() -> list[dict]:
    return store_records(STORE)


def test_readme_vllm_dtypes_block_is_the_report_of_the_committed_store():
    assert doc_block("vllm-dtypes").strip() == report_md(STORE), (
        "regenerate: python -m evalkit report published/vllm-dtypes --format md"
    )


def test_store_holds_the_grid_from_the_current_code():
    check_store_is_its_grid(STORE, "vllm-dtypes", SPEC_KEYS)


def test_every_applicable_vllm_dtype_is_in_the_store():
    """Every vLLM dtype evalkit models that applies to the embedded model's layout has rows in every eval."""
    from evalkit.errors import SchemeError
    from evalkit.kv.codecs.vllm.dtypes import VLLM_DTYPES, Status
    from evalkit.kv.codecs.vllm.family import vllm_scheme
    from evalkit.kv.memory import check_layout_scheme
    from evalkit.models.info import kv_layout
    from evalkit.models.presets import config_namespace, get_preset

    layout = kv_layout(config_namespace(get_preset("smollm2-135m")["config"]))
    applicable = set()
    for name, d in VLLM_DTYPES.items():
        if d.status is not Status.MODELLED or name in ("fp8", "fp8_e4m3", "fp8_e5m2"):
            continue  # the per-tensor three are the store's fp8_*/tensor/unit rows
        try:
            check_layout_scheme(vllm_scheme(name), layout)
        except SchemeError:
            continue  # the MLA rows
        applicable.add(f"vllm:{name}")
    metrics = [r for r in records() if r["type"] == "metric"]
    for ev in ("perplexity", "decode", "retrieval", "lmeval"):
        have = {r["scheme"] for r in metrics if r["eval"] == ev}
        assert applicable <= have, (ev, sorted(applicable - have))
    assert {"auto", "fp8_e4m3/tensor/unit", "fp8_e5m2/tensor/unit"} <= {r["scheme"] for r in metrics}
