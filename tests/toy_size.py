"""A size defined outside mhar.model.presets (tests/model/test_presets.py): registering it is the whole of adding a size."""
from __future__ import annotations

from mhar.model.presets import Preset, register_preset

TOY = register_preset(Preset("toy_xs", order=50, micro_batch=(1, 32),
                             model=dict(vocab_size=97, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64,
                                        max_seq_len=64)))
