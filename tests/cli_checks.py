"""The check every bad-input test shares: a command line refuses in one line on stderr, naming the
problem, with exit code 2 and no traceback."""

from __future__ import annotations

from evalkit.cli import main


def one_line_exit_2(argv: list[str], capsys, *needles: str) -> str:
    """Run ``evalkit argv``; assert exit 2 and one ``evalkit: error: ...`` line holding every needle."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("evalkit: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def problems_exit_2(argv: list[str], capsys, *needles: str, problems: int) -> list[str]:
    """Run ``evalkit argv``; assert exit 2 and a report of exactly ``problems`` lines, each an
    ``evalkit: error: ...`` line (the pre-flight names every problem of a command at once), that
    together hold every needle."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert err.endswith("\n") and len(lines) == problems, err
    assert all(line.startswith("evalkit: error: ") for line in lines), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    return lines
