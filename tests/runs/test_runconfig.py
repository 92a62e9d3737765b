"""Run config: YAML + dotted overrides, validation errors, hashing, example configs."""
from __future__ import annotations

from pathlib import Path

import pytest

from mhar.model.config import ConfigError
from mhar.model.presets import PRESETS
from mhar.runs.config import (IDENTITY_EXCLUDE, PAIRING_VARIES, identity_config, identity_hash, load_run_config,
                              pairing_hash, recorded_run_config, run_config_from_dict, run_identity)
from mhar.safe_yaml import dump_yaml, yaml_load
from mhar.runs.pairing import first_difference

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "config" / "train").glob("*.yaml"))


def test_yaml_file_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  preset: tiny\n  residual: {variant: mhar, heads: 4}\ntrain:\n  lr: 3e-4\n  steps: 10\n")
    cfg = load_run_config(f, ["train.steps=20", "model.residual.heads=8", "data.seq_len=128", "meta.size=small",
                              "train.warmup_steps=2"])
    assert cfg.train.lr == 3e-4 and isinstance(cfg.train.lr, float)  # YAML-1.2 float, not the string "3e-4"
    assert cfg.train.steps == 20 and cfg.model.residual.heads == 8 and cfg.data.seq_len == 128
    assert cfg.model.d_model == PRESETS["tiny"].model["d_model"]
    assert (cfg.variant, cfg.size, cfg.seed, cfg.data_seed) == ("mhar", "small", 0, 0)
    assert load_run_config(None, ["data.seed=5"]).data_seed == 5


def test_resolved_config_round_trips(tmp_path):
    cfg = load_run_config(None, ["model.preset=debug", "model.n_layers=3", "train.lr=2e-3"])
    again = run_config_from_dict(yaml_load(dump_yaml(cfg.to_dict())))
    assert again.to_dict() == cfg.to_dict() and identity_hash(again) == identity_hash(cfg)


@pytest.mark.parametrize("overrides, match", [
    (["train.lrr=1"], "train.lrr"),
    (["trainer.lr=1"], "trainer"),
    (["model.residual.variant=nope"], "model.residual.variant"),
    (["model.d_modell=3"], "model.d_modell"),
    (["train.steps=ten"], "train.steps: expected int"),
    (["train.global_batch=10", "train.micro_batch=4"], "train.global_batch"),
    (["data.seq_len=100000"], "model.max_seq_len"),
    (["data.holdout=random"], "data.holdout"),
    (["train.device=tpu"], "train.device"),
    (["train.lr"], "key=value"),
    (["train.tracking=[tensorboard,mlflow]"], "train.tracking: unknown tracker.*'mlflow'"),
    (["train.tracking=3"], "train.tracking: expected a list"),
])
def test_bad_config_names_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_run_config(None, overrides)


def test_missing_or_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_run_config(tmp_path / "none.yaml")
    (tmp_path / "bad.yaml").write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_run_config(tmp_path / "bad.yaml")


def _set(d: dict, dotted: str, value) -> dict:
    """``d`` with the dotted key set to ``value``."""
    *parents, leaf = dotted.split(".")
    node = d
    for p in parents:
        node = node[p]
    node[leaf] = value
    return d


def test_pairing_hash_sees_everything_but_the_residual_section():
    """Paired runs differ in the residual variant and its knobs alone: same size, seeds, data order, schedule."""
    base = ["model.preset=debug"]
    h = pairing_hash(load_run_config(None, base))
    for same in (["model.residual.variant=mhar", "model.residual.heads=4"], ["model.residual.variant=hyper",
                 "model.residual.hyper_n=2"], ["meta.size=x"], ["meta.variant=mhar8"], ["train.log_every=1"],
                 ["model.residual.routing_impl=compile"], ["train.compile=false"], ["data.seed=0"]):
        assert pairing_hash(load_run_config(None, base + same)) == h, same
    for other in (["train.lr=1e-2"], ["data.seq_len=64"], ["data.corpus=nltk_gutenberg"], ["model.n_layers=3"],
                  ["train.steps=7"], ["train.seed=3"], ["data.seed=7"], ["data.tokenizer=gpt2"],
                  ["train.warmup_steps=3"], ["train.global_batch=32", "train.micro_batch=16"]):
        assert pairing_hash(load_run_config(None, base + other)) != h, other
    assert PAIRING_VARIES == ("model.residual",)


