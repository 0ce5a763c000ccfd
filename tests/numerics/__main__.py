"""``python -m tests.numerics [--write]``: the ``PINNED`` (and ``END_TO_END``) entries of every numerics
fingerprint for the current NUMERICS_VERSION, printed, or with ``--write`` put into each file (an
entry for the current version replaced), after a deliberate change and a bumped NUMERICS_VERSION."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.numerics.exact import pin_entry, prepare_process, write_entry


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.numerics", description=__doc__)
    parser.add_argument("--write", action="store_true", help="write the entries into the test files")
    args = parser.parse_args()
    prepare_process()
    from tests.numerics import test_codec_fingerprint, test_evaluation_fingerprint, test_storage_fingerprint

    evaluation = test_evaluation_fingerprint
    with tempfile.TemporaryDirectory() as folder:
        pins = [
            (test_codec_fingerprint, "PINNED", test_codec_fingerprint.fingerprints()),
            (test_storage_fingerprint, "PINNED", test_storage_fingerprint.fingerprints()),
            (evaluation, "PINNED", evaluation.fingerprints()),
            (evaluation, "END_TO_END", evaluation.end_to_end(Path(folder))),
        ]
    for module, name, got in pins:
        if args.write:
            write_entry(module.__file__, name, got)
            print(f"wrote {name} of {Path(module.__file__).name}")
        else:
            print(f"{Path(module.__file__).name}, {name} entry:\n{pin_entry(got)}\n")


main()
