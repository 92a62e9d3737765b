"""Token shards: every document tokenized once, followed by the end-of-text id, into ``train.bin`` / ``val.bin``
under ``<cache_dir>/<key>/`` (key = hash of corpus fingerprint + tokenizer + split rule; :func:`build_shards`).

Tokenization runs in parallel worker processes (``MHAR_TOKENIZE_WORKERS``, default all cores), gives the same
bytes for any worker count, resumes after a kill (``.<name>.partial`` next to the cache, one builder at a time
through a file lock), and prints progress lines in tokens/s. Corpora: :mod:`mhar.data.corpus`; packing and the
batch order: :mod:`mhar.data.batches`.
"""
from __future__ import annotations

import collections
import ctypes
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np

from mhar import env
from mhar.data.corpus import (Corpus, DataError, FileCorpus, SyntheticCorpus, file_digest, resolve_corpus,
                              resolve_data_dir, split_stream, val_documents)
from mhar.data.tokenizer import ByteTokenizer, Tokenizer, get_tokenizer
from mhar.atomic import atomic_write_text
from mhar.data.config import DataConfig

__all__ = ["Shards", "build_shards", "SHARD_FORMAT"]

SHARD_FORMAT = "mhar-shards-v1"
VAL_TOKEN_CAP = 16_000_000  # the val shard keeps at most this many tokens


