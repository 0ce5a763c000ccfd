"""evalkit's data folders (tasks/, sweeps/, calibration/): from the checkout, or from the installed copy.

The end-to-end check (a built wheel in a fresh virtualenv outside the checkout running a quick
sweep, a retrieval run and an lm-eval run) is in .ci/run; these tests hold the lookup rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from evalkit.data import resources
from evalkit.data.resources import KINDS, resolve_calibration_file, resource_dir
from evalkit.errors import EvalkitError, ScaleError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """evalkit as if installed in site-packages: no checkout around it, data under evalkit/_data."""
    package = tmp_path / "site-packages" / "evalkit"
    for kind in KINDS:
        (package / "_data" / kind).mkdir(parents=True)
    (package / "_data" / "calibration" / "model-head-amax.safetensors").write_bytes(b"packaged")
    monkeypatch.setattr(resources, "_PACKAGE", package)
    return package


def test_checkout_folders_are_used_in_a_checkout():
    assert resources.source_root() == REPO
    for kind in KINDS:
        assert resource_dir(kind) == REPO / kind


def test_installed_copy_is_used_outside_a_checkout(installed):
    assert resources.source_root() is None
    for kind in KINDS:
        assert resource_dir(kind) == installed / "_data" / kind


def test_missing_packaged_folder_says_reinstall(installed):
    (installed / "_data" / "sweeps").rmdir()
    with pytest.raises(EvalkitError, match="sweeps/ folder is missing.*reinstall"):
        resource_dir("sweeps")


def test_calibration_file_current_folder_first(installed, tmp_path, monkeypatch):
    work = tmp_path / "work"
    (work / "calibration").mkdir(parents=True)
    (work / "calibration" / "model-head-amax.safetensors").write_bytes(b"mine")
    monkeypatch.chdir(work)
    found = resolve_calibration_file("calibration/model-head-amax.safetensors")
    assert found.read_bytes() == b"mine"


def test_calibration_file_falls_back_to_the_packaged_folder(installed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("calibration/model-head-amax.safetensors", "model-head-amax.safetensors"):
        assert resolve_calibration_file(name) == installed / "_data" / "calibration" / "model-head-amax.safetensors"
    absolute = tmp_path / "elsewhere.safetensors"
    assert resolve_calibration_file(str(absolute)) == absolute  # absolute paths are the caller's to check


def test_missing_calibration_file_is_one_line(installed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScaleError, match="nope.safetensors is in neither the current folder nor .*calibrate") as info:
        resolve_calibration_file("calibration/nope.safetensors")
    assert "\n" not in str(info.value)


def test_shipped_scale_tables_resolve_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = resolve_calibration_file("calibration/smollm2-135m-head-amax.safetensors")
    assert found == REPO / "calibration" / "smollm2-135m-head-amax.safetensors"
