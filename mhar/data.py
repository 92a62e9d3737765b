"""Training data: corpora -> tokenize-once memmap shards -> packed sequences -> paired batch order.

Corpus specs (``data.corpus``):
  * ``tinyshakespeare``  ``<data_dir>/tinyshakespeare/input.txt`` (one document, tail hold-out); without a data dir, hub ``karpathy/tiny_shakespeare``
  * ``nltk_gutenberg``   ``<data_dir>/nltk_gutenberg/gutenberg/*.txt`` (each file one document, Latin-1)
  * ``wikitext2``        ``<data_dir>/wikitext-2-raw-v1/{validation,test}.jsonl`` (field ``page``; no train
                         split locally, so usable as ``data.val_corpus`` only); without a data dir it is
                         streamed from the hub (``Salesforce/wikitext``, ``wikitext-2-raw-v1``, all splits)
  * ``hf:<path>[:<name>]``  a Hugging Face hub dataset, streamed (e.g. ``hf:HuggingFaceFW/fineweb-edu:sample-10BT``)
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
under ``<cache_dir>/<key>/`` (key = hash of corpus fingerprint + tokenizer + split rule), and packed
into consecutive windows of ``seq_len + 1`` tokens (no padding; windows share one boundary token).
The batch order is a pure function of ``(data seed, number of sequences, global batch)``: every model
variant run with the same seed sees byte-identical batches, and the data position of a resumed run is
just its step.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import numpy as np
import torch
from torch import Tensor

from . import env
from .runconfig import DataConfig
from .tokenizer import ByteTokenizer, Tokenizer, get_tokenizer

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
    """A Hugging Face hub dataset read in streaming mode (``datasets.load_dataset(..., streaming=True)``)."""

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
        return {"kind": "hf", "path": self.path, "name": self.config_name, "text_field": self.text_field}


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
    """Append token ids to a flat binary file, with an optional token cap."""

    def __init__(self, path: Path, dtype: np.dtype, cap: Optional[int]):
        self.f = open(path, "wb")
        self.dtype, self.cap, self.n, self.docs = dtype, cap, 0, 0
        self._buf: list[np.ndarray] = []
        self._buffered = 0

    @property
    def full(self) -> bool:
        return self.cap is not None and self.n >= self.cap

    def add(self, ids: np.ndarray) -> None:
        if self.full:
            return
        if self.cap is not None:
            ids = ids[: self.cap - self.n]
        self._buf.append(ids.astype(self.dtype, copy=False))
        self.n += len(ids)
        self.docs += 1
        self._buffered += len(ids)
        if self._buffered >= 1 << 20:
            self.flush()

    def flush(self) -> None:
        if self._buf:
            np.concatenate(self._buf).tofile(self.f)
        self._buf, self._buffered = [], 0

    def close(self) -> None:
        self.flush()
        self.f.close()


def _encode(tok: Tokenizer, text: str) -> np.ndarray:
    if isinstance(tok, ByteTokenizer):
        ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    else:
        # the tokenizer's own template, as evaluation encodes (a Llama-3 tokenizer prepends its BOS)
        ids = np.asarray(tok.encode(text, add_special_tokens=True), dtype=np.int64)
    return np.append(ids, tok.eot_id)


@dataclass
class Shards:
    """Token streams of one corpus + tokenizer (memory-mapped, read-only)."""

    train: np.ndarray
    val: np.ndarray
    meta: dict
    path: Optional[Path]


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
    """Remove token-cache folders left by killed builds (``.<name>.tmp-<pid>-*`` of a dead pid)."""
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


def build_shards(cfg: DataConfig, vocab_size: int, log: Callable[[str], None] = print) -> Shards:
    """Tokenize ``cfg.corpus`` once (cached under ``cfg.cache_dir``) and return the memmapped streams.

    ``vocab_size`` is the model's; the tokenizer's vocabulary must fit in it.
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

    final.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_builds(final.parent)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.tmp-{os.getpid()}-"))
    t0 = time.time()
    try:
        dtype = _token_dtype(tok.vocab_size)
        writers = {"train": _ShardWriter(tmp / "train.bin", dtype, cfg.max_train_tokens),
                   "val": _ShardWriter(tmp / "val.bin", dtype, VAL_TOKEN_CAP)}
        if val_corpus is None:
            rule, stream = split_stream(corpus, cfg.holdout, cfg.val_fraction)
        else:
            source = "train" if "train" in corpus.splits() else "all"
            if source not in corpus.splits():
                raise DataError(f"data.corpus {corpus.name!r} has no training split (splits: {corpus.splits()})")
            rule = f"val_corpus:{val_corpus.name}"
            stream = ((s, d) for s, docs in (("train", corpus.documents(source)), ("val", _val_documents(val_corpus)))
                      for d in docs)
        for split, text in stream:
            if text:
                writers[split].add(_encode(tok, text))
            if writers["train"].full and writers["val"].full:
                break
        for w in writers.values():
            w.close()
        if writers["train"].n <= cfg.seq_len or writers["val"].n <= cfg.seq_len:
            raise DataError(f"data.corpus {cfg.corpus!r}: too little text after the split (train "
                            f"{writers['train'].n}, val {writers['val'].n} tokens) for data.seq_len={cfg.seq_len}")
        meta = {"format": SHARD_FORMAT, "key": key, **key_material, "holdout_rule": rule, "dtype": dtype.name,
                "train_tokens": writers["train"].n, "val_tokens": writers["val"].n,
                "train_docs": writers["train"].docs, "val_docs": writers["val"].docs,
                "eot_id": tok.eot_id, "vocab_size": tok.vocab_size, "build_s": round(time.time() - t0, 2)}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished the same cache first: use theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"tokenized {cfg.corpus!r} with {cfg.tokenizer!r}: {meta['train_tokens']:,} train / "
        f"{meta['val_tokens']:,} val tokens ({rule}) -> {final}")
    return _load_shards(final)


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
