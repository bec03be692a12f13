"""Start-up time of the command line: ``attnscale --version``, ``attnscale --help`` and
``attnscale train --help``, beside ``python -c pass`` (the interpreter's own start, the floor).

Usage::

    .venv/bin/python benchmarks/cli_startup.py --out benchmarks/recorded/cli_startup_2core.json
    # and the same commands from another source tree (e.g. the last commit, for a before/after):
    git archive HEAD src | tar -x -C /tmp/before
    .venv/bin/python benchmarks/cli_startup.py --baseline-src /tmp/before/src --out ...

Each repeat runs every command once, in an order shuffled per repeat (interleaved: a load
spike hits all commands alike, not one), after one untimed warm-up round (the page cache).
Reported per command: the median wall time of ``--repeats`` (20) runs with a 95% interval
from order statistics (distribution-free: the ranks j and k with P(X_(j) <= median <= X_(k))
>= 0.95 under Binomial(n, 1/2)), min and max. The commands run as a user runs them: the
installed console script, output to /dev/null, ``COLUMNS=100``. The load average before and
after is recorded: the figures mean little unless the machine was quiet (``uptime``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from attnscale.util.provenance import git_revision, machine, versions

ARGS = {"--version": ["--version"], "--help": ["--help"], "train --help": ["train", "--help"]}
# Another source tree's CLI, run the way the console script runs the installed one
FROM_SOURCE = "import sys; sys.path.insert(0, {src!r}); from attnscale.cli import main; main()"


def commands(baseline_src: str | None, train_help: bool) -> dict[str, list[str]]:
    """Label -> command line: the floor, the installed CLI, and the baseline tree's if given."""
    script = shutil.which("attnscale", path=str(Path(sys.executable).parent))
    if script is None:
        raise SystemExit("no attnscale console script beside this Python: pip install -e .")
    out = {"python -c pass": [sys.executable, "-c", "pass"]}
    for label, args in ARGS.items():
        if label == "train --help" and not train_help:
            continue
        out[f"attnscale {label}"] = [script, *args]
        if baseline_src is not None:
            code = FROM_SOURCE.format(src=str(Path(baseline_src).resolve()))
            out[f"baseline {label}"] = [sys.executable, "-c", code, *args]
    return out


def time_once(cmd: list[str]) -> float:
    """Wall seconds of one run of ``cmd``; it must exit 0."""
    env = {**os.environ, "COLUMNS": "100"}
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                          timeout=300)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{cmd} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed


def median_interval(n: int, level: float = 0.95) -> tuple[int, int]:
    """0-based ranks (j, k) of the sorted sample with P(x[j] <= median <= x[k]) >= ``level``:
    the narrowest symmetric pair under Binomial(n, 1/2) (needs n >= 6 for 95%)."""
    cdf = [sum(math.comb(n, i) for i in range(m + 1)) / 2**n for m in range(n + 1)]
    best = (0, n - 1)
    for j in range(n // 2):  # coverage of ranks (j, n-1-j): P(j + 1 <= B <= n - 1 - j)
        if cdf[n - 1 - j] - cdf[j] >= level:
            best = (j, n - 1 - j)
    return best


def summary(samples: list[float], level: float = 0.95) -> dict[str, float | list[float]]:
    """Median, its order-statistic interval, min, max and the samples (seconds)."""
    ordered = sorted(samples)
    j, k = median_interval(len(ordered), level)
    return {"median_s": statistics.median(ordered), "ci95_lo_s": ordered[j],
            "ci95_hi_s": ordered[k], "min_s": ordered[0], "max_s": ordered[-1],
            "samples_s": samples}


def measure(cmds: dict[str, list[str]], repeats: int, seed: int) -> dict[str, dict]:
    """Every command ``repeats`` times, interleaved in a shuffled order, after a warm-up."""
    rng = random.Random(seed)
    for cmd in cmds.values():
        time_once(cmd)  # warm-up: page cache, .pyc files
    samples: dict[str, list[float]] = {label: [] for label in cmds}
    for _ in range(repeats):
        order = list(cmds)
        rng.shuffle(order)
        for label in order:
            samples[label].append(time_once(cmds[label]))
    return {label: summary(s) for label, s in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per command")
    parser.add_argument("--seed", type=int, default=0, help="seed of the run order")
    parser.add_argument("--baseline-src", help="also time the CLI of this source tree's src/")
    parser.add_argument("--no-train-help", action="store_true", help="skip train --help")
    parser.add_argument("--out", help="write the JSON record here (default: stdout only)")
    args = parser.parse_args()
    if args.repeats < 6:
        parser.error("--repeats must be at least 6 (a 95% interval of the median)")
    cmds = commands(args.baseline_src, not args.no_train_help)
    load_before = os.getloadavg()
    results = measure(cmds, args.repeats, args.seed)
    record = {
        "benchmark": "cli_startup",
        "config": {"repeats": args.repeats, "seed": args.seed, "warmup_rounds": 1,
                   "interval": "95% order-statistic interval of the median",
                   "commands": {label: cmd[1:] if cmd[0] == sys.executable else
                                ["attnscale", *cmd[1:]] for label, cmd in cmds.items()},
                   "baseline_src": args.baseline_src},
        "results": results,
        "load_before": load_before, "load_after": os.getloadavg(),
        "versions": versions(), "git_rev": git_revision(), "machine": machine(),
    }
    text = json.dumps(record, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    for label, r in results.items():
        print(f"{label:28s} median {r['median_s'] * 1e3:7.0f} ms  95% CI "
              f"[{r['ci95_lo_s'] * 1e3:.0f}, {r['ci95_hi_s'] * 1e3:.0f}] ms", file=sys.stderr)
    print(f"load {load_before[0]:.2f} -> {record['load_after'][0]:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