# --- shards ---------------------------------------------------------------------------------------
def _token_dtype(vocab: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab <= 2**16 else np.dtype(np.uint32)


def _tokenizer_fingerprint(tok: Tokenizer, spec: str) -> dict:
    fp = {"spec": spec, "vocab_size": tok.vocab_size, "eot_id": tok.eot_id}
    if getattr(tok, "bos_id", None) is not None:  # documents carry the tokenizer's template (e.g. a BOS)
        fp["bos_id"] = tok.bos_id
    p = Path(spec)
    if p.is_dir():
        p = p / "tokenizer.json"
    if p.is_file():
        fp["file"] = file_digest(p)
    return fp


class _ShardWriter:
    """Append token ids to a flat binary file, with an optional token cap; reopens a partial file at
    ``n`` tokens (a resumed build: anything written after the last recorded progress is cut off)."""

    def __init__(self, path: Path, dtype: np.dtype, cap: Optional[int], n: int = 0, docs: int = 0):
        mode = "r+b" if n and path.is_file() else "wb"
        self.f = open(path, mode)
        self.f.truncate(n * dtype.itemsize)
        self.f.seek(n * dtype.itemsize)
        self.dtype, self.cap, self.n, self.docs = dtype, cap, n, docs
        self._buf: list[np.ndarray] = []
        self._buffered = 0

    @property
    def full(self) -> bool:
        return self.cap is not None and self.n >= self.cap

    def add(self, ids: np.ndarray, new_doc: bool = True) -> None:
        if self.full:
            return
        if self.cap is not None:
            ids = ids[: self.cap - self.n]
        self._buf.append(ids.astype(self.dtype, copy=False))
        self.n += len(ids)
        self.docs += int(new_doc)
        self._buffered += len(ids)
        if self._buffered >= 1 << 20:
            self.flush()

    def flush(self, sync: bool = False) -> None:
        if self._buf:
            np.concatenate(self._buf).tofile(self.f)
        self._buf, self._buffered = [], 0
        if sync:
            self.f.flush()
            os.fsync(self.f.fileno())

    def close(self) -> None:
        self.flush(sync=True)
        self.f.close()


def _encode(tok: Tokenizer, text: str) -> np.ndarray:
    """One whole document as the shards hold it: the tokenizer's own template (as evaluation encodes:
    a Llama-3 tokenizer prepends its BOS), then the end-of-text id. The reference of :class:`_Encoder`."""
    if isinstance(tok, ByteTokenizer):
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    else:
        ids = np.asarray(tok.encode(text, add_special_tokens=True), dtype=np.int64)
    return np.append(ids, tok.eot_id)


# --- tokenization: in parallel over document pieces, deterministic, resumable ---------------------
# Work is cut into tasks of about TASK_CHARS characters of consecutive documents, independent of the
# number of workers; documents longer than PIECE_CHARS are cut into pieces at points where the
# tokenizer provably cannot merge across (below), so one long book does not serialize the build.
# Tasks are tokenized by worker processes and written strictly in order: the shards are byte for
# byte those of encoding every whole document with `_encode`, whatever the worker count.
PIECE_CHARS = 1 << 16
TASK_CHARS = 1 << 18  # ~64K tokens: enough tasks to keep many workers busy on a small corpus
PROGRESS_EVERY_S = 10.0  # progress line (tokens/s) at most this often
COMMIT_EVERY_S = 0.5  # a killed build loses at most about this much work (plus one task per worker)
_CUT = re.compile(r"(?<=\S)\n(?=\S)")  # a newline between two non-space characters
_CUT_WINDOW = 256  # characters on either side of a cut checked with the tokenizer's pre-tokenizer


def _fast_backend(tok: Tokenizer):
    """The ``tokenizers.Tokenizer`` behind ``tok`` (tokenizer.json or a fast transformers tokenizer), else None."""
    backend = getattr(tok, "_tok", None)
    if backend is None:
        return None
    if getattr(tok, "_is_fast_lib", False):
        return backend
    return getattr(backend, "backend_tokenizer", None)


class _Encoder:
    """Document pieces -> token ids; the concatenation over a document's pieces equals ``_encode(doc)``.

    Cutting is only done where it cannot change the result: at a newline between two non-space
    characters, for a tokenizer without normalizer whose pre-tokenizer puts a word boundary there
    (checked on the text around every cut: pre-tokenizing both sides apart gives the same pieces as
    together; BPE / WordPiece / Unigram never merge across pre-token boundaries), and only when its
    special-token template is a fixed prefix / suffix around the text. Otherwise documents are
    encoded whole (still in parallel over documents).
    """

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        self.byte = isinstance(tok, ByteTokenizer)
        self.eot = np.asarray([tok.eot_id], dtype=np.int64)
        self.prefix = self.suffix = np.zeros(0, dtype=np.int64)
        self.pre = None  # the pre-tokenizer that decides cuts (None: byte tokenizer, or no cutting)
        self.cuttable = self.byte
        backend = None if self.byte else _fast_backend(tok)
        if backend is not None and backend.normalizer is None and backend.pre_tokenizer is not None:
            probe = "Probe text,\nsecond line."
            full, plain = tok.encode(probe, add_special_tokens=True), tok.encode(probe, add_special_tokens=False)
            for i in range(len(full) - len(plain) + 1):
                if plain and full[i:i + len(plain)] == plain:
                    self.prefix = np.asarray(full[:i], dtype=np.int64)
                    self.suffix = np.asarray(full[i + len(plain):], dtype=np.int64)
                    self.pre, self.cuttable = backend.pre_tokenizer, True
                    break
            if any("\n" in t.content for t in backend.get_added_tokens_decoder().values()):
                self.cuttable = False  # an added token spanning a newline could straddle a cut
            probe = "A line of text.\nThe next line."
            if self.cuttable and not self.cut_ok(probe, probe.index("\n") + 1):
                self.cuttable = False  # e.g. a prefix space added to every input (Metaspace): never cut

    def _pre_split(self, text: str) -> list[str]:
        return [s for s, _ in self.pre.pre_tokenize_str(text)]

    def cut_ok(self, text: str, at: int) -> bool:
        if self.pre is None:
            return self.byte
        left, right = text[max(0, at - _CUT_WINDOW):at], text[at:at + _CUT_WINDOW]
        return self._pre_split(left) + self._pre_split(right) == self._pre_split(left + right)

    def pieces(self, text: str) -> list[str]:
        """``text`` cut into pieces of about PIECE_CHARS (one piece if it cannot be cut)."""
        if not self.cuttable or len(text) <= PIECE_CHARS:
            return [text]
        out, start = [], 0
        while len(text) - start > PIECE_CHARS:
            at = None
            for tries, m in enumerate(_CUT.finditer(text, start + PIECE_CHARS)):
                if self.cut_ok(text, m.end()):
                    at = m.end()
                    break
                if tries >= 16:
                    break
            if at is None:  # no usable cut: the rest stays one piece
                break
            out.append(text[start:at])
            start = at
        out.append(text[start:])
        return out

    def encode(self, text: str, first: bool, last: bool) -> np.ndarray:
        """One piece (``first`` / ``last`` of its document), or a whole document when both."""
        if first and last:  # a whole document: the reference encoding itself
            return _encode(self.tok, text)
        if self.byte:
            ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
        else:
            ids = np.asarray(self.tok.encode(text, add_special_tokens=False), dtype=np.int64)
        parts = ([self.prefix] if first else []) + [ids] + ([self.suffix, self.eot] if last else [])
        return np.concatenate(parts) if len(parts) > 1 else ids

    def encode_task(self, task: list[tuple[int, str, bool, bool]], dtype: np.dtype) -> list[tuple[int, bool, np.ndarray]]:
        return [(split, first, self.encode(text, first, last).astype(dtype, copy=False))
                for split, text, first, last in task]


def _tasks(stream: Iterator[tuple[str, str]], enc: _Encoder) -> Iterator[tuple[list, int]]:
    """(task, characters) of the build: pieces ``(split 0/1, text, first, last)`` in corpus order."""
    task, chars = [], 0
    for split, text in stream:
        if not text:
            continue
        parts = enc.pieces(text)
        for i, part in enumerate(parts):
            task.append((0 if split == "train" else 1, part, i == 0, i == len(parts) - 1))
            chars += len(part)
            if chars >= TASK_CHARS:
                yield task, chars
                task, chars = [], 0
    if task:
        yield task, chars


@dataclass
class Shards:
    """Token streams of one corpus + tokenizer (memory-mapped, read-only)."""

    train: np.ndarray
    val: np.ndarray
    meta: dict
    path: Optional[Path]


_WORKER: dict = {}


def _worker_init(enc: _Encoder, dtype: np.dtype) -> None:
    env.tokenizers_single_threaded()  # one core per worker process
    if sys.platform == "linux":  # a killed build takes its workers with it (no orphans finishing their task)
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    _WORKER.update(enc=enc, dtype=dtype)


def _worker_task(task: list) -> list:
    return _WORKER["enc"].encode_task(task, _WORKER["dtype"])


def _encoded(tasks: Iterator[tuple[list, int]], enc: _Encoder, dtype: np.dtype, workers: int
             ) -> Iterator[tuple[list, int]]:
    """(encoded task, characters) in task order; a pool of ``workers`` processes once there are two tasks."""
    first = next(tasks, None)
    if first is None:
        return
    second = next(tasks, None)
    if second is None or workers <= 1 or enc.byte:  # nothing to share (bytes: copying costs more than encoding)
        for task, chars in itertools.chain([first], [second] if second else [], tasks):
            yield enc.encode_task(task, dtype), chars
        return

    # fork: workers inherit the tokenizer (nothing to pickle or import); elsewhere spawn
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() and sys.platform == "linux" else "spawn")
    pool = ctx.Pool(workers, initializer=_worker_init, initargs=(enc, dtype))
    try:
        pending: collections.deque = collections.deque()
        for task, chars in itertools.chain([first, second], tasks):
            pending.append((pool.apply_async(_worker_task, (task,)), chars))
            if len(pending) >= 2 * workers:  # bounded read-ahead: a streamed corpus is never held whole
                res, n = pending.popleft()
                yield res.get(), n
        while pending:
            res, n = pending.popleft()
            yield res.get(), n
    finally:
        pool.terminate()
        pool.join()


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))  # the CPUs this process may use (a SLURM job's allocation)
    except AttributeError:
        return os.cpu_count() or 1


