"""The notebooks execute headless on a results store, reading only the store.

On the published store every notebook runs through the command a user types, ``jupyter nbconvert
--to notebook --execute``, from the repository root and from ``notebooks/`` (a relative STORE
resolves through :func:`evalkit.data.resources.results_folder`, not the kernel's folder); on the
others through nbclient (nbconvert's engine) with parameters injected. Three stores: the
SYNTHETIC one of test_report (every view has data: positions, retrieval,
sensitivity, lm-eval), a real one written by `evalkit sweep` on the tiny random llama, and the
published default sweep (``published/default``). The notebooks are committed executed against
the published store, so a reader sees the analysis without running anything; re-executing them
must reproduce the committed text outputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="the notebook tests need the test extras: pip install -e '.[test]'")
pytest.importorskip("nbclient", reason="the notebook tests need the test extras: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"

pytestmark = pytest.mark.slow


def execute(name: str, cwd: Path = ROOT, **params) -> nbformat.NotebookNode:
    """Run a notebook headless with its kernel started in ``cwd``: the repository root, or
    ``notebooks/`` (where `jupyter nbconvert --execute` and Jupyter itself start it)."""
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source += "\n# injected by the test\n" + "\n".join(f"{k} = {v!r}" for k, v in params.items())
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def text_of(nb) -> str:
    parts = []
    for c in nb.cells:
        for out in c.get("outputs", []):
            parts.append(out.get("text", ""))
            parts.extend(str(v) for k, v in out.get("data", {}).items() if k.startswith("text/"))
    return "\n".join(parts)


def images(nb) -> int:
    return sum("image/png" in out.get("data", {}) for c in nb.cells for out in c.get("outputs", []))


def text_outputs(nb) -> list[str]:
    """Each code cell's text outputs (tables, printed lines), without images or execution counts."""
    out = []
    for c in nb.cells:
        if c.cell_type == "code":
            parts = []
            for o in c.get("outputs", []):
                data = o.get("data", {})
                parts.append(
                    o.get("text", "") + "".join(data[k] for k in sorted(data) if k in ("text/plain", "text/markdown"))
                )
            out.append("\n".join(parts))
    return out


NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


def test_every_notebook_is_tested():
    assert NAMES == ["analysis.ipynb", "capacity.ipynb"]