def test_identity_hash_sees_every_result_knob_and_nothing_else():
    base = ["model.preset=debug", "model.residual.variant=mhar", "model.residual.heads=4"]
    cfg = load_run_config(None, base)
    h = identity_hash(cfg)
    # every key of the one exclusion table changes nothing (set to another valid value)
    other_value = {"meta.name": "relabelled", "meta.variant": "x", "meta.size": "y", "model.preset": "tiny",
                   "model.residual.routing_impl": "compile", "train.compile": False, "train.cuda_graph": False,
                   "train.device": "cpu", "train.parallel": "fsdp", "train.micro_batch": 8, "train.threads": 3,
                   "train.log_every": 1, "train.checkpoint_every": 7, "train.save_model_every_checkpoint": True,
                   "train.log_batch_hash": True, "data.cache_dir": "/elsewhere", "data.data_dir": "/mirror",
                   "train.tracking": ["tensorboard", "wandb"], "train.tracking_group": "0123abcd",
                   "train.tracking_required": True}
    assert set(other_value) == set(IDENTITY_EXCLUDE)
    for key, value in other_value.items():
        moved = run_config_from_dict(_set(cfg.to_dict(), key, value))  # model.preset: the resolved shape stays
        assert identity_hash(moved) == h, key
    assert identity_hash(load_run_config(None, base + ["data.seed=0"])) == h  # data.seed 0 = the default (seed 0)
    for other in (["model.residual.heads=2"], ["model.residual.routing_eps=1e-5"], ["data.seed=1"], ["train.seed=1"],
                  ["train.lr=1e-2"], ["train.z_loss=1e-4"], ["data.seq_len=64"], ["model.n_layers=3"],
                  ["train.dtype=fp32"], ["train.warmup_steps=3"], ["train.eval_every=7"], ["train.tail_k=2"],
                  ["train.global_batch=32", "train.micro_batch=32"], ["data.val_tokens=4096"]):
        assert identity_hash(load_run_config(None, base + other)) != h, other
    run = run_identity(load_run_config(None, base + ["meta.name=mhar_h4", "data.seed=5"]))
    cfg5 = load_run_config(None, base + ["data.seed=5"])
    assert run == {"label": "mhar_h4", "residual": run["residual"], "size": "debug", "seed": 0, "data_seed": 5,
                   "identity": identity_hash(cfg5), "pairing": pairing_hash(cfg5), "config": identity_config(cfg5)}
    assert run["residual"]["variant"] == "mhar" and run["residual"]["heads"] == 4
    assert "routing_impl" not in run["residual"] and "routing_impl" not in run["config"]["model"]["residual"]
    assert run["config"]["data"]["seed"] == 5 and "cache_dir" not in run["config"]["data"]


# identity_hash of the example configs as the code before train.tracking computed them: bookkeeping keys
# added to the config must not move a recorded run's identity (its run folder)
RECORDED_IDENTITIES = {"cpu_tiny.yaml": "42ebb8dbd894bee7", "debug.yaml": "f957ed4e9de26b72",
                       "gpu_smoke.yaml": "23aa6ce7161a3cca", "paper_100M.yaml": "d40157578e7b73f7",
                       "paper_1B.yaml": "44f5b2c6fb55c278"}


def test_example_config_identities_are_unchanged_and_tracking_is_bookkeeping():
    assert {p.name: identity_hash(load_run_config(p)) for p in CONFIGS} == RECORDED_IDENTITIES
    for p in CONFIGS:
        tracked = load_run_config(p, ["train.tracking=[wandb,tensorboard]", "train.tracking_group=g"])
        assert identity_hash(tracked) == RECORDED_IDENTITIES[p.name]
        assert tracked.train.tracking == ["wandb", "tensorboard"]
    for value, names in (("none", []), ("[]", []), ("null", []), ("wandb", ["wandb"]),
                         ("[tensorboard,tensorboard]", ["tensorboard"])):
        assert load_run_config(None, [f"train.tracking={value}"]).train.tracking == names, value
    assert load_run_config(None).to_dict()["train"]["tracking"] == []


def test_first_difference_names_the_first_field_in_config_order():
    a = identity_config(load_run_config(None, ["model.preset=debug", "data.seed=0", "train.lr=1e-3"]))
    b = identity_config(load_run_config(None, ["model.preset=debug", "data.seed=7", "train.lr=2e-3",
                                               "model.residual.variant=mhar"]))
    assert first_difference(a, a) is None
    assert first_difference(a, b) == ("model.residual.variant", "baseline", "mhar")
    assert first_difference(a, b, ignore=PAIRING_VARIES) == ("data.seed", 0, 7)  # data before train
    assert first_difference(a, b, ignore=PAIRING_VARIES + ("data.seed",)) == ("train.lr", 1e-3, 2e-3)


