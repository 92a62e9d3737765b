"""Training data: corpora -> tokenize-once memmap shards -> packed sequences -> paired batch order.

Corpus specs (``data.corpus``):
  * ``tinyshakespeare``  ``<data_dir>/tinyshakespeare/input.txt`` (one document, tail hold-out); without a data dir, hub ``karpathy/tiny_shakespeare``
  * ``nltk_gutenberg``   ``<data_dir>/nltk_gutenberg/gutenberg/*.txt`` (each file one document, Latin-1)
  * ``wikitext2``        ``<data_dir>/wikitext-2-raw-v1/{validation,test}.jsonl`` (field ``page``; no train
                         split locally, so usable as ``data.val_corpus`` only); without a data dir it is
                         streamed from the hub (``Salesforce/wikitext``, ``wikitext-2-raw-v1``, all splits)
  * ``hf:<path>[:<name>]``  a Hugging Face hub dataset, streamed (e.g. ``hf:HuggingFaceFW/fineweb-edu:sample-10BT``);
                         ``<path>`` may be a local snapshot folder of such a dataset (same loader, offline)
  * ``synthetic:<n_tokens>[:<vocab>]``  deterministic Zipf-distributed token stream (no files, no tokenizer;
                         for throughput runs); vocab defaults to the model's
  * a path (absolute, relative to the working directory, or relative to the data dir) to a ``.txt``
    (one document), ``.jsonl`` / ``.parquet`` (one document per row, column ``data.text_field``) file, or a
    directory of such files; files named ``train.*`` / ``validation.*`` / ``test.*`` are splits.

Validation never overlaps training: a corpus' own validation split is used when it has one; otherwise
``data.holdout`` decides (``tail``: the last ``val_fraction`` of every document, cut at a newline;
``documents``: the documents whose content hash falls below ``val_fraction``; ``auto``: tail for fewer
than 100 documents, else documents).

Documents are tokenized once, each followed by the end-of-text id, into ``train.bin`` / ``val.bin``
under ``<cache_dir>/<key>/`` (key = hash of corpus fingerprint + tokenizer + split rule): in parallel
worker processes (``MHAR_TOKENIZE_WORKERS``, default all cores), byte for byte the same for any worker
count, resumable after a kill (``build_shards``), with progress lines in tokens/s. They are packed
into consecutive windows of ``seq_len + 1`` tokens (no padding; windows share one boundary token).
The batch order is a pure function of ``(data seed, number of sequences, global batch)``: every model
variant run with the same seed sees byte-identical batches, and the data position of a resumed run is
just its step.
"""
from __future__ import annotations

import collections
import hashlib
import itertools
import json
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from mhar import env
from mhar.runs.atomic import atomic_write_text
from mhar.runs.config import DataConfig
from mhar.data.tokenizer import ByteTokenizer, Tokenizer, get_tokenizer

__all__ = [
    "DataError", "Corpus", "resolve_corpus", "Shards", "build_shards", "PackedTokens", "BatchOrder",
    "TrainData", "load_data", "resolve_data_dir", "unigram_entropy",
]

SHARD_FORMAT = "mhar-shards-v1"
VAL_TOKEN_CAP = 16_000_000  # the val shard keeps at most this many tokens
SPLIT_ALIASES = {"train": "train", "validation": "validation", "valid": "validation", "val": "validation",
                 "test": "test"}
TEXT_SUFFIXES = (".txt", ".jsonl", ".parquet")


class DataError(ValueError):
    """Missing or unusable data. The message names the path / key and what to do."""


def resolve_data_dir(cfg: DataConfig) -> Optional[Path]:
    """``data.data_dir``, else the documented default ``$MHAR_DATA_DIR`` (``mhar.env``), else None (hub)."""
    return env.data_dir(cfg.data_dir)


# --- corpora ------------------------------------------------------------------------------------
class Corpus:
    """Documents of one corpus. ``splits`` maps split name -> source; ``"all"`` when unsplit."""

    name: str
    n_docs: Optional[int] = None  # known document count (None for streams)

    def splits(self) -> tuple[str, ...]:
        raise NotImplementedError

    def documents(self, split: str) -> Iterator[str]:
        raise NotImplementedError

    def fingerprint(self) -> dict:
        raise NotImplementedError