def _corpus_chars(corpus: Corpus) -> Optional[int]:
    """Approximate size (bytes of its files) for a progress percentage; None for streams."""
    if isinstance(corpus, FileCorpus):
        return sum(p.stat().st_size for ps in corpus.files.values() for p in ps)
    return None


@dataclass
class _Progress:
    """What a partial build has durably written: ``tasks`` tasks done, these token / document counts."""

    tasks: int = 0
    chars: int = 0
    train: int = 0
    val: int = 0
    train_docs: int = 0
    val_docs: int = 0
    done: bool = False


def _load_shards(path: Path) -> Shards:
    meta = json.loads((path / "meta.json").read_text())
    dtype = np.dtype(meta["dtype"])
    arrays = {}
    for split in ("train", "val"):
        f = path / f"{split}.bin"
        expect = meta[f"{split}_tokens"] * dtype.itemsize
        if not f.is_file() or f.stat().st_size != expect:
            raise DataError(f"token cache {f} is incomplete or corrupt (expected {expect} bytes); delete {path} to rebuild")
        arrays[split] = np.memmap(f, dtype=dtype, mode="r") if expect else np.zeros(0, dtype)
    return Shards(arrays["train"], arrays["val"], meta, path)


def build_shards(cfg: DataConfig, vocab_size: int, log: Callable[[str], None] = print,
                 workers: Optional[int] = None) -> Shards:
    """Tokenize ``cfg.corpus`` once (cached under ``cfg.cache_dir``) and return the memmapped streams.

    ``vocab_size`` is the model's; the tokenizer's vocabulary must fit in it. ``workers``: tokenizer
    processes (default ``$MHAR_TOKENIZE_WORKERS``, else every core this process may use); the shards
    do not depend on it. A killed build resumes where it was (``.<name>.partial`` next to the cache).
    """
    data_dir = resolve_data_dir(cfg)
    if data_dir is not None and not data_dir.is_dir():
        raise DataError(f"data directory {data_dir} does not exist (from data.data_dir or MHAR_DATA_DIR)")
    corpus = resolve_corpus(cfg.corpus, data_dir, cfg.text_field, vocab_size)
    if isinstance(corpus, SyntheticCorpus):
        if corpus.vocab > vocab_size:
            raise DataError(f"data.corpus {cfg.corpus!r}: vocab {corpus.vocab} exceeds model.vocab_size={vocab_size}")
        n_val = max(int(corpus.n_tokens * cfg.val_fraction), cfg.seq_len + 1)
        train = corpus.tokens(corpus.n_tokens, seed=0)
        if cfg.max_train_tokens is not None:
            train = train[: cfg.max_train_tokens]
        val = corpus.tokens(n_val, seed=1)
        meta = {"format": SHARD_FORMAT, "corpus": corpus.fingerprint(), "holdout": "separate-stream",
                "train_tokens": len(train), "val_tokens": len(val), "eot_id": corpus.vocab - 1,
                "vocab_size": corpus.vocab, "dtype": "int64"}
        return Shards(train, val, meta, None)
    try:
        tok = get_tokenizer(cfg.tokenizer, data_dir)
    except ValueError as e:
        raise DataError(f"data.tokenizer: {e}") from e
    if tok.vocab_size > vocab_size:
        raise DataError(f"data.tokenizer {cfg.tokenizer!r} has {tok.vocab_size} ids but model.vocab_size={vocab_size}; "
                        f"set model.vocab_size >= {tok.vocab_size}")
    val_corpus = resolve_corpus(cfg.val_corpus, data_dir, cfg.text_field) if cfg.val_corpus else None
    if isinstance(val_corpus, SyntheticCorpus):
        raise DataError("data.val_corpus: a synthetic corpus cannot be a validation corpus")
    key_material = {
        "format": SHARD_FORMAT, "corpus": corpus.fingerprint(), "tokenizer": _tokenizer_fingerprint(tok, cfg.tokenizer),
        "holdout": cfg.holdout if val_corpus is None else None,
        "val_fraction": cfg.val_fraction if val_corpus is None else None,
        "val_corpus": val_corpus.fingerprint() if val_corpus else None,
        "max_train_tokens": cfg.max_train_tokens, "val_cap": VAL_TOKEN_CAP,
    }
    key = hashlib.sha256(json.dumps(key_material, sort_keys=True).encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in f"{corpus.name}-{Path(cfg.tokenizer).name}")
    final = Path(cfg.cache_dir) / f"{safe}-{key}"
    if (final / "meta.json").is_file():
        return _load_shards(final)

    from filelock import FileLock  # a dependency of torch; flock-based, released if the holder dies

    final.parent.mkdir(parents=True, exist_ok=True)
    partial = final.parent / f".{final.name}.partial"
    lock = FileLock(str(partial) + ".lock")
    if not lock.acquire(blocking=False):
        log(f"waiting for another process building {final}")
        lock.acquire()
    try:
        if (final / "meta.json").is_file():  # built by that other process
            return _load_shards(final)
        try:
            n_workers = max(1, workers or env.tokenize_workers() or _available_cores())
        except ValueError as e:
            raise DataError(str(e)) from None
        meta = _build(cfg, corpus, val_corpus, tok, key, key_material, partial, n_workers, log)
        os.rename(partial, final)
    finally:
        lock.release()  # the (empty) lock file stays: removing it could let two builders in at once
    log(f"tokenized {cfg.corpus!r} with {cfg.tokenizer!r}: {meta['train_tokens']:,} train / "
        f"{meta['val_tokens']:,} val tokens ({meta['holdout_rule']}) in {meta['build_s']:.1f} s "
        f"({meta['tokens_per_s'] / 1e6:.2f}M tokens/s, {n_workers} worker(s)) -> {final}")
    return _load_shards(final)


