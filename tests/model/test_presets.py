"""The size record (mhar.model.presets) and the variants' display attributes (mhar.model.residuals.display_record)."""
from __future__ import annotations

import pytest
import torch

import tests.toy_size  # noqa: F401  (registers toy_xs)
import tests.toy_variant  # noqa: F401  (registers toy_gated)
from mhar.model.config import ConfigError, model_config
from mhar.model.presets import PRESETS, Preset, register_preset, size_key
from mhar.model.residuals import display_record, residual_class, variant_names
from mhar.model.transformer import Transformer


def test_preset_from_a_test_module_builds_a_model():
    cfg = model_config("toy_xs", residual={"variant": "mhar", "heads": 2})
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.max_seq_len) == (97, 32, 1, 64)
    model = Transformer(cfg)
    out = model(torch.randint(0, 97, (2, 16)), labels=torch.randint(0, 97, (2, 16)))
    assert out.logits.shape == (2, 16, 97) and torch.isfinite(out.loss)


def test_sizes_sort_by_their_record():
    assert sorted(["1B", "toy_xs", "zz_unknown", "100M", "8B", "debug", "350M", "small", "tiny"], key=size_key) == [
        "debug", "tiny", "small", "100M", "350M", "1B", "toy_xs", "8B", "zz_unknown"]
    assert [PRESETS[s].paper_scale for s in ("100M", "350M", "1B")] == ["100M", "350M", "1B"]
    assert PRESETS["small"].paper_scale is None and PRESETS["100M"].micro_batch == (8, 2048)


def test_a_taken_size_name_is_refused():
    register_preset(PRESETS["toy_xs"])  # the same record again: no-op
    with pytest.raises(ValueError, match="toy_xs"):
        register_preset(Preset("toy_xs", order=1, model={"d_model": 16}))
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        model_config("nope")


def test_display_record_reads_the_class_attributes():
    cls = residual_class("toy_gated")
    rec = display_record("toy_gated")
    assert rec == {"display": "toy gated residual", "order": 90, "shows_heads": cls.shows_heads}
    saved = cls.display_name, cls.table_order, cls.shows_heads
    try:  # a variant's display is its class attributes, nothing else
        cls.display_name, cls.table_order, cls.shows_heads = "Toy gate", 7, True
        assert display_record("toy_gated") == {"display": "Toy gate", "order": 7, "shows_heads": True}
        cls.display_name = None  # no name of its own: the registered name
        assert display_record("toy_gated")["display"] == "toy_gated"
    finally:
        cls.display_name, cls.table_order, cls.shows_heads = saved


def test_built_in_display_names_and_order():
    """What the paper calls each built-in variant, in the tables' order; H is shown for mhar and mhar_delta."""
    want = [("baseline", "baseline", False), ("hyper", "hyper-conn", False),
            ("attnres", "single-head (AttnRes)", False), ("block_attnres", "Block AttnRes", False),
            ("mhar", "MHAR", True), ("mhar_hw", "MHAR-HW", False), ("mhar_delta", "MHAR-delta", True),
            ("open_attnres", "Open AttnRes (block)", False), ("open_attnres_full", "Open AttnRes (full)", False)]
    builtin = [v for v in variant_names() if residual_class(v).__module__.startswith("mhar.")]
    recs = sorted(((display_record(v)["order"], v) for v in builtin))
    assert [v for _, v in recs] == [v for v, _, _ in want]
    assert [(display_record(v)["display"], display_record(v)["shows_heads"]) for v, _, _ in want] == [
        (d, h) for _, d, h in want]
