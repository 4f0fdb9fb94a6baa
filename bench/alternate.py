"""Before and after, side by side: run one benchmark against an earlier commit and against
this checkout, alternating, and print every run's table rows side by side with the
machine's speed measured just before it (a 10,000,000-iteration loop) and the load.

    python -m bench.alternate --before 378e962 --column msgs/s -- \
        bench_drain --recipients 20000 --sink postfix
    python -m bench.alternate --before 05a3048 --rounds 2 -- \
        bench_drain --recipients 100000 --sink postfix --serve

The earlier commit is checked out into a temporary git worktree (removed afterwards) and
its own copy of the benchmark runs there, with its own code and migrations, on the same
interpreter, database server and sink. Machines of this kind differ in speed by up to 3x
and a shared one drifts within minutes (docs/performance.md): only runs alternated like
this compare two trees.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, save, table


def loop_seconds() -> float:
    """The machine's speed now: seconds for a 10,000,000-iteration Python loop."""
    started = time.perf_counter()
    for _ in range(10_000_000):
        pass
    return time.perf_counter() - started


def rows_of(output: str) -> list[list[str]]:
    """The data rows of the markdown tables a benchmark printed (no header, no rule)."""
    lines = [line for line in output.splitlines() if line.startswith("|")]
    rows, header_next = [], True
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            header_next = False
            continue
        if header_next:
            continue
        rows.append(cells)
    return rows


def run(tree: Path, bench: list[str]) -> tuple[float, float, str]:
    """One run of the benchmark in ``tree``: the loop's seconds before it, the load, and
    what it printed."""
    loop = loop_seconds()
    load = os.getloadavg()[0]
    done = subprocess.run([sys.executable, "-m", f"bench.{bench[0]}", *bench[1:]], cwd=tree,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{bench[0]} failed in {tree}:\n{done.stdout}\n{done.stderr}")
    return loop, load, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the earlier commit (any git revision)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--column", default=None,
                        help="a column whose median per tree to print at the end (by its "
                             "header, e.g. 'msgs/s')")
    parser.add_argument("bench", nargs=argparse.REMAINDER,
                        help="-- then the benchmark module's name and its arguments")
    args = parser.parse_args()
    bench = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    if not bench:
        parser.error("name the benchmark after --, e.g. -- bench_drain --recipients 20000")
    revision = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="senddock-before-") as tmp:
        before = Path(tmp) / revision
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(before), revision],
                       cwd=ROOT, check=True)
        try:
            trees = [(f"before ({revision})", before), ("this checkout", ROOT)]
            rows: list[list[object]] = []
            header: str | None = None
            results: list[dict[str, Any]] = []
            for round_ in range(1, args.rounds + 1):
                for label, tree in trees:
                    loop, load, output = run(tree, bench)
                    header = header or next((line for line in output.splitlines()
                                             if line.startswith("|")), None)
                    for nth, cells in enumerate(rows_of(output)):
                        rows.append([round_, label, f"{loop:.2f}", f"{load:.1f}", *cells])
                        results.append({"round": round_, "tree": label, "row": nth,
                                        "loop_s": loop, "load": load, "cells": cells})
                    print(f"round {round_}, {label}: done (loop {loop:.2f} s, load {load:.1f})",
                          file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT,
                           check=False)
    columns = [c.strip() for c in (header or "").strip("|").split("|")] if header else []
    print(table(f"{' '.join(bench)}: {revision} and this checkout, alternated "
                f"({args.rounds} rounds; loop = seconds for 10M iterations before each run)",
                ["round", "tree", "loop s", "load", *columns], rows))
    if args.column and args.column in columns:
        at = columns.index(args.column)
        for nth in sorted({r["row"] for r in results}):
            for label, _ in trees:
                runs = [r for r in results if r["tree"] == label and r["row"] == nth]
                values = [float(r["cells"][at].replace(",", "")) for r in runs
                          if at < len(r["cells"])]
                if values:
                    name = " ".join(runs[0]["cells"][:2])
                    print(f"{name}, {label}: median {args.column} "
                          f"{statistics.median(values):,.2f} "
                          f"({', '.join(f'{v:,.2f}' for v in values)})")
    print(f"\nsaved {save('alternate', {'before': revision, 'bench': bench, 'runs': results})}")


if __name__ == "__main__":
    main()