@pytest.mark.parametrize("where", ["root", "notebooks"])
@pytest.mark.parametrize("name", NAMES)
def test_committed_notebooks_reproduce_on_the_published_store(name, where, tmp_path):
    """`jupyter nbconvert --to notebook --execute notebooks/X.ipynb` from the repository root, and
    `... --execute X.ipynb` from notebooks/, the command a user types (it once failed from the root
    with 'results folder published/default does not exist'), executes every cell without an error,
    and the text outputs are the committed ones."""
    import subprocess
    import sys

    pytest.importorskip("nbconvert", reason="jupyter nbconvert is in the test extras: pip install -e '.[test]'")
    committed = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(c.get("execution_count") for c in committed.cells if c.cell_type == "code"), (
        "commit the notebook executed"
    )
    assert any("parameters" in c.metadata.get("tags", []) for c in committed.cells)
    cwd, path = (ROOT, f"notebooks/{name}") if where == "root" else (NOTEBOOKS, name)
    out = tmp_path / name
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", path, "--output", str(out)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    executed = nbformat.read(out, as_version=4)
    assert not [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert text_outputs(executed) == text_outputs(committed)


def test_analysis_shows_every_figure_with_the_tables_labels():
    """The committed analysis notebook shows the table, then the two Pareto (|Δppl| and decode KL),
    positions, decode and two retrieval figures of the published store, drawn with the table's labels (the static schemes'
    numbers and their notes are the table's)."""
    committed = nbformat.read(NOTEBOOKS / "analysis.ipynb", as_version=4)
    assert images(committed) == 6
    text = text_of(committed)
    assert "fp8_e4m3/head/static[1]" in text and "[1] static scales from calibration/smollm2-135m-head-amax" in text


def test_results_folder_resolves_from_any_folder(tmp_path, monkeypatch):
    from evalkit.data.resources import results_folder
    from evalkit.errors import EvalkitError

    for cwd in (ROOT, NOTEBOOKS, tmp_path):
        monkeypatch.chdir(cwd)
        assert results_folder("published/default") == ROOT / "published" / "default"
    (tmp_path / "published" / "default").mkdir(parents=True)  # a folder of the user's own comes first
    assert results_folder("published/default") == (tmp_path / "published" / "default").resolve()
    with pytest.raises(EvalkitError, match="results folder published/missing is in neither"):
        results_folder("published/missing")


def test_analysis_on_synthetic_store(tmp_path):
    from tests.report.test_report import write_store

    store = write_store(tmp_path / "store")
    nb = execute("analysis.ipynb", STORE=str(store), PLOTS=str(tmp_path / "plots"))
    text = text_of(nb)
    assert "| fp8_e4m3/tensor/dynamic †  | 128 " in text and "+0.40% [+0.20, +0.60]" in text
    # the recommendation counts only what vllm-cuda (the default ENGINE_PROFILE) runs: of the store's schemes
    # E5M2 at scale 1.0 alone, which fails the budget; dynamic scales are hypothetical
    assert (
        "tiny: keep kv_cache_dtype=auto (the unquantized KV cache, in the model's dtype): no quantized scheme" in text
    )
    assert (
        "; assumes vllm-cuda;" in text
        and "closest: fp8_e5m2/tensor/unit (fails |Δppl| ≤ 1%: -2.00 [-2.20, -1.80]%" in text
    )
    assert "top-1" not in text.split("tiny: keep")[1].split("\n")[0]  # top-1 off, as in `evalkit report`
    assert images(nb) == 4  # pareto, positions, retrieval heatmap, sensitivity
    assert (tmp_path / "plots" / "pareto.svg").is_file()
    # with no engine assumed, the hypothetical per-tensor dynamic scheme is the cheapest inside the budget
    nb = execute("analysis.ipynb", STORE=str(store), PLOTS=str(tmp_path / "plots"), ENGINE_PROFILE="any")
    text = text_of(nb)
    assert "tiny: use fp8_e4m3/tensor/dynamic, 2.00x the KV capacity of a 16-bit cache (128 bytes/token)" in text
    assert "assumes no engine: hypothetical schemes included" in text


@pytest.fixture(scope="module")
def swept_store(tmp_path_factory, tiny_llama_dir):
    """A real store: `evalkit sweep` on the tiny random llama, perplexity, three schemes."""
    from evalkit.cli import main

    root = tmp_path_factory.mktemp("sweep")
    grid = root / "grid.yaml"
    grid.write_text(
        f"name: nbtest\nmodels:\n  - {tiny_llama_dir}\nschemes:\n  - auto\n  - fp8_e4m3/tensor/dynamic\n"
        "  - fp8_e4m3/head/dynamic\nevals:\n  perplexity: {window: 32, stride: 32, max_windows: 2, bootstrap_samples: 200}\n"
    )
    assert (
        main(["sweep", str(grid), "--out", str(root / "store"), "--no-progress", "--cache-dir", str(root / "cache")])
        == 0
    )
    return root / "store"


def test_notebooks_on_a_swept_store(swept_store):
    from evalkit.report import load_store, summary_frame

    frame = summary_frame(load_store(swept_store)).set_index("scheme")
    assert list(frame.index) == ["auto", "fp8_e4m3/head/dynamic", "fp8_e4m3/tensor/dynamic"]
    assert frame.loc["fp8_e4m3/tensor/dynamic", "capacity_x"] == 2.0
    nb = execute("analysis.ipynb", STORE=str(swept_store))
    assert "fp8_e4m3/head/dynamic" in text_of(nb) and images(nb) >= 2  # pareto and positions
    nb = execute(
        "capacity.ipynb", STORE=str(swept_store), PRESET="kimi-k2", GPU_MEMORY="80GB", GPUS=16, WEIGHTS="1.03TB"
    )
    text = text_of(nb)
    assert "35,136" in text and "70,272" in text  # Kimi K2: FP8 and BF16 bytes per token
    assert "left out: fp8_e4m3/head/dynamic" in text  # per-head scales mean nothing for an MLA latent
    assert images(nb) == 1
