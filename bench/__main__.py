"""Run every benchmark in turn (``python -m bench``; ``--quick`` for small sizes).

Each prints its table and saves JSON under bench/results/. The full run takes about
45 minutes on the 2-core machine of docs/performance.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

FULL = [
    ["bench.bench_drain", "--recipients", "100000", "--sink", "both"],
    ["bench.bench_drain", "--recipients", "100000", "--sink", "postfix", "--serve"],
    ["bench.profile_drain", "--recipients", "30000"],
    ["bench.bench_procrastinate", "--recipients", "30000"],
    ["bench.bench_enqueue", "--sizes", "100000,1000000"],
    ["bench.bench_segment_enqueue", "--sizes", "1000000"],
    ["bench.bench_p7_latency"],
    ["bench.bench_million"],
    ["bench.bench_marketer_pages"],
    ["bench.bench_admin_pages"],
    ["bench.bench_drain", "--recipients", "100000", "--sink", "postfix", "--processes", "2"],
    ["bench.bench_drain", "--recipients", "100000", "--sink", "postfix", "--processes", "3"],
    ["bench.bench_dkim", "--messages", "3000"],
    ["bench.bench_drain", "--recipients", "100000", "--sink", "postfix", "--dkim", "rsa"],
    ["bench.bench_job_moves", "--jobs", "2000", "--rounds", "3", "--cancel", "20000"],
    ["bench.bench_bounces"],
    ["bench.bench_import_check", "--mib", "50"],
]

QUICK = [
    ["bench.bench_drain", "--recipients", "10000", "--sink", "both"],
    ["bench.bench_drain", "--recipients", "5000", "--sink", "postfix", "--serve"],
    ["bench.profile_drain", "--recipients", "8000", "--seconds", "3"],
    ["bench.bench_procrastinate", "--recipients", "3000"],
    ["bench.bench_enqueue", "--sizes", "20000"],
    ["bench.bench_segment_enqueue", "--sizes", "20000"],
    ["bench.bench_p7_latency", "--recipients", "20000", "--verifications", "10"],
    ["bench.bench_million", "--recipients", "20000"],
    ["bench.bench_marketer_pages", "--rows", "20000", "--repeat", "5"],
    ["bench.bench_admin_pages", "--rows", "20000", "--repeat", "5"],
    ["bench.bench_dkim", "--messages", "500", "--dkimpy-messages", "50"],
    ["bench.bench_job_moves", "--jobs", "500", "--rounds", "2", "--cancel", "5000"],
    ["bench.bench_bounces"],
    ["bench.bench_import_check", "--mib", "5"],
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    args = parser.parse_args()
    failed = 0
    for command in QUICK if args.quick else FULL:
        print(f"\n$ python -m {' '.join(command)}", flush=True)
        failed += subprocess.run([sys.executable, "-m", *command]).returncode != 0
    print(f"\n{failed} benchmark(s) failed" if failed else "\nall benchmarks ran")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