def _file_digest(path: Path) -> str:
    st = path.stat()
    if st.st_size > 256 * 2**20:  # large files: name + size + mtime (hashing would dominate start-up)
        return f"{path.name}:{st.st_size}:{st.st_mtime_ns}"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _not_utf8(path: Path, e: UnicodeDecodeError, where: str = "") -> DataError:
    return DataError(f"{path}{where}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                     f"convert it, e.g. iconv -f latin1 -t utf-8 {path.name} > {path.stem}.utf8{path.suffix}")


def _read_text(path: Path, encoding: Optional[str]) -> str:
    raw = path.read_bytes()
    if encoding:
        return raw.decode(encoding)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:  # Latin-1 would read any bytes, silently garbling other encodings
        raise _not_utf8(path, e) from None


def _file_documents(path: Path, text_field: str, encoding: Optional[str]) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix == ".txt":
        yield _read_text(path, encoding).replace("\r\n", "\n")
    elif suffix == ".jsonl":
        with open(path, "rb") as f:
            for lineno, bline in enumerate(f, 1):
                try:
                    line = bline.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise _not_utf8(path, e, f":{lineno}") from None
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as e:
                    raise DataError(f"{path}:{lineno}: not valid JSON ({e}); a .jsonl corpus holds one JSON "
                                    "object per line") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{lineno}: expected a JSON object per line, got {type(row).__name__}")
                if text_field not in row:
                    raise DataError(f"{path}:{lineno}: no field {text_field!r} (has {sorted(row)}); set data.text_field")
                yield row[text_field]
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        if text_field not in pf.schema_arrow.names:
            raise DataError(f"{path}: no column {text_field!r} (has {pf.schema_arrow.names}); set data.text_field")
        for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
            yield from batch.column(0).to_pylist()
    else:
        raise DataError(f"{path}: unsupported file type {suffix!r}; use .txt, .jsonl or .parquet")


class FileCorpus(Corpus):
    """Local files: ``files`` maps split ('all' | 'train' | 'validation' | 'test') -> list of files."""

    def __init__(self, name: str, files: dict[str, list[Path]], text_field: str = "text",
                 encoding: Optional[str] = None):
        for split, paths in files.items():
            for p in paths:
                if not p.is_file():
                    raise DataError(f"data.corpus {name!r}: file not found: {p}")
        self.name, self.files, self.text_field, self.encoding = name, files, text_field, encoding
        all_files = files.get("all", [])
        if all(p.suffix.lower() == ".txt" for p in all_files) and all_files:
            self.n_docs = len(all_files)

    def splits(self) -> tuple[str, ...]:
        return tuple(self.files)

    def documents(self, split: str) -> Iterator[str]:
        for p in self.files[split]:
            yield from _file_documents(p, self.text_field, self.encoding)

    def fingerprint(self) -> dict:
        return {"kind": "files", "name": self.name, "text_field": self.text_field, "encoding": self.encoding,
                "files": {s: [[p.name, _file_digest(p)] for p in ps] for s, ps in self.files.items()}}


class HubCorpus(Corpus):
    """A Hugging Face hub dataset read in streaming mode (``datasets.load_dataset(..., streaming=True)``).

    ``path`` may also be a local folder laid out as a hub dataset repository (a snapshot, e.g. from
    ``huggingface-cli download --repo-type dataset``: data files, and a README.md whose ``configs``
    name the configurations): ``datasets`` reads it through the same streaming loader.
    """

    def __init__(self, path: str, config_name: Optional[str], text_field: str):
        self.name = f"hf:{path}" + (f":{config_name}" if config_name else "")
        self.path, self.config_name, self.text_field = path, config_name, text_field
        self._splits: Optional[tuple[str, ...]] = None

    def _hub_error(self, e: Exception) -> DataError:
        return DataError(f"data.corpus {self.name!r}: could not read from the Hugging Face hub "
                         f"({type(e).__name__}: {e}). Check the name and network, or use a local corpus "
                         "(set MHAR_DATA_DIR / data.data_dir).")

    def splits(self) -> tuple[str, ...]:
        if self._splits is None:
            try:
                import datasets

                names = datasets.get_dataset_split_names(self.path, self.config_name)
            except Exception as e:  # network, unknown name, missing package
                raise self._hub_error(e) from e
            self._splits = tuple(names)
        return self._splits

    def documents(self, split: str) -> Iterator[str]:
        try:
            import datasets

            ds = datasets.load_dataset(self.path, self.config_name, split=split, streaming=True)
        except Exception as e:
            raise self._hub_error(e) from e
        for row in ds:
            if self.text_field not in row:
                raise DataError(f"{self.name}: no field {self.text_field!r} (has {sorted(row)}); set data.text_field")
            yield row[self.text_field]

    def fingerprint(self) -> dict:
        fp = {"kind": "hf", "path": self.path, "name": self.config_name, "text_field": self.text_field}
        local = Path(self.path).expanduser()
        if local.is_dir():  # a local snapshot of a hub dataset: its files are part of the cache key
            fp["files"] = [[str(p.relative_to(local)), _file_digest(p)] for p in sorted(local.rglob("*"))
                           if p.is_file() and not any(part.startswith(".") for part in p.relative_to(local).parts)]
        return fp


@dataclass
class SyntheticCorpus:
    """Deterministic Zipf(1) token stream in documents of geometric length (mean 512); EOT = vocab-1."""

    n_tokens: int
    vocab: int
    name: str = "synthetic"

    def fingerprint(self) -> dict:
        return {"kind": "synthetic", "n_tokens": self.n_tokens, "vocab": self.vocab}

    def probabilities(self) -> np.ndarray:
        p = 1.0 / np.arange(1, self.vocab, dtype=np.float64)  # ids 0..vocab-2; vocab-1 is EOT
        return p / p.sum()

    def tokens(self, n: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        toks = rng.choice(self.vocab - 1, size=n, p=self.probabilities()).astype(np.int64)
        toks[rng.random(n) < 1.0 / 512] = self.vocab - 1
        return toks


_LOCAL = {
    # name -> (split -> relative glob), encoding, text field
    "tinyshakespeare": ({"all": "tinyshakespeare/input.txt"}, "utf-8", "text"),
    "nltk_gutenberg": ({"all": "nltk_gutenberg/gutenberg/*.txt"}, "latin-1", "text"),
    "wikitext2": ({"validation": "wikitext-2-raw-v1/validation.jsonl", "test": "wikitext-2-raw-v1/test.jsonl"},
                  "utf-8", "page"),
}
# Used when no local data directory is set (users with internet). The hub copy of
# tiny-shakespeare ships its own train/validation/test split (parquet, one row per split),
# which is then used instead of the local file's tail hold-out.
_HUB_FALLBACK = {
    "wikitext2": ("Salesforce/wikitext", "wikitext-2-raw-v1", "text"),
    "tinyshakespeare": ("karpathy/tiny_shakespeare", None, "text"),
}


def _split_of(path: Path) -> Optional[str]:
    return SPLIT_ALIASES.get(path.stem.split("-")[0].lower())


def _path_corpus(path: Path, text_field: str) -> FileCorpus:
    if path.is_file():
        return FileCorpus(path.name, {"all": [path]}, text_field)
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise DataError(f"data.corpus: directory {path} holds no .txt/.jsonl/.parquet files")
    by_split: dict[str, list[Path]] = {}
    if all(_split_of(p) for p in files):
        for p in files:
            by_split.setdefault(_split_of(p), []).append(p)
    else:
        by_split["all"] = files
    return FileCorpus(path.name, by_split, text_field)


def resolve_corpus(spec: str, data_dir: Optional[Path], text_field: str = "text",
                   vocab_size: Optional[int] = None) -> Corpus | SyntheticCorpus:
    """Turn a ``data.corpus`` spec into a corpus (see the module docstring)."""
    if spec.startswith("synthetic:"):
        parts = spec.split(":")[1:]
        try:
            n = int(float(parts[0]))
            vocab = int(parts[1]) if len(parts) > 1 else vocab_size
        except (ValueError, IndexError) as e:
            raise DataError(f"data.corpus {spec!r}: expected synthetic:<n_tokens>[:<vocab>]") from e
        if vocab is None or vocab < 3 or n < 2:
            raise DataError(f"data.corpus {spec!r}: need n_tokens >= 2 and a vocab >= 3")
        return SyntheticCorpus(n, vocab)
    if spec.startswith("hf:"):
        rest = spec[3:].split(":")
        if not rest[0] or len(rest) > 2:
            raise DataError(f"data.corpus {spec!r}: expected hf:<path>[:<config name>]")
        return HubCorpus(rest[0], rest[1] if len(rest) > 1 else None, text_field)
    if spec in _LOCAL:
        patterns, encoding, field = _LOCAL[spec]
        if data_dir is None:
            if spec in _HUB_FALLBACK:
                path, name, hub_field = _HUB_FALLBACK[spec]
                return HubCorpus(path, name, hub_field)
            raise DataError(f"data.corpus {spec!r} is read from the local data directory, but none is set: "
                            f"set MHAR_DATA_DIR or data.data_dir to a directory holding "
                            f"{', '.join(patterns.values())}")
        files = {s: sorted(data_dir.glob(g)) for s, g in patterns.items()}
        missing = [f"{data_dir / g}" for s, g in patterns.items() if not files[s]]
        if missing:
            raise DataError(f"data.corpus {spec!r}: no files at {', '.join(missing)} "
                            f"(data dir {data_dir}); check MHAR_DATA_DIR / data.data_dir")
        return FileCorpus(spec, files, field, encoding)
    candidates = [Path(spec).expanduser()]
    if data_dir is not None and not Path(spec).is_absolute():
        candidates.append(data_dir / spec)
    for c in candidates:
        if c.exists():
            return _path_corpus(c, text_field)
    raise DataError(f"data.corpus {spec!r}: not a known corpus ({', '.join(_LOCAL)}, hf:<name>, synthetic:<n>) "
                    f"and no file or directory at {', '.join(map(str, candidates))}")


# --- held-out split -------------------------------------------------------------------------------
def _doc_unit(doc: str) -> float:
    """Deterministic number in [0, 1) from the document's content."""
    h = hashlib.blake2b(doc.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def _tail_cut(doc: str, val_fraction: float) -> int:
    cut = int(len(doc) * (1.0 - val_fraction))
    nl = doc.rfind("\n", 0, cut)
    return nl + 1 if nl > 0 else cut


def split_stream(corpus: Corpus, holdout: str, val_fraction: float) -> tuple[str, Iterator[tuple[str, str]]]:
    """Resolved holdout rule and an iterator of ``(split, text)`` with split in {"train", "val"}."""
    splits = corpus.splits()
    if "train" in splits and "validation" in splits:
        def explicit() -> Iterator[tuple[str, str]]:
            yield from (("train", d) for d in corpus.documents("train"))
            yield from (("val", d) for d in corpus.documents("validation"))
        return "split", explicit()
    if "train" in splits or "all" in splits:
        source = "train" if "train" in splits else "all"
        rule = holdout
        if rule == "auto":
            rule = "tail" if corpus.n_docs is not None and corpus.n_docs < 100 else "documents"

        def held_out() -> Iterator[tuple[str, str]]:
            for doc in corpus.documents(source):
                if rule == "tail":
                    cut = _tail_cut(doc, val_fraction)
                    yield "train", doc[:cut]
                    yield "val", doc[cut:]
                else:
                    yield ("val" if _doc_unit(doc) < val_fraction else "train"), doc
        return rule, held_out()
    raise DataError(f"data.corpus {corpus.name!r} has no training split (splits: {', '.join(splits)}); "
                    "use it as data.val_corpus instead")


def _val_documents(corpus: Corpus) -> Iterator[str]:
    splits = corpus.splits()
    for name in ("validation", "test", "all", "train"):
        if name in splits:
            return corpus.documents(name)
    raise DataError(f"data.val_corpus {corpus.name!r}: no usable split among {splits}")


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
        fp["file"] = _file_digest(p)
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
            import ctypes
            import signal

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
    import multiprocessing as mp

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


def _clean_stale_builds(cache: Path) -> None:
    """Remove token-cache folders left by killed builds of the earlier, non-resumable format
    (``.<name>.tmp-<pid>-*`` of a dead pid)."""
    for d in cache.glob(".*.tmp-*-*"):
        try:
            pid = int(d.name.rsplit(".tmp-", 1)[1].split("-", 1)[0])
        except ValueError:
            continue
        try:
            os.kill(pid, 0)
            continue  # a live build (this host)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except PermissionError:
            continue


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
    _clean_stale_builds(final.parent)
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
        stream = ((s, d) for s, docs in (("train", corpus.documents(source)), ("val", _val_documents(val_corpus)))
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


# --- packing and order ----------------------------------------------------------------------------
class PackedTokens:
    """A token stream cut into consecutive windows: sequence i = tokens[i*T : i*T + T + 1]."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len
        self.n = (len(tokens) - 1) // seq_len
        if self.n < 1:
            raise DataError(f"only {len(tokens)} tokens: not enough for one sequence of data.seq_len={seq_len}")

    def __len__(self) -> int:
        return self.n

    def get(self, idx: np.ndarray) -> tuple[Tensor, Tensor]:
        """Input ids and next-token labels, both (B, T) int64."""
        T = self.seq_len
        rows = np.stack([np.asarray(self.tokens[i * T: i * T + T + 1], dtype=np.int64) for i in idx])  # (B, T+1)
        rows_t = torch.from_numpy(rows)
        return rows_t[:, :-1].contiguous(), rows_t[:, 1:].contiguous()


class BatchOrder:
    """Which sequences form optimizer step ``s``: a pure function of (seed, n, global batch).

    Sample k of the run is sequence ``perm_e[k mod n]`` with ``e = k // n`` and ``perm_e`` a permutation
    drawn from ``numpy.random.default_rng([seed, e])``; step s takes samples ``[s*G, (s+1)*G)``.
    """

    def __init__(self, n: int, global_batch: int, seed: int):
        self.n, self.G, self.seed = n, global_batch, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perms[epoch]

    def step_indices(self, step: int) -> np.ndarray:
        k = step * self.G + np.arange(self.G, dtype=np.int64)
        epochs, pos = k // self.n, k % self.n
        return np.array([self._perm(int(e))[p] for e, p in zip(epochs, pos)], dtype=np.int64)

    def rank_micro_batches(self, step: int, rank: int, world: int, micro: int) -> list[np.ndarray]:
        """Rank ``rank``'s contiguous share of the step, cut into micro-batches of ``micro`` sequences."""
        if self.G % (world * micro):
            raise DataError(f"train.global_batch={self.G} is not divisible by world_size*micro_batch={world * micro}")
        idx = self.step_indices(step)
        share = self.G // world
        mine = idx[rank * share:(rank + 1) * share]
        return [mine[i:i + micro] for i in range(0, share, micro)]


class TrainData:
    """Packed train/val sequences and the paired batch order of one run."""

    def __init__(self, shards: Shards, cfg: DataConfig, global_batch: int, seed: int):
        self.shards, self.cfg = shards, cfg
        self.train = PackedTokens(shards.train, cfg.seq_len)
        self.val = PackedTokens(shards.val, cfg.seq_len)
        self.order = BatchOrder(len(self.train), global_batch, seed)
        self.n_val = min(len(self.val), max(1, cfg.val_tokens // cfg.seq_len))

    def micro_batches(self, step: int, rank: int = 0, world: int = 1, micro: Optional[int] = None
                      ) -> Iterator[tuple[Tensor, Tensor]]:
        for idx in self.order.rank_micro_batches(step, rank, world, micro or self.order.G):
            yield self.train.get(idx)

    def val_batches(self, micro: int, rank: int = 0, world: int = 1) -> Iterator[tuple[Tensor, Tensor]]:
        """The fixed validation set (first ``n_val`` sequences), strided over ranks."""
        idx = np.arange(self.n_val)[rank::world]
        for i in range(0, len(idx), micro):
            yield self.val.get(idx[i:i + micro])


def load_data(cfg: DataConfig, vocab_size: int, global_batch: int, seed: int,
              log: Callable[[str], None] = print) -> TrainData:
    return TrainData(build_shards(cfg, vocab_size, log), cfg, global_batch, seed)


def unigram_entropy(tokens: Iterable[int] | np.ndarray, minlength: int = 0) -> float:
    """Entropy (nats) of the empirical unigram distribution of a token stream."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=minlength).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())