def test_a_recorded_config_with_a_withdrawn_routing_impl_keeps_its_identity():
    cfg = load_run_config(None, ["model.preset=debug", "model.residual.variant=mhar"])
    raw = _set(cfg.to_dict(), "model.residual.routing_impl", "fused_v7_sg8_withdrawn")
    with pytest.raises(ConfigError, match="routing_impl"):
        run_config_from_dict(raw)
    assert identity_hash(recorded_run_config(raw)) == identity_hash(cfg)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_example_configs_load(path):
    cfg = load_run_config(path)
    assert cfg.train.global_batch % cfg.train.micro_batch == 0


def test_example_configs_exist():
    names = {p.name for p in CONFIGS}
    assert {"debug.yaml", "cpu_tiny.yaml", "paper_100M.yaml", "gpu_smoke.yaml"} <= names


@pytest.mark.parametrize("overrides, key", [
    (["train.lr=.inf"], "train.lr"), (["train.lr=.nan"], "train.lr"), (["train.grad_clip=.inf"], "train.grad_clip"),
    (["train.z_loss=.nan"], "train.z_loss"), (["data.val_fraction=.nan"], "data.val_fraction"),
])
def test_non_finite_numbers_are_refused(overrides, key):
    with pytest.raises(ConfigError, match=rf"{key}: must be a finite number"):
        load_run_config(None, overrides)




def test_dumped_configs_read_back_equal_even_where_a_string_reads_as_a_number():
    """A hash such as 0e093237 (train.tracking_group) is a float to YAML 1.2: dump_yaml quotes it."""
    cfg = load_run_config(None, ["train.tracking=wandb", "train.tracking_group='0e093237'", "meta.name='1e5'"])
    assert cfg.train.tracking_group == "0e093237"
    text = dump_yaml(cfg.to_dict())
    assert yaml_load(text) == cfg.to_dict() and run_config_from_dict(yaml_load(text)).train.tracking_group == "0e093237"


CPU_TINY = Path(__file__).resolve().parents[2] / "config" / "train" / "cpu_tiny.yaml"


def test_a_variant_override_drops_the_other_variants_knobs_with_one_warning():
    """cpu_tiny.yaml says {variant: mhar, heads: 4}: `model.residual.variant=attnres` kept heads: 4 silently (in the
    recorded config and the run identity) though attnres has one head. A knob the new variant does not read (its
    class's `knobs`) is dropped with one warning line naming it; one it reads, or one the overrides set, stays."""
    warned = []
    cfg = load_run_config(CPU_TINY, ["model.residual.variant=attnres"], warn=warned.append)
    assert cfg.model.residual.heads == 1 and cfg.to_dict()["model"]["residual"]["heads"] == 1
    assert len(warned) == 1 and warned[0].startswith("warning: model.residual.heads: 4 ("), warned
    assert "cpu_tiny.yaml" in warned[0] and "variant=attnres" in warned[0] and warned[0].endswith("dropped")
    raw = yaml_load(CPU_TINY.read_text())
    raw["model"]["residual"] = {"variant": "attnres"}  # the same run written without the mhar knob
    assert identity_hash(cfg) == identity_hash(run_config_from_dict(raw))

    warned.clear()
    assert load_run_config(CPU_TINY, ["model.residual.variant=baseline"], warn=warned.append).model.residual.heads == 1
    assert len(warned) == 1 and "model.residual.heads: 4" in warned[0] and "variant=baseline" in warned[0]
    warned.clear()
    assert load_run_config(CPU_TINY, ["model.residual.variant=mhar_delta"], warn=warned.append).model.residual.heads == 4
    kept = load_run_config(CPU_TINY, ["model.residual.variant=baseline", "model.residual.heads=4"], warn=warned.append)
    assert kept.model.residual.heads == 4 and warned == []  # the command line's own knob is the user's word
    assert load_run_config(CPU_TINY, ["train.steps=3"], warn=warned.append).model.residual.heads == 4 and not warned
    # a variant of one's own declares no knobs: nothing is dropped, and its check_config decides (one line)
    with pytest.raises(ConfigError, match="toy_gated has no routing heads, got 4"):
        load_run_config(CPU_TINY, ["model.residual.variant=toy_gated", "model.residual.module=tests.toy_variant"],
                        warn=warned.append)
    assert not warned


def test_the_trainer_says_which_knob_a_variant_override_dropped(capsys, tmp_path):
    from mhar.training.cli import main

    assert main([str(CPU_TINY), "model.residual.variant=attnres", "--out", str(tmp_path / "run"),
                 "--print-config"]) == 0
    out, err = capsys.readouterr()
    assert [ln for ln in err.splitlines() if ln.strip()] == [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(err.strip().splitlines()) == 1 and "model.residual.heads: 4" in err
    assert yaml_load(out)["model"]["residual"]["heads"] == 1
