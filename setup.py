"""Build glue: ship the top-level ``tasks/``, ``sweeps/`` and ``calibration/`` folders inside the wheel
(and the frozen texts of ``evalkit/data/texts/``, package data of ``evalkit.data``).

They stay at the top of the repository (users look there) and are mapped into the package as
``evalkit/_data/<kind>`` with setuptools' ``package_dir``, one data package per folder, so a
wheel, ``pip install .`` and ``pip install -e .`` all carry them and ``evalkit.data.resources`` finds
them outside the checkout. This file only computes that mapping (it needs a walk over the folders,
which pyproject.toml cannot express next to a package search); everything else is in pyproject.toml.
"""

import os

from setuptools import find_packages, setup

RESOURCE_KINDS = ("tasks", "sweeps", "calibration")


def data_packages() -> dict[str, str]:
    """``evalkit._data.<kind>[.<sub>]`` -> its folder in the checkout, for every folder under each kind."""
    mapping = {}
    for kind in RESOURCE_KINDS:
        for folder, dirs, _files in os.walk(kind):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
            mapping["evalkit._data." + folder.replace(os.sep, ".")] = folder.replace(os.sep, "/")
    return mapping


DATA = data_packages()
setup(
    packages=find_packages(include=["evalkit", "evalkit.*"]) + sorted(DATA),
    package_dir=DATA,
    # evalkit/data/texts/: the frozen corpus and calibration text (evalkit.data.frozen) and their NOTICE
    package_data={
        **{name: ["*"] for name in DATA},
        "evalkit.data": ["texts/*.json", "texts/NOTICE"],
        "evalkit.sweep": ["decode_costs.json"],  # the measured decode-step costs the dry run prices with
    },
    exclude_package_data={"": ["*.pyc"]},
)
