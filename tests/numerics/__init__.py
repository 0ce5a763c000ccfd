"""Numerics fingerprints: fixed computations whose outputs are pinned per ``NUMERICS_VERSION``.

A run id holds the code to its numbers through :data:`evalkit.sweep.code_identity.NUMERICS_VERSION`,
an integer bumped by hand. These tests are what hold the code to that integer: each file runs one
part of evalkit on fixed inputs and compares what comes out with the values pinned for the current
version, so that any change to a number fails here until the version is bumped and the pins re-made.

* ``test_codec_fingerprint``: every quantizing format x granularity x scale source x scale dtype x
  rounding that parses, the named schemes, every modelled ``vllm:`` dtype, every ``llamacpp:`` pair
  and the DeepSeek MLA rows: codes, scales, stored bytes, dequantized values (exact hashes);
* ``test_storage_fingerprint``: the storage caches (dynamic and static) fed fixed K/V through
  ``cache.update``: what attention reads back and what is stored (exact hashes);
* ``test_evaluation_fingerprint``: the statistics and metric functions on fixed inputs (hashes of
  values rounded to 12 significant digits) and perplexity and decode end to end on a tiny float64
  model (values within 1e-6 of each metric's scale).

The pins are meant to hold on any processor. What was checked, on one x86-64 machine (AVX-512): the
pins made there hold unchanged under torch's ``ATEN_CPU_CAPABILITY=default``, ``avx2`` and
``avx512``, MKL's ``MKL_CBWR`` branches ``COMPATIBLE``, ``AVX2`` and ``AUTO``, and numpy without its
SIMD extensions (``NPY_DISABLE_CPU_FEATURES``); not on another architecture (ARM) or a GPU.

Re-pinning, after a deliberate change: bump ``NUMERICS_VERSION``, then from the repository root
``python -m tests.numerics --write`` puts every file's new entries in place (without ``--write`` it
prints them; ``python -m tests.numerics.<module>`` prints one file's).
"""
