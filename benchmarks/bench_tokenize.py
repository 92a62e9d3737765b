"""Token-shard build speed and determinism: `mhar.data.shards.build_shards` (the path training and the workflow's
`prepare_data` use) with 1, 2, ... worker processes, each build into a fresh cache folder.

    PYTHONPATH=. python -m benchmarks.bench_tokenize --corpus nltk_gutenberg \
        --tokenizer tokenizers/gpt2/tokenizer.json --workers 1 2 0 --repeats 3 --kill-at 0.5 \
        --out results/bench/tokenize.csv

`--workers 0` means every core this process may use. Repeats run the worker counts in rotated order
(so that a load change on a shared machine does not always hit the same count); every row carries
the 1-minute load average before its build, the speedup over the one-worker build of the same
repeat, and the sha256 of the shards (all must be equal). `--kill-at F` then starts a build in a
child process, SIGKILLs it once its recorded progress passes F of the corpus, resumes it here and
checks that the result equals the uninterrupted build byte for byte.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import add_out_args, command_line, existing_rows, write_csv
from mhar.data.corpus import resolve_corpus, resolve_data_dir
from mhar.data.shards import _available_cores, _corpus_chars, build_shards
from mhar.runs.provenance import git_info, hardware_info, package_versions
from mhar.data.config import DataConfig

_CHILD = """
import sys
from mhar.data.shards import build_shards
from mhar.data.config import DataConfig
cfg = DataConfig(corpus=sys.argv[1], tokenizer=sys.argv[2], cache_dir=sys.argv[3], seq_len=64)
build_shards(cfg, 1 << 20, workers=int(sys.argv[4]))
"""


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for name in ("train.bin", "val.bin"):
        h.update((path / name).read_bytes())
    return h.hexdigest()[:16]


def _columns(args) -> dict:
    hw, pk = hardware_info(), package_versions()
    try:
        import tokenizers  # lazy: only for its version column (optional)

        tok_version = tokenizers.__version__
    except ImportError:
        tok_version = ""
    return {"cpu": hw["cpu"], "cores": _available_cores(), "python": platform.python_version(),
            "tokenizers": tok_version, "numpy": pk.get("numpy", ""), "git_commit": git_info()["commit"],
            "command": command_line("benchmarks.bench_tokenize")}


def build_once(args, workers: int, cache: Path) -> dict:
    cfg = DataConfig(corpus=args.corpus, tokenizer=args.tokenizer, cache_dir=str(cache), seq_len=64)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    sh = build_shards(cfg, 1 << 20, log=lambda m: print(m, file=sys.stderr), workers=workers)
    wall = time.perf_counter() - t0
    tokens = sh.meta["train_tokens"] + sh.meta["val_tokens"]
    row = {"workers": sh.meta["workers"], "tokens": tokens, "wall_s": round(wall, 3),
           "tokens_per_s": round(tokens / wall), "load_1min_before": round(load, 2), "sha256": _digest(sh.path)}
    if sh.meta.get("resumed_after_tasks"):  # only the resumed part was tokenized here
        row.update(tokens_per_s=round(sh.meta["tokens_per_s"]), resumed_after_tasks=sh.meta["resumed_after_tasks"])
    return row


def kill_and_resume(args, workers: int, tmp: Path, reference: str) -> dict:
    """Kill a build once its recorded progress passes ``args.kill_at``; resume it; compare with ``reference``."""
    data_dir = resolve_data_dir(DataConfig(corpus=args.corpus))
    total = _corpus_chars(resolve_corpus(args.corpus, data_dir))
    cache = tmp / "killed"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, args.corpus, args.tokenizer, str(cache), str(workers)],
                             env=env)
    killed_at = None
    try:
        while child.poll() is None:
            for p in cache.glob(".*.partial/progress.json"):
                try:
                    prog = json.loads(p.read_text())["progress"]
                except (OSError, ValueError):
                    continue
                if total and prog["chars"] >= args.kill_at * total:
                    killed_at = prog["chars"] / total
                    child.send_signal(signal.SIGKILL)
            time.sleep(0.02)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    if killed_at is None:
        raise SystemExit(f"error: the build finished before {args.kill_at:.0%} of it was recorded; "
                         "nothing was killed (a larger corpus, or a later --kill-at)")
    row = build_once(args, workers, cache)
    row.update(mode=f"killed at {killed_at:.0%} + resumed", identical=row["sha256"] == reference)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="nltk_gutenberg")
    ap.add_argument("--tokenizer", default="tokenizers/gpt2/tokenizer.json",
                    help="a tokenizer spec of mhar.data.tokenizer (relative paths: under MHAR_DATA_DIR)")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 0], help="0: every available core")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kill-at", type=float, default=0.5, help="fraction; 0 skips the kill/resume check")
    add_out_args(ap, "results/bench/tokenize.csv")
    args = ap.parse_args(argv)
    keep = existing_rows(args.out, args.append)
    cols = _columns(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_tokenize-") as tmp:
        tmp = Path(tmp)
        for rep in range(args.repeats):
            order = args.workers[rep % len(args.workers):] + args.workers[:rep % len(args.workers)]
            by_workers = {}
            for w in order:
                row = build_once(args, w, tmp / f"r{rep}w{w}")
                row.update(mode="build", repeat=rep, requested_workers=w or "all")
                by_workers[w] = row
                rows.append(row)
                print(f"repeat {rep} workers {row['workers']}: {row['tokens_per_s'] / 1e6:.3f}M tokens/s "
                      f"({row['wall_s']} s, load {row['load_1min_before']})", file=sys.stderr)
            one = by_workers.get(1)
            for row in by_workers.values():
                row["speedup_vs_1"] = round(row["tokens_per_s"] / one["tokens_per_s"], 3) if one else ""
        reference = rows[0]["sha256"]
        for row in rows:
            row["identical"] = row["sha256"] == reference
        if args.kill_at > 0:
            rows.append({**kill_and_resume(args, max(args.workers), tmp, reference), "requested_workers":
                         max(args.workers) or "all"})
    rows = [{"corpus": args.corpus, "tokenizer": args.tokenizer, **r, **cols} for r in rows]
    for w in sorted({r["workers"] for r in rows if r["mode"] == "build"}):
        s = [r["speedup_vs_1"] for r in rows if r["mode"] == "build" and r["workers"] == w and r["speedup_vs_1"] != ""]
        t = [r["tokens_per_s"] for r in rows if r["mode"] == "build" and r["workers"] == w]
        print(f"workers {w}: {min(t) / 1e6:.3f}-{max(t) / 1e6:.3f}M tokens/s"
              + (f", speedup over 1 worker {min(s):.2f}-{max(s):.2f}x" if s else ""))
    print(f"all shards identical: {all(r['identical'] for r in rows)}")
    write_csv(args.out, rows, keep)
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
