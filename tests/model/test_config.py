"""Model configuration: presets, validation errors that name the field, hashing."""
from __future__ import annotations

import pytest

from mhar.model.config import (ConfigError, ModelConfig, ResidualConfig, config_hash, from_dict, model_config,
                         model_config_from_dict, to_dict)
from mhar.model.presets import PRESETS


@pytest.mark.parametrize("preset", list(PRESETS))
def test_every_preset_validates(preset):
    heads = 8 if preset != "debug" else 4
    cfg = model_config(preset, residual={"variant": "mhar", "heads": heads})
    assert all(getattr(cfg, k) == v for k, v in PRESETS[preset].model.items())  # every preset field applied
    assert (cfg.residual.variant, cfg.residual.heads) == ("mhar", heads)
    # the shape constraints attention, GQA, RoPE and head-wise routing need
    assert cfg.resolved_head_dim * cfg.n_heads == cfg.d_model and cfg.resolved_head_dim % 2 == 0
    assert cfg.n_heads % cfg.n_kv_heads == 0 and cfg.d_model % heads == 0
    # an override changes that field only
    deeper = model_config(preset, n_layers=cfg.n_layers + 1)
    assert deeper.n_layers == cfg.n_layers + 1 and deeper.d_model == cfg.d_model and deeper.residual.variant == "baseline"


def test_paper_table1_shapes():
    want = {"100M": (512, 12, 8, 4, 1536), "350M": (1024, 24, 16, 8, 4096), "1B": (1280, 36, 16, 8, 5120)}
    for name, shape in want.items():
        c = model_config(name)
        assert (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.d_ff) == shape
        assert (c.vocab_size, c.rope_theta, c.norm_eps, c.init_std, c.tie_embeddings, c.qk_norm) == (
            151936, 1e4, 1e-6, 0.02, True, True)


@pytest.mark.parametrize("data,field", [
    ({"residual": {"variant": "mhra"}}, "model.residual.variant"),            # unknown variant
    ({"residual": {"hedas": 4}}, "model.residual.hedas"),                     # unknown nested key
    ({"d_modle": 64}, "model.d_modle"),                                       # unknown top-level key
    ({"residual": {"heads": "4"}}, "model.residual.heads"),                   # wrong type
    ({"residual": {"hyper_dynamic": "yes"}}, "model.residual.hyper_dynamic"),  # wrong type
    ({"n_layers": True}, "model.n_layers"),                                   # bool is not an int
    ({"n_layers": 2.0}, "model.n_layers"),                                    # float is not an int
    ({"residual": {"variant": "mhar", "heads": 3}}, "model.residual.heads"),  # H does not divide d=64
    ({"residual": "mhar"}, "model.residual"),                                 # not a mapping
    ({"n_kv_heads": 3}, "model.n_kv_heads"),                                  # GQA grouping
    ({"d_model": 0}, "model.d_model"),
    ({"residual": {"routing_impl": "cuda"}}, "model.residual.routing_impl"),
    ({"residual": {"variant": "block_attnres", "blocks": 9}}, "model.residual.blocks"),  # 2L = 4 < 9
    ({"residual": {"hyper_n": 0}}, "model.residual.hyper_n"),
    ({"rope_scaling": {"low_freq_factor": 1.0}}, "model.rope_scaling"),
    ({"preset": "2B"}, "model.preset"),
    ({"preset": ["debug"]}, "model.preset"),
])
def test_bad_config_names_the_field(data, field):
    data = {"preset": "debug", **data}
    with pytest.raises(ConfigError) as e:
        model_config_from_dict(data)
    assert field in str(e.value)


def test_error_lists_valid_choices():
    with pytest.raises(ConfigError, match="mhar_hw"):
        model_config("debug", residual={"variant": "mhra"})
    with pytest.raises(ConfigError, match="valid keys of model.residual: .*heads"):
        model_config("debug", residual={"hedas": 4})


def test_int_accepted_for_float_and_roundtrip():
    cfg = model_config("debug", rope_theta=10000, residual=ResidualConfig(variant="hyper", hyper_n=2))
    assert isinstance(cfg.rope_theta, float) and cfg.residual.hyper_n == 2
    again = from_dict(ModelConfig, to_dict(cfg), "model")
    assert again == cfg


def test_model_config_from_dict_equals_model_config():
    d = {"preset": "tiny", "residual": {"variant": "mhar", "heads": 4}, "max_seq_len": 128}
    assert model_config_from_dict(d) == model_config("tiny", residual={"variant": "mhar", "heads": 4},
                                                     max_seq_len=128)
    assert d["preset"] == "tiny"  # input is not mutated


def test_config_hash_is_stable_and_sensitive():
    a = model_config("debug", residual={"variant": "mhar", "heads": 4})
    b = model_config_from_dict({"residual": {"heads": 4, "variant": "mhar"}, "preset": "debug"})
    assert config_hash(a) == config_hash(b) and len(config_hash(a)) == 10
    assert config_hash(a) != config_hash(model_config("debug", residual={"variant": "mhar", "heads": 2}))
    assert config_hash({"x": 1, "y": 2}) == config_hash({"y": 2, "x": 1})


def test_every_allowed_routing_impl_is_a_registered_router():
    """The config accepts exactly the routing implementations the router registry provides, in its order (a
    registered name the config refuses, or an accepted one no router answers to, fails here rather than in a
    user's run)."""
    from mhar.model.config import ROUTING_IMPLS
    from mhar.model.routing import ROUTERS, get_router
    from mhar.model.routing.routers import _FACTORIES

    assert ROUTING_IMPLS == ("auto", "eager", "compile", "fused")
    assert tuple(ROUTERS) == ROUTING_IMPLS and set(_FACTORIES) == set(ROUTING_IMPLS)
    for name in ROUTING_IMPLS:
        assert get_router(name).name == name


def test_routing_impl_defaults_to_auto_and_refuses_withdrawn_names():
    """``auto`` is the default; a withdrawn fused variant's name is not a new config value: the error names the
    four choices (stored checkpoints still load it as ``fused``: tests/model/test_routing.py)."""
    from mhar.model.config import stored_routing_impl
    assert ResidualConfig().routing_impl == "auto"
    assert model_config("debug", residual={"variant": "mhar", "heads": 4}).residual.routing_impl == "auto"
    with pytest.raises(ConfigError, match="model.residual.routing_impl: .*'fused_v7_sg8'.*auto, eager, compile, "
                                          "fused.*write fused"):
        model_config("debug", residual={"variant": "mhar", "heads": 4, "routing_impl": "fused_v7_sg8"})
    assert stored_routing_impl("fused_v7_sg8") == stored_routing_impl("fused_v7_sg8_norm") == "fused"
    assert stored_routing_impl("eager") == "eager"


def test_workflow_schema_routing_enums_are_the_registry():
    """config/schema.yaml names the routing implementations twice (a variant's routing_impl, the cost table's
    providers): both lists are the registry's (plus the baseline provider)."""
    from pathlib import Path

    import yaml

    from mhar.model.config import ROUTING_IMPLS
    schema = yaml.safe_load((Path(__file__).resolve().parents[2] / "config" / "schema.yaml").read_text())
    props = schema["properties"]
    variant_enum = props["variants"]["additionalProperties"]["properties"]["routing_impl"]["enum"]
    provider_enum = props["cost"]["properties"]["providers"]["items"]["enum"]
    assert variant_enum == list(ROUTING_IMPLS)
    assert provider_enum == ["baseline", *ROUTING_IMPLS]
