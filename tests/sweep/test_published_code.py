"""The published conformance report comes from the current code: its recorded code identity
(``evalkit conformance`` writes ``code``: :func:`evalkit.sweep.code_identity.code_record`) equals this
tree's. The default and engine stores are held to the same rule in tests/report/test_published.py and
tests/report/test_published_engine.py (``test_store_rows_come_from_the_current_code``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalkit.sweep.code_identity import code_identity

PUBLISHED = Path(__file__).resolve().parents[2] / "published"
REMAKE = {"conformance": "", "conformance-bf16": " --dtype bfloat16"}  # store -> its command's extra flags


@pytest.mark.parametrize("name", REMAKE)
def test_conformance_report_comes_from_the_current_code(name):
    report = json.loads((PUBLISHED / name / "conformance.json").read_text())
    recorded = (report.get("code") or {}).get("identity", "not recorded")
    assert recorded == code_identity(), (
        f"published/{name} was computed by code {recorded}, this tree is {code_identity()}: re-make it in the "
        f"vLLM environment (python -m evalkit conformance --engine vllm{REMAKE[name]} --out published/{name})"
    )
