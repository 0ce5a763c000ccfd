"""Sweep vs. hand-scripted runs: wall time (and CPU time) of one sweep against separate processes.

    python benchmarks/bench_sweep.py            # 8 schemes of the quick suite, both ways, ratio
    python benchmarks/bench_sweep.py --default  # also time the default sweep (sweeps/default.yaml)

A: one ``python -m evalkit sweep`` of the quick suite's models and evals with 8 schemes.
B: the same 8 schemes as 8 separate ``python -m evalkit run --eval E --schemes S`` invocations
per eval (what a user would script by hand; each process imports, loads the model, prepares the
eval and runs the baseline again; they share one cache folder as a user's runs would).
Both start from an empty cache folder. Wall time is what the target (A/B <= 0.5) is about; the
children's CPU time is printed too because this machine's 2 cores are shared and wall times are
noisy: the load average before and after is printed so contention is visible.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SCHEMES = [
    "bf16",
    "fp8_e4m3/tensor/dynamic",
    "fp8_e4m3/head/dynamic",
    "fp8_e4m3/block16/dynamic",
    "fp8_e4m3/tensor/unit",
    "fp8_e5m2/tensor/dynamic",
    "fp8_e5m2/head/dynamic",
    "fp8_e5m2/tensor/unit",
]


def run_flags(eval_name: str, params: dict) -> list[str]:
    """The `evalkit run` flags of a grid's eval parameters (each eval's own ``--<eval>-<field>``)."""
    from evalkit.evals import get_eval

    flag_of = get_eval(eval_name).Params.flag
    flags = []
    for key, value in params.items():
        flag = flag_of(key)
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    return flags


def timed(cmds: list[list[str]], env: dict) -> tuple[float, float]:
    """Wall seconds and children's CPU seconds of running ``cmds`` one after another."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    for cmd in cmds:
        subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--default", action="store_true", help="also time the default sweep")
    ap.add_argument("--skip-ratio", action="store_true", help="only the default sweep")
    args = ap.parse_args()
    quick = yaml.safe_load((REPO / "sweeps" / "quick.yaml").read_text())
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        py = sys.executable
        if not args.skip_ratio:
            grid = {"name": "bench8", "models": quick["models"], "schemes": SCHEMES, "evals": quick["evals"]}
            (tmp / "bench8.yaml").write_text(yaml.safe_dump(grid))
            sweep = [
                [
                    py,
                    "-m",
                    "evalkit",
                    "sweep",
                    str(tmp / "bench8.yaml"),
                    "--out",
                    str(tmp / "sweep"),
                    "--no-progress",
                    "--cache-dir",
                    str(tmp / "cache_a"),
                ]
            ]
            models = [m if isinstance(m, str) else m["name"] for m in quick["models"]]
            separate = [
                [
                    py,
                    "-m",
                    "evalkit",
                    "run",
                    "--model",
                    model,
                    "--eval",
                    name,
                    "--schemes",
                    scheme,
                    "--cache-dir",
                    str(tmp / "cache_b"),
                ]
                + run_flags(name, params or {})
                for model in models
                for name, params in quick["evals"].items()
                for scheme in SCHEMES
            ]
            wall_a, cpu_a = timed(sweep, env)
            print(f"load average between A and B: {os.getloadavg()[0]:.1f}")
            wall_b, cpu_b = timed(separate, env)
            print(
                f"A  one sweep, {len(SCHEMES)} schemes x {len(quick['evals'])} eval(s):  wall {wall_a:7.1f} s   cpu {cpu_a:7.1f} s"
            )
            print(
                f"B  {len(separate)} separate `evalkit run` processes:        wall {wall_b:7.1f} s   cpu {cpu_b:7.1f} s"
            )
            print(f"ratio A/B: wall {wall_a / wall_b:.2f} (target <= 0.5), cpu {cpu_a / cpu_b:.2f}")
        if args.default or args.skip_ratio:
            wall, cpu = timed(
                [
                    [
                        py,
                        "-m",
                        "evalkit",
                        "sweep",
                        "default",
                        "--out",
                        str(tmp / "default"),
                        "--no-progress",
                        "--cache-dir",
                        str(tmp / "cache_d"),
                    ]
                ],
                env,
            )
            print(f"default sweep: wall {wall:.0f} s ({wall / 60:.1f} min, target < 15 min), cpu {cpu:.0f} s")
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
