"""Agreement of the bounce reader with Sisimai on the shared bounce corpus: the
scoring that tests/unit/test_bounce_corpus.py asserts on and bench/bench_bounces.py prints.

    .venv/bin/python -m bench.bench_bounces [--corpus DIR] [--show-misses]

The corpus (``../shared/corpora/bounces`` from the project's root, or ``$SENDDOCK_BOUNCE_CORPUS``)
holds real bounce and complaint mail with the result Sisimai expects for each recipient
(``expected.json``; its README defines the classes). A recipient *agrees* when the reader
names it (or its DSN twin, ``alt_recipients``) with the same class: hard, soft (our
``soft`` and ``sender`` effects), complaint, ignore (nothing done, or ``ignore``);
a delay notice (``soft-delay``) agrees as a delay or as soft; an ``unknown`` row (a
flufl.bounce sample Sisimai does not decode) agrees when the recipient is named.
Printed: one row per family (Sisimai's module name) and the totals the targets are about.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from workers.after_acceptance.bounces import read_safely
from workers.after_acceptance.bounces import reasons as rs

ROOT = Path(__file__).resolve().parent.parent
_OURS = {rs.HARD: "hard", rs.SOFT: "soft", rs.SENDER: "soft", rs.DELAY: "soft-delay",
         rs.COMPLAINT: "complaint", rs.IGNORE: "ignore"}


UNDISCLOSED = "undisclosed-recipient-in-headers@libsisimai.org.invalid"


def corpus_dir() -> Path | None:
    """Where the corpus is: ``$SENDDOCK_BOUNCE_CORPUS``, ``<root>/../shared/corpora/bounces``
    (CI: a copy of shared/ beside the clone), or ``/work/shared/corpora/bounces``."""
    candidates = [os.environ.get("SENDDOCK_BOUNCE_CORPUS"),
                  str(ROOT.parent / "shared" / "corpora" / "bounces"),
                  "/work/shared/corpora/bounces"]
    for candidate in candidates:
        if candidate and (Path(candidate) / "expected.json").is_file():
            return Path(candidate)
    return None


@dataclass
class Family:
    messages: int = 0
    rows: int = 0
    agree: int = 0
    hard: int = 0
    hard_missed: int = 0
    wrongly_suppressed: int = 0
    complaints: int = 0
    complaints_missed: int = 0
    reason_same: int = 0
    exceptions: int = 0


@dataclass
class Result:
    families: dict[str, Family] = field(default_factory=lambda: defaultdict(Family))
    misses: list[str] = field(default_factory=list)
    seconds: float = 0.0
    message_ids: int = 0        # messages Sisimai found the original's Message-ID in
    message_ids_same: int = 0   # ... and the reader found the same

    def total(self) -> Family:
        out = Family()
        for fam in self.families.values():
            for name in vars(out):
                setattr(out, name, getattr(out, name) + getattr(fam, name))
        return out


def _agrees(expected: str, ours: str | None) -> bool:
    if expected == "unknown":
        return ours is not None and ours != "ignore"
    if expected == "ignore":
        return ours in (None, "ignore")
    if expected == "soft-delay":
        return ours in ("soft-delay", "soft", None, "ignore")
    return ours == expected


def evaluate(corpus: Path, only: str | None = None) -> Result:
    manifest = json.loads((corpus / "expected.json").read_text())
    result = Result()
    started = time.perf_counter()
    for message in manifest["messages"]:
        if only and only not in message["file"]:
            continue
        fam = result.families[message["mta"]]
        fam.messages += 1
        raw = (corpus / message["file"]).read_bytes()
        reading = read_safely(raw)
        if reading.crashed:
            fam.exceptions += 1
        expected_ids = {r["messageid"].strip("<>") for r in message["rows"]
                        if r.get("messageid")}
        if expected_ids:
            result.message_ids += 1
            result.message_ids_same += (reading.original_message_id or "").strip("<>") \
                in expected_ids
        ours: dict[str, tuple[str, str]] = {}
        ours_all = [(_OURS[f.effect], f.reason) for f in reading.failures]
        for failure in reading.failures:
            for name in (failure.recipient, failure.alt):
                if name:
                    ours.setdefault(name.lower(), (_OURS[failure.effect], failure.reason))
        for row in message["rows"]:
            expected = row["class"]
            names = [row["recipient"], *row.get("alt_recipients", [])]
            names = [n.lower() for n in names if n]
            # An encoded-word local part (=?utf-8?b?…?=) lower-cased by the corpus' builder
            # cannot be decoded back: compare our decoded address encoded the same way.
            for name, value in list(ours.items()):
                local, _, domain = name.rpartition("@")
                if not local.isascii():
                    b64 = base64.b64encode(local.encode()).decode().lower()
                    ours.setdefault(f"=?utf-8?b?{b64}?=@{domain}", value)
            got = next((ours[n] for n in names if n in ours), None)
            if names == [UNDISCLOSED]:  # Sisimai's name for "no recipient given"
                got = next((v for v in ours_all if v[0] == "complaint"), None)
            elif not names:   # not a bounce: nothing may be done at all
                got = next((v for v in ours_all if v[0] != "ignore"), None)
            mine = got[0] if got else None
            fam.rows += 1
            ok = _agrees(expected, mine)
            fam.agree += ok
            if got and got[1] == row["reason"]:
                fam.reason_same += 1
            if expected == "hard":
                fam.hard += 1
                fam.hard_missed += mine != "hard"
            elif mine == "hard" and expected != "unknown":
                fam.wrongly_suppressed += 1
            if expected == "complaint":
                fam.complaints += 1
                fam.complaints_missed += mine != "complaint"
            if not ok:
                result.misses.append(
                    f"{message['file']}: {row['recipient'] or '(none)'} expected {expected}"
                    f" ({row['reason']}) got {mine} ({got[1] if got else '-'})"
                    f" [ours: {sorted(ours)[:3]}]")
    result.seconds = time.perf_counter() - started
    return result


def pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f} %" if whole else "    -  "


def table(result: Result) -> str:
    lines = [f"{'family':<28} {'msgs':>5} {'rcpts':>5} {'agree':>8} {'reason':>8} "
             f"{'hard':>5} {'h.miss':>6} {'wrong.supp':>10} {'cmpl.miss':>9} {'exc':>4}"]

    def row(name: str, fam: Family) -> str:
        return (f"{name:<28} {fam.messages:>5} {fam.rows:>5} {pct(fam.agree, fam.rows):>8} "
                f"{pct(fam.reason_same, fam.rows):>8} {fam.hard:>5} {fam.hard_missed:>6} "
                f"{fam.wrongly_suppressed:>10} {fam.complaints_missed:>9} {fam.exceptions:>4}")

    for name in sorted(result.families):
        lines.append(row(name, result.families[name]))
    lines.append(row("TOTAL", result.total()))
    return "\n".join(lines)
