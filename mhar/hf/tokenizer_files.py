"""Tokenizer files of an exported model, so ``AutoTokenizer.from_pretrained(DIR)`` gives our ids.

* ``byte`` (the harness's built-in byte tokenizer: ids 0..255 = UTF-8 bytes, 256 = end-of-text): a
  ``tokenizers`` byte-level BPE with no merges whose vocabulary maps each byte's printable stand-in
  (the byte-level pre-tokenizer's alphabet) to the byte's own value, plus ``<|endoftext|>`` = 256.
  Splitting is off (``use_regex=False``), so every byte is one token: ``encode`` equals
  ``list(text.encode("utf-8"))`` (``split_special_tokens``: the text "<|endoftext|>" is bytes too).
* a ``tokenizer.json`` path / directory: copied with its ``tokenizer_config.json`` and
  ``special_tokens_map.json`` when present; a bare ``tokenizer.json`` gets a ``tokenizer_config.json`` naming
  the end-of-text token the harness uses (and the declared BOS, if any).
* ``hf:<name>``: ``AutoTokenizer.from_pretrained(name).save_pretrained(DIR)`` (needs the hub or its cache).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer

from mhar.data.tokenizer import get_tokenizer
from mhar.env import data_dir

BYTE_EOT = "<|endoftext|>"
_COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def byte_alphabet() -> dict[int, str]:
    """Byte -> printable character of the byte-level pre-tokenizer (bytes that print as themselves keep
    their character; the others take the code points 256, 257, ... in byte order)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def byte_tokenizer_json() -> str:
    """``tokenizer.json`` of the byte tokenizer (built with the ``tokenizers`` library)."""
    vocab = {ch: b for b, ch in byte_alphabet().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(BYTE_EOT, special=True, normalized=False)])
    if tok.token_to_id(BYTE_EOT) != 256:
        raise RuntimeError(f"byte tokenizer: {BYTE_EOT} got id {tok.token_to_id(BYTE_EOT)}, expected 256")
    return tok.to_str()


def _config(eos: str, bos: Optional[str], max_len: int) -> dict:
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "pad_token": eos,
           "model_max_length": max_len, "clean_up_tokenization_spaces": False}
    if bos is not None:
        cfg["bos_token"] = bos
    return cfg


def write_tokenizer(spec: Optional[str], out: Path, max_len: int) -> dict:
    """Write the tokenizer files of ``spec`` into ``out``; returns {"spec", "eos_token_id", "bos_token_id",
    "files"} (ids as the harness tokenizer declares them). ``spec`` None writes nothing."""
    out = Path(out)
    if spec is None:
        return {"spec": None, "eos_token_id": None, "bos_token_id": None, "files": []}
    tok = get_tokenizer(spec)
    if spec == "byte":
        (out / "tokenizer.json").write_text(byte_tokenizer_json(), encoding="utf-8")
        # split_special_tokens: "<|endoftext|>" in a text is bytes, as the harness encodes it
        cfg = {**_config(BYTE_EOT, None, max_len), "split_special_tokens": True}
        (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
        return {"spec": spec, "eos_token_id": 256, "bos_token_id": None,
                "files": ["tokenizer.json", "tokenizer_config.json"]}
    if spec.startswith("hf:"):
        AutoTokenizer.from_pretrained(spec[3:]).save_pretrained(str(out))
        files = sorted(p.name for p in out.iterdir() if p.name.startswith(("tokenizer", "special_tokens", "vocab",
                                                                              "merges", "added_tokens")))
        return {"spec": spec, "eos_token_id": tok.eot_id, "bos_token_id": tok.bos_id, "files": files}
    src = Path(spec)
    if not src.exists():
        root = data_dir(None)
        src = root / spec if root is not None else src
    src_dir = src if src.is_dir() else src.parent
    tok_json = src if src.is_file() else src / "tokenizer.json"
    shutil.copyfile(tok_json, out / "tokenizer.json")
    files = ["tokenizer.json"]
    for name in _COPIED[1:]:
        if (src_dir / name).is_file():
            shutil.copyfile(src_dir / name, out / name)
            files.append(name)
    if "tokenizer_config.json" not in files:
        backend = tok._tok  # a tokenizers.Tokenizer: name the harness's end-of-text / BOS tokens
        eos = backend.id_to_token(tok.eot_id)
        bos = backend.id_to_token(tok.bos_id) if tok.bos_id is not None else None
        (out / "tokenizer_config.json").write_text(json.dumps(_config(eos, bos, max_len), indent=1))
        files.append("tokenizer_config.json")
    return {"spec": spec, "eos_token_id": tok.eot_id, "bos_token_id": tok.bos_id, "files": files}