def _build(cfg: DataConfig, corpus: Corpus, val_corpus: Optional[Corpus], tok: Tokenizer, key: str,
           key_material: dict, partial: Path, workers: int, log: Callable[[str], None]) -> dict:
    """Fill ``partial`` (resuming what it holds) with train.bin / val.bin / meta.json; returns the meta."""
    progress_file = partial / "progress.json"
    prog = _Progress()
    if progress_file.is_file():
        saved = json.loads(progress_file.read_text())
        if saved.get("key") == key:
            prog = _Progress(**saved["progress"])
    else:
        shutil.rmtree(partial, ignore_errors=True)  # nothing recorded: start clean
    if prog.done and (partial / "meta.json").is_file():  # killed between the last write and the rename
        return json.loads((partial / "meta.json").read_text())
    partial.mkdir(parents=True, exist_ok=True)
    dtype = _token_dtype(tok.vocab_size)
    enc = _Encoder(tok)
    if val_corpus is None:
        rule, stream = split_stream(corpus, cfg.holdout, cfg.val_fraction)
    else:
        source = "train" if "train" in corpus.splits() else "all"
        if source not in corpus.splits():
            raise DataError(f"data.corpus {corpus.name!r} has no training split (splits: {corpus.splits()})")
        rule = f"val_corpus:{val_corpus.name}"
        stream = ((s, d) for s, docs in (("train", corpus.documents(source)), ("val", val_documents(val_corpus)))
                  for d in docs)
    writers = {0: _ShardWriter(partial / "train.bin", dtype, cfg.max_train_tokens, prog.train, prog.train_docs),
               1: _ShardWriter(partial / "val.bin", dtype, VAL_TOKEN_CAP, prog.val, prog.val_docs)}
    total = _corpus_chars(corpus)
    resumed_at = prog.tasks
    if resumed_at:
        log(f"resuming the token shards of {cfg.corpus!r} after {prog.train + prog.val:,} tokens "
            f"({prog.tasks} tasks) -> {partial}")

    def commit(done: bool = False) -> None:
        for w in writers.values():
            if not w.f.closed:
                w.flush(sync=True)
        prog.train, prog.val = writers[0].n, writers[1].n
        prog.train_docs, prog.val_docs, prog.done = writers[0].docs, writers[1].docs, done
        atomic_write_text(progress_file, json.dumps({"key": key, "progress": asdict(prog)}))

    t0 = t_commit = t_log = time.time()
    tokens0 = prog.train + prog.val
    try:
        tasks = itertools.islice(_tasks(stream, enc), resumed_at, None)  # the same tasks, the done ones skipped
        for encoded, chars in _encoded(tasks, enc, dtype, workers):
            for split, new_doc, ids in encoded:
                writers[split].add(ids, new_doc)
            prog.tasks += 1
            prog.chars += chars
            now = time.time()
            if now - t_commit >= COMMIT_EVERY_S:
                commit()
                t_commit = now
            if now - t_log >= PROGRESS_EVERY_S:
                t_log = now
                done_tokens = writers[0].n + writers[1].n
                pct = f", {min(prog.chars / total, 1):.0%} of {total / 1e6:.0f} MB" if total else ""
                log(f"tokenizing {cfg.corpus!r}: {done_tokens:,} tokens{pct}, "
                    f"{(done_tokens - tokens0) / (now - t0) / 1e6:.2f}M tokens/s ({workers} worker(s))")
            if writers[0].full and writers[1].full:
                break
        commit()
    except DataError:
        for w in writers.values():
            w.f.close()
        shutil.rmtree(partial, ignore_errors=True)  # the corpus itself is unusable: nothing to resume
        raise
    for w in writers.values():
        w.close()  # flushed and synced by the commit above
    if writers[0].n <= cfg.seq_len or writers[1].n <= cfg.seq_len:
        shutil.rmtree(partial, ignore_errors=True)
        raise DataError(f"data.corpus {cfg.corpus!r}: too little text after the split (train "
                        f"{writers[0].n}, val {writers[1].n} tokens) for data.seq_len={cfg.seq_len}")
    build_s = time.time() - t0
    new_tokens = writers[0].n + writers[1].n - tokens0
    meta = {"format": SHARD_FORMAT, "key": key, **key_material, "holdout_rule": rule, "dtype": dtype.name,
            "train_tokens": writers[0].n, "val_tokens": writers[1].n,
            "train_docs": writers[0].docs, "val_docs": writers[1].docs,
            "eot_id": tok.eot_id, "vocab_size": tok.vocab_size, "build_s": round(build_s, 2),
            "tokens_per_s": round(new_tokens / max(build_s, 1e-9), 1), "workers": workers,
            "resumed_after_tasks": resumed_at or None}
    atomic_write_text(partial / "meta.json", json.dumps(meta, indent=1))
    commit(done=True)
    return meta
