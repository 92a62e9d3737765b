"""The ``cpt:`` config block (workflow/rules/cpt.smk) and the run configs it implies.

:class:`CPTConfig` validates the block; :func:`base_run_config` / :func:`arm_run_config` give the
``mhar.train`` run configs of the stand-in base and of the two arms (identical data and train
sections: same batches, schedule and token budget). Evaluating the arms and tabulating CPT gain /
total gain / MHAR gain is analysis: ``eval.cpt`` (the library never imports ``eval``).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

from mhar.model.config import ConfigError, from_dict

__all__ = ["CPTBaseConfig", "CPTEvalConfig", "CPTConfig", "cpt_config_from_dict", "base_run_config",
           "arm_run_config"]


@dataclass
class CPTBaseConfig:
    """The model to continue: a transformers Llama checkpoint, or a tiny stand-in pretrained here."""

    hf: Optional[str] = None  # local directory or hub name, e.g. marin-community/marin-8b-base
    revision: Optional[str] = None  # hub revision (commit) to pin
    pretrain: Optional[dict] = None  # run config (mhar.runs.config) of a Llama-shaped stand-in base


@dataclass
class CPTEvalConfig:
    tasks: list = field(default_factory=lambda: ["gsm8k", "gpqa_main_zeroshot"])
    subset: str = "full"  # full | first:N | random:N:SEED (eval.run --subset)
    batch_size: int = 8
    device: str = "auto"  # eval.run --device (auto: cuda if available)
    max_length: Optional[int] = None  # context length (default: the model's max_seq_len)
    max_gen_toks: int = 256  # generation budget of generate_until tasks (GSM8K)
    dtype: Optional[str] = None  # float32 | bfloat16 (default: as stored)


@dataclass
class CPTConfig:
    """Schedule-matched plain vs MHAR-delta continued pretraining (validated ``cpt:`` block)."""

    scale: str = "tiny"  # label of the base model's scale in the table ("8B" = the paper's)
    tokenizer: str = "byte"  # tokenizer spec of the base (mhar.data.tokenizer), used for data and evaluation
    base: CPTBaseConfig = field(default_factory=CPTBaseConfig)
    heads: int = 8  # routing heads of the delta form
    delta_block_layers: int = 4  # layers per delta source
    routing_impl: str = "auto"  # mhar.model.config.ROUTING_IMPLS
    check_seq_len: int = 64  # tokens per row of the exactness check batch (2 rows)
    train: dict = field(default_factory=dict)  # run config {data, train} shared by both arms
    eval: CPTEvalConfig = field(default_factory=CPTEvalConfig)
    gpus: int = 0  # GPUs per arm; > 1 launches torchrun (use train.parallel: fsdp for 8B)

    ARMS = ("plain", "mhar")
    VARIANT = {"plain": "baseline", "mhar": "mhar_delta"}

    def validate(self) -> "CPTConfig":
        b = self.base
        if (b.hf is None) == (b.pretrain is None):
            raise ConfigError("cpt.base: give exactly one of cpt.base.hf (a Llama checkpoint: directory or hub "
                              "name) and cpt.base.pretrain (a run config for a tiny stand-in base)")
        for sec in self.train:
            if sec not in ("meta", "data", "train"):
                raise ConfigError(f"cpt.train.{sec}: only data and train sections are allowed (the model comes "
                                  "from the converted checkpoint)")
        for key in ("init_from",):
            if key in (self.train.get("train") or {}):
                raise ConfigError(f"cpt.train.train.{key}: set by the CPT workflow (the converted checkpoint); remove it")
        tok = (self.train.get("data") or {}).get("tokenizer", self.tokenizer)
        if tok != self.tokenizer:
            raise ConfigError(f"cpt.train.data.tokenizer={tok!r} differs from cpt.tokenizer={self.tokenizer!r}; "
                              "the arms must use the base model's tokenizer")
        if self.heads < 1 or self.delta_block_layers < 1 or self.gpus < 0:
            raise ConfigError("cpt.heads and cpt.delta_block_layers must be >= 1, cpt.gpus >= 0")
        return self


def cpt_config_from_dict(d: dict) -> CPTConfig:
    return from_dict(CPTConfig, d, "cpt").validate()


def _merge(base: dict, over: dict) -> dict:
    out = json.loads(json.dumps(base))
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def base_run_config(cfg: CPTConfig) -> dict:
    """Run config of the stand-in base: the given pretrain config forced to the Llama shape."""
    pre = cfg.base.pretrain or {}
    model = dict(pre.get("model") or {})
    res = model.get("residual") or {}
    for key, want in (("qk_norm", False), ("tie_embeddings", model.get("tie_embeddings", False))):
        if model.get(key, want) != want:
            raise ConfigError(f"cpt.base.pretrain.model.{key} must be {want} for a Llama-shaped base")
    if res.get("variant", "baseline") != "baseline":
        raise ConfigError("cpt.base.pretrain.model.residual.variant must be baseline (a plain Llama base)")
    model.update(qk_norm=False, residual={"variant": "baseline"})
    model.setdefault("tie_embeddings", False)
    return _merge(pre, {"meta": {"name": "cpt_base", "size": cfg.scale}, "model": model,
                        "data": {"tokenizer": cfg.tokenizer}})


def arm_run_config(cfg: CPTConfig, arm: str, model_cfg: dict, init_from: str) -> dict:
    """Run config of one CPT arm: the shared {data, train} block + the converted model + init_from.

    Both arms get the same data and train sections (hence the same batches, schedule and token
    budget); only the model's residual section differs.
    """
    if arm not in CPTConfig.ARMS:
        raise ConfigError(f"CPT arm {arm!r}: choose one of {', '.join(CPTConfig.ARMS)}")
    model = {k: v for k, v in model_cfg.items() if k != "preset"}
    return _merge(cfg.train, {"meta": {"name": f"cpt_{arm}", "variant": CPTConfig.VARIANT[arm], "size": cfg.scale},
                              "model": model, "data": {"tokenizer": cfg.tokenizer},
                              "train": {"init_from": str(init_from), "log_batch_hash": True}})
