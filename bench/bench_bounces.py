"""Agreement of the bounce reader with Sisimai on the shared bounce corpus: one row
per family (Sisimai's module name) and the totals the targets are about; the scoring is in
harness/bounce_corpus.py (the corpus test asserts on the same figures).

    .venv/bin/python -m bench.bench_bounces [--corpus DIR] [--only TEXT] [--show-misses]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.bounce_corpus import corpus_dir, evaluate, pct, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--only", default=None, help="only files whose path contains this")
    parser.add_argument("--show-misses", action="store_true")
    args = parser.parse_args(argv)
    corpus = args.corpus or corpus_dir()
    if corpus is None:
        print("bounce corpus not found: ../shared/corpora/bounces from the project's root "
              "(or set SENDDOCK_BOUNCE_CORPUS); nothing measured", file=sys.stderr)
        return 0
    result = evaluate(corpus, args.only)
    print(table(result))
    total = result.total()
    print(f"\nagreement {pct(total.agree, total.rows)} of {total.rows} recipients; hard missed "
          f"{total.hard_missed} of {total.hard}; suppressed though not hard "
          f"{total.wrongly_suppressed}; complaints missed {total.complaints_missed}; "
          f"exceptions {total.exceptions}; the original's Message-ID found in "
          f"{result.message_ids_same} of {result.message_ids}; {result.seconds:.2f} s for "
          f"{total.messages} messages")
    if args.show_misses:
        print("\n".join(result.misses))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
