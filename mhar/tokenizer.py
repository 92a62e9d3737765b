"""Tokenizers behind one small interface.

Spec strings (``get_tokenizer(spec)``):
  * ``"byte"``                built-in byte-level tokenizer: ids 0..255 are bytes, 256 is end-of-text.
                              Needs no files (default for CPU runs).
  * a path to ``tokenizer.json`` or a directory holding one (Hugging Face ``tokenizers`` format);
    a relative path is also looked up under the local data directory (``MHAR_DATA_DIR``).
  * ``"hf:<name>"``          a Hugging Face hub tokenizer (e.g. ``hf:Qwen/Qwen3-0.6B``), via transformers.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

from . import env


class Tokenizer:
    name: str
    vocab_size: int
    eot_id: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes; id 256 is the end-of-text token."""

    name = "byte"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


_EOT_CANDIDATES = ("<|endoftext|>", "<|im_end|>", "</s>", "<|end_of_text|>", "<eos>")


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (from tokenizer.json) or a transformers tokenizer."""

    def __init__(self, backend, name: str, eot_id: Optional[int] = None, vocab_size: Optional[int] = None):
        self._tok = backend
        self.name = name
        self._is_fast_lib = hasattr(backend, "encode") and hasattr(backend, "get_vocab_size")
        vocab = backend.get_vocab_size() if self._is_fast_lib else len(backend)
        self.vocab_size = vocab_size or vocab
        if eot_id is None:
            for cand in _EOT_CANDIDATES:
                tid = backend.token_to_id(cand) if self._is_fast_lib else backend.convert_tokens_to_ids(cand)
                if tid is not None and (self._is_fast_lib or tid != backend.unk_token_id):
                    eot_id = tid
                    break
        if eot_id is None:
            raise ValueError(f"tokenizer {name}: could not find an end-of-text token among {_EOT_CANDIDATES}")
        self.eot_id = int(eot_id)

    def encode(self, text: str) -> list[int]:
        if self._is_fast_lib:
            return self._tok.encode(text, add_special_tokens=False).ids
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids))


def get_tokenizer(spec: str, data_dir: Optional[str | os.PathLike] = None) -> Tokenizer:
    """A tokenizer from its spec; a relative tokenizer.json path is also looked up under ``data_dir``
    (default: ``$MHAR_DATA_DIR``, see ``mhar.env``)."""
    root = env.data_dir(data_dir)
    if spec == "byte":
        return ByteTokenizer()
    if spec.startswith("hf:"):
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise ValueError(f"tokenizer {spec!r} needs transformers: pip install 'mhar[data]'") from e
        try:
            tok = AutoTokenizer.from_pretrained(spec[3:])
        except Exception as e:  # network / name errors
            raise ValueError(
                f"tokenizer {spec!r}: could not load from the Hugging Face hub ({type(e).__name__}: {e}). "
                "Check the name, your network, or point to a local tokenizer.json instead."
            ) from e
        eot = tok.eos_token_id
        return HFTokenizer(tok, spec, eot_id=eot)
    candidates = [Path(spec)]
    if root is not None and not Path(spec).is_absolute():
        candidates.append(root / spec)
    for p in candidates:
        if p.is_dir():
            p = p / "tokenizer.json"
        if p.is_file():
            from tokenizers import Tokenizer as _Tok

            return HFTokenizer(_Tok.from_file(str(p)), str(spec))
    hint = "give a full path" if root is not None else "set data.data_dir / MHAR_DATA_DIR or give a full path"
    raise ValueError(
        f"unknown tokenizer {spec!r}: not 'byte', not 'hf:<hub name>', and no tokenizer.json found at "
        f"{', '.join(str(c) for c in candidates)}; {hint}."
    )
