"""Tokenizers behind one small interface.

Spec strings (``get_tokenizer(spec)``):
  * ``"byte"``                built-in byte-level tokenizer: ids 0..255 are bytes, 256 is end-of-text.
                              Needs no files (default for CPU runs).
  * a path to ``tokenizer.json`` or a directory holding one (Hugging Face ``tokenizers`` format);
    a relative path is also looked up under the local data directory (``MHAR_DATA_DIR``).
  * ``"hf:<name>"``          a Hugging Face hub tokenizer (e.g. ``hf:Qwen/Qwen3-0.6B``), via transformers.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional, Sequence

from mhar import env


class Tokenizer:
    """``encode`` adds no special tokens unless asked (training data: documents joined by ``eot_id``);
    ``add_special_tokens=True`` applies the tokenizer's own template (e.g. a Llama-3 BOS), as
    ``transformers`` does by default. ``bos_id`` is the tokenizer's declared BOS token (None: none)."""

    name: str
    vocab_size: int
    eot_id: int
    bos_id: Optional[int] = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes; id 256 is the end-of-text token."""

    name = "byte"
    vocab_size = 257
    eot_id = 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))  # no template: nothing to add

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # the end-of-text id has no text form, whether special tokens are skipped or not
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


_EOT_CANDIDATES = ("<|endoftext|>", "<|im_end|>", "</s>", "<|end_of_text|>", "<eos>")


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (from tokenizer.json) or a transformers tokenizer."""

    def __init__(self, backend, name: str, eot_id: Optional[int] = None, vocab_size: Optional[int] = None,
                 bos_id: Optional[int] = None):
        self._tok = backend
        self.bos_id = None if bos_id is None else int(bos_id)
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

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if self._is_fast_lib:
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _declared_special_tokens(folder: Path, backend) -> tuple[Optional[int], Optional[int]]:
    """(bos, eos) ids named by a ``tokenizer_config.json`` next to tokenizer.json (as transformers reads it)."""
    cfg_path = folder / "tokenizer_config.json"
    if not cfg_path.is_file():
        return None, None
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    out = []
    for key in ("bos_token", "eos_token"):
        tok = cfg.get(key)
        if isinstance(tok, dict):  # {"content": "<|begin_of_text|>", ...}
            tok = tok.get("content")
        out.append(backend.token_to_id(tok) if isinstance(tok, str) else None)
    return out[0], out[1]


def get_tokenizer(spec: str, data_dir: Optional[str | os.PathLike] = None) -> Tokenizer:
    """A tokenizer from its spec; a relative tokenizer.json path is also looked up under ``data_dir``
    (default: ``$MHAR_DATA_DIR``, see ``mhar.env``)."""
    root = env.data_dir(data_dir)
    if spec == "byte":
        return ByteTokenizer()
    if spec.startswith("hf:"):
        try:
            from transformers import AutoTokenizer  # lazy: optional transformers: hf: tokenizers only
        except ImportError as e:
            raise ValueError(f"tokenizer {spec!r} needs transformers: pip install 'mhar[data]'") from e
        try:
            tok = AutoTokenizer.from_pretrained(spec[3:])
        except Exception as e:  # network / name errors
            raise ValueError(
                f"tokenizer {spec!r}: could not load from the Hugging Face hub ({type(e).__name__}: {e}). "
                "Check the name, your network, or point to a local tokenizer.json instead."
            ) from e
        return HFTokenizer(tok, spec, eot_id=tok.eos_token_id, bos_id=tok.bos_token_id)
    candidates = [Path(spec)]
    if root is not None and not Path(spec).is_absolute():
        candidates.append(root / spec)
    for p in candidates:
        if p.is_dir():
            p = p / "tokenizer.json"
        if p.is_file():
            from tokenizers import Tokenizer as _Tok  # lazy: tokenizers, only for a tokenizer.json (byte needs none)

            backend = _Tok.from_file(str(p))
            bos, eos = _declared_special_tokens(p.parent, backend)
            return HFTokenizer(backend, str(spec), eot_id=eos, bos_id=bos)
    hint = "give a full path" if root is not None else "set data.data_dir / MHAR_DATA_DIR or give a full path"
    raise ValueError(
        f"unknown tokenizer {spec!r}: not 'byte', not 'hf:<hub name>', and no tokenizer.json found at "
        f"{', '.join(str(c) for c in candidates)}; {hint}."
    )
