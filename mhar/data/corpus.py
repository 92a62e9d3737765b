"""Corpora: what ``data.corpus`` / ``data.val_corpus`` name, read as documents, and the held-out split.

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
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from mhar import env
from mhar.data.config import DataConfig

__all__ = ["DataError", "Corpus", "FileCorpus", "HubCorpus", "SyntheticCorpus", "resolve_corpus", "resolve_data_dir",
           "split_stream", "val_documents", "file_digest"]

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


def file_digest(path: Path) -> str:
    """A file's identity for cache keys: its sha256, or name + size + mtime for a file over 256 MiB."""
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
        import pyarrow.parquet as pq  # lazy: optional pyarrow, only for .parquet corpora

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
                "files": {s: [[p.name, file_digest(p)] for p in ps] for s, ps in self.files.items()}}


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
                import datasets  # lazy: optional and slow to import: hub corpora only

                names = datasets.get_dataset_split_names(self.path, self.config_name)
            except Exception as e:  # network, unknown name, missing package
                raise self._hub_error(e) from e
            self._splits = tuple(names)
        return self._splits

    def documents(self, split: str) -> Iterator[str]:
        try:
            import datasets  # lazy: optional and slow to import: hub corpora only

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
            fp["files"] = [[str(p.relative_to(local)), file_digest(p)] for p in sorted(local.rglob("*"))
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


def val_documents(corpus: Corpus) -> Iterator[str]:
    """The documents of a validation corpus (``data.val_corpus``): its validation, test, whole or train split."""
    splits = corpus.splits()
    for name in ("validation", "test", "all", "train"):
        if name in splits:
            return corpus.documents(name)
    raise DataError(f"data.val_corpus {corpus.name!r}: no usable split among {splits}")
