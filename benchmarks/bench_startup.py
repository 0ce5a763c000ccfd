"""Start-up time of the light commands: `--help`, each command's `--help`, `schemes`, `models`, `capacity --preset`.

    python benchmarks/bench_startup.py            # min of 5 runs each
    python benchmarks/bench_startup.py --runs 10

Each command runs as its own ``python -m evalkit ...`` process (what a user waits for: the
interpreter, evalkit's imports and the command's work), from the repository root with stdout
discarded. The minimum over the runs is the figure that matters on this shared 2-core machine
(other processes only ever add time); the median is printed beside it, with the load average
before and after, so contention is visible. The targets: `--help` under 1.5 s, `run --help` under
0.5 s. The bare interpreter (`python -c pass`) is timed the same way first, as the floor no command
goes below: on a loaded machine read a command's figure against it. Which heavy libraries a command
imports is printed too: none of these may import transformers or lm-eval, and no `--help` torch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELPS = [[command, "--help"] for command in ("run", "sweep", "report", "capacity", "schemes")]
COMMANDS = [["--help"], *HELPS, ["schemes"], ["models"], ["capacity", "--preset", "llama-3.1-8b"]]
HEAVY = ("torch", "transformers", "lm_eval", "pandas", "scipy")


def seconds(argv: list[str], env: dict) -> float:
    """Wall seconds of ``python -m evalkit ARGV`` (``argv`` None: of the bare interpreter, ``python -c pass``)."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", "pass"] if argv is None else [sys.executable, "-m", "evalkit", *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"exit {proc.returncode}: {last}")
    return time.perf_counter() - start


def heavy_imports(argv: list[str], env: dict) -> list[str]:
    code = (
        "import contextlib, io, sys\nfrom evalkit.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    try:\n        main({argv!r})\n    except SystemExit:\n        pass\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return [m for m in out.stdout.strip().split(",") if m]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per command (default 5)")
    args = ap.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    print(
        f"python {sys.version.split()[0]}, {args.runs} runs each, load average before: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(f"{'command':<52}{'min s':>8}{'median s':>10}  imports")
    seconds(None, env)
    floor = [seconds(None, env) for _ in range(args.runs)]
    print(f"{'python -c pass (the floor)':<52}{min(floor):>8.2f}{statistics.median(floor):>10.2f}")
    for argv in COMMANDS:
        label = "python -m evalkit " + " ".join(argv)
        try:
            seconds(argv, env)  # warm the file cache
        except RuntimeError as exc:
            print(f"{label:<52}  failed, {exc}")
            continue
        times = [seconds(argv, env) for _ in range(args.runs)]
        heavy = ", ".join(heavy_imports(argv, env)) or "none of " + "/".join(HEAVY)
        print(f"{label:<52}{min(times):>8.2f}{statistics.median(times):>10.2f}  {heavy}")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
