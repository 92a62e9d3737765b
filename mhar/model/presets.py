"""Named model sizes: the one record of each size's shape, display order, benchmark micro-batch and paper scale.

``mhar.model.config.model_config(preset)`` builds a size's model config from its ``Preset.model``; tables order
sizes by ``size_key``; the benchmarks run a size at its ``micro_batch``; a size whose ``paper_scale`` is set is
compared with the paper's numbers of that scale. A new size is one ``register_preset`` call (a test module may add
a toy size the same way). This module imports nothing but the standard library (the analysis environment, which
has no torch, sorts sizes with it). ``python -m mhar.model.preset_table`` prints every size's parameter counts.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

# 100M/350M/1B are the paper's Table 1 shapes (Qwen3 tokenizer vocab 151936).
QWEN3_VOCAB = 151936


@dataclass(frozen=True)
class Preset:
    """One named size. ``model``: ModelConfig fields (``model_config(name, **overrides)`` applies them first);
    ``order``: where the size sorts in tables and listings; ``micro_batch``: (sequences, sequence length) of one
    GPU step in the benchmarks (None: the benchmarks do not run it); ``paper_scale``: the paper's scale this size
    is (e.g. "100M"; None: not one of the paper's sizes)."""

    name: str
    order: int
    model: dict[str, Any] = field(default_factory=dict)
    micro_batch: Optional[tuple[int, int]] = None
    paper_scale: Optional[str] = None


PRESETS: dict[str, Preset] = {}


def register_preset(preset: Preset) -> Preset:
    """Add ``preset`` under its name (the same record again is a no-op; another record of that name is refused)."""
    if not isinstance(preset, Preset):
        raise TypeError(f"register_preset needs a mhar.model.presets.Preset, got {type(preset).__name__}")
    old = PRESETS.get(preset.name)
    if old is not None and old != preset:
        raise ValueError(f"size preset {preset.name!r} is registered twice with different records; rename one")
    PRESETS[preset.name] = preset
    return preset


def size_key(size: str) -> tuple:
    """Sort key of a size name: its preset's ``order``, then the name; sizes without a preset sort last."""
    p = PRESETS.get(size)
    return (0, p.order, size) if p is not None else (1, 0, str(size))


for _p in (
    # one optimizer step on CPU in well under a second
    Preset("debug", 0, dict(vocab_size=257, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192,
                            max_seq_len=256), micro_batch=(2, 64)),
    # a few M parameters; trains usefully on CPU in minutes (byte-level vocab)
    Preset("tiny", 1, dict(vocab_size=257, d_model=256, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=768,
                           max_seq_len=512), micro_batch=(2, 128)),
    # ~25M non-embedding parameters, byte-level: what one GPU trains on ~10M tokens in seconds (gpu_small)
    Preset("small", 2, dict(vocab_size=257, d_model=512, n_layers=8, n_heads=8, n_kv_heads=4, d_ff=1536,
                            max_seq_len=1024)),
    # the paper's sizes, at the paper's micro-batch
    Preset("100M", 3, dict(vocab_size=QWEN3_VOCAB, d_model=512, n_layers=12, n_heads=8, n_kv_heads=4, d_ff=1536,
                           max_seq_len=2048), micro_batch=(8, 2048), paper_scale="100M"),
    Preset("350M", 4, dict(vocab_size=QWEN3_VOCAB, d_model=1024, n_layers=24, n_heads=16, n_kv_heads=8, d_ff=4096,
                           max_seq_len=1024), micro_batch=(4, 1024), paper_scale="350M"),
    Preset("1B", 5, dict(vocab_size=QWEN3_VOCAB, d_model=1280, n_layers=36, n_heads=16, n_kv_heads=8, d_ff=5120,
                         max_seq_len=1024), micro_batch=(2, 1024), paper_scale="1B"),
):
    register_preset(_p)
del _p

__all__ = ["Preset", "PRESETS", "QWEN3_VOCAB", "register_preset", "size_key"]
