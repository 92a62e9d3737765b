"""Turn a pilot's `pilot.csv` (benchmarks/pilot.py, written on the GPU machine) into rows of the committed
record `results/bench/pilot.csv`, with their provenance.

    python -m benchmarks.pilot_record --from FETCHED/pilot.csv --session "2026-12-05 H200 call 3" \
        [--out results/bench/pilot.csv]

Every row keeps the pilot's columns (command, versions, GPU, git commit, losses, tokens/s, projected
hours) and gains `session` (what the caller names: date, machine, call), `source` (the file it came
from and its sha256) and `gpu_info` (the pilot's gpu.txt next to it). The record only grows: rows of
earlier sessions are kept, and the same pilot rows (same source hash) are never added twice. Rows of
sizes the pilot skipped are kept (they say why); rows whose training failed are refused unless
`--keep-failed`.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import sys
from pathlib import Path

from benchmarks.common import write_csv

REQUIRED = ("size", "status", "utc")


def _error(msg: str) -> SystemExit:
    print(f"error: {msg}", file=sys.stderr)
    return SystemExit(2)


def read_pilot(path: Path) -> list[dict]:
    if not path.is_file():
        raise _error(f"--from {path}: no such file (the pilot's $OUT/pilot.csv, fetched from the GPU machine)")
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise _error(f"--from {path}: not a readable CSV ({e})") from None
    if not rows:
        raise _error(f"--from {path}: no rows")
    missing = [c for c in REQUIRED if c not in rows[0]]
    if missing:
        raise _error(f"--from {path}: not a pilot record (missing columns {', '.join(missing)})")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="src", required=True, help="the pilot's pilot.csv")
    ap.add_argument("--session", required=True, help='e.g. "2026-12-05 H200 call 3 (pilot)"')
    ap.add_argument("--out", default="results/bench/pilot.csv")
    ap.add_argument("--keep-failed", action="store_true", help="also record rows whose training failed")
    args = ap.parse_args(argv)
    src = Path(args.src)
    rows = read_pilot(src)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    out = Path(args.out)
    keep: list[dict] = []
    if out.exists():
        try:
            with out.open(newline="") as f:
                keep = list(csv.DictReader(f))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise _error(f"--out {out}: cannot read the existing record ({e}); fix or move it") from None
    if any(r.get("source_sha256") == digest for r in keep):
        raise _error(f"{src} (sha256 {digest}) is already in {out}; nothing added")
    bad = [r["size"] for r in rows if r["status"] != "ok" and not r["status"].startswith("skipped")]
    if bad and not args.keep_failed:
        raise _error(f"pilot rows of {', '.join(bad)} did not finish ({'; '.join(r['status'] for r in rows if r['size'] in bad)}); "
                     "look at pilot.log, or record them anyway with --keep-failed")
    gpu_txt = src.parent / "gpu.txt"
    gpu_info = " | ".join(gpu_txt.read_text().split("\n")).strip(" |") if gpu_txt.is_file() else ""
    new = [{"session": args.session, **r, "gpu_info": gpu_info, "source": str(src), "source_sha256": digest}
           for r in rows]
    write_csv(out, new, keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
