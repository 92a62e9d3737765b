"""Run configuration: one YAML file (+ ``key=value`` overrides) -> a validated :class:`RunConfig`.

Layout of a run config (every key optional; defaults below are the code's and the
example configs in ``config/train/`` only state what differs)::

    meta:  {name, variant, size}             # labels; variant/size default to the model's
    model: {preset: tiny, residual: {variant: mhar, heads: 4}, <ModelConfig overrides>}
    data:  {corpus, text_field, tokenizer, seq_len, holdout, val_fraction, val_tokens,
            val_corpus, max_train_tokens, data_dir, cache_dir, seed}
    train: {seed, steps, global_batch, micro_batch, lr, warmup_steps, min_lr_ratio,
            weight_decay, beta1, beta2, eps, grad_clip, eval_every, tail_k,
            checkpoint_every, save_model_every_checkpoint, log_every, device, dtype,
            compile, threads, parallel,
            init_from, decay_filter, z_loss, ema_decay, log_batch_hash,   # CPT options (mhar.cpt)
            tracking, tracking_group, tracking_required}                    # mhar.training.tracking

Overrides use dotted keys and YAML scalars: ``train.lr=3e-4 model.residual.heads=8``.
Unknown keys and wrong types raise :class:`mhar.model.config.ConfigError` naming the key.

Run identity (one name, one exclusion table): ``identity_hash(cfg)`` hashes :func:`identity_config`, the
resolved config without :data:`IDENTITY_EXCLUDE` (labels, paths, cadence, execution choices such as
``model.residual.routing_impl``, ``train.compile`` or ``train.device``), ``data.seed`` resolved. A run
directory belongs to one identity (the trainer refuses another) and the workflow's run path carries it once:
``results/runs/<label>/<size>/seed<k>/<identity[:10]>/`` (``mhar.runs.layout``). Pairing is derived from the same
identity: two runs are paired iff their identity configs differ only under :data:`PAIRING_VARIES` (the
residual section), i.e. iff their ``pairing_hash`` is equal; the rule and :func:`first_difference` (the first
field that differs) live in :mod:`mhar.runs.pairing`. :func:`run_identity` is the ``run`` record every result carries.
"""
from __future__ import annotations

import copy
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import yaml

from mhar.data.config import DataConfig
from mhar.model.choices import brief
from mhar.model.config import (ConfigError, ModelConfig, config_hash, from_dict, inapplicable_knobs,
                               model_config_from_dict)
from mhar.runs.pairing import PAIRING_VARIES
from mhar.safe_yaml import YAMLRefused, read_yaml_file, yaml_error_line, yaml_load

__all__ = [
    "MetaConfig", "TrainConfig", "RunConfig", "load_run_config", "run_config_from_dict",
    "parse_overrides", "apply_overrides", "identity_config", "identity_hash", "pairing_config", "pairing_hash",
    "recorded_run_config", "run_identity", "IDENTITY_EXCLUDE",
    "PAIRING_VARIES", "IDENTITY_LEN", "PATH_ID_LEN", "TRACKERS", "tracker_names", "drop_inapplicable_knobs",
]

TRACKERS = ("tensorboard", "wandb")  # train.tracking: experiment trackers (mhar.training.tracking)


@dataclass
class MetaConfig:
    """Labels. ``variant``/``size`` are path components (default: residual variant / model preset)."""

    name: str = "run"
    variant: Optional[str] = None
    size: Optional[str] = None


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping (paper defaults for the optimizer)."""

    seed: int = 0
    steps: int = 200
    global_batch: int = 16  # sequences per optimizer step (over all ranks and accumulation steps)
    micro_batch: int = 16  # sequences per forward/backward on one rank
    lr: float = 1e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1  # cosine decays to min_lr_ratio * lr at the last step
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # global-norm clip; 0 disables
    eval_every: int = 50
    tail_k: int = 3  # summary metric: mean of the last tail_k evaluations
    checkpoint_every: int = 100
    save_model_every_checkpoint: bool = False
    log_every: int = 10
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16
    compile: Any = "auto"  # auto (CUDA: compile the step's pieces; CPU: eager) | true | false (mhar.training.step)
    cuda_graph: Any = "auto"  # auto (one CUDA process with compile: replay the whole step) | true | false
    threads: int = 0  # CPU intra-op threads (torch.set_num_threads); 0 = torch's default
    parallel: str = "ddp"  # ddp | fsdp (FSDP2 fully_shard; only used under torchrun)
    # Continued pretraining (mhar.cpt; defaults leave from-scratch training unchanged):
    init_from: Optional[str] = None  # exported model.pt whose weights start the run (AdamW cold-starts)
    decay_filter: str = "all"  # all | matrices (no decay on embeddings, norms, biases, routing params)
    z_loss: float = 0.0  # weight of the z-loss mean(logsumexp(logits)^2); 0 disables
    ema_decay: float = 0.0  # > 0: keep an EMA of the weights; model.pt then holds the EMA weights
    log_batch_hash: bool = False  # train rows of metrics.jsonl carry batch_sha256 (paired-arm check)
    # Experiment tracking (mhar.training.tracking): a list of TRACKERS, or none; the W&B group of the run; whether a
    # tracker's failure stops the run (one error line, checkpoint kept) instead of a warning and training on without it
    tracking: Any = field(default_factory=list)
    tracking_group: Optional[str] = None
    tracking_required: bool = False


@dataclass
class RunConfig:
    meta: MetaConfig
    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    preset: Optional[str] = None  # the model preset the model section started from

    @property
    def variant(self) -> str:
        return self.meta.variant or self.model.residual.variant

    @property
    def size(self) -> str:
        return self.meta.size or self.preset or f"d{self.model.d_model}L{self.model.n_layers}"

    @property
    def seed(self) -> int:
        return self.train.seed

    @property
    def data_seed(self) -> int:
        return self.data.seed if self.data.seed is not None else self.train.seed

    def to_dict(self) -> dict:
        """Fully resolved, plain-dict form (round-trips through :func:`run_config_from_dict`)."""
        model = {"preset": self.preset, **asdict(self.model)}
        meta = asdict(self.meta)
        meta["variant"], meta["size"] = self.variant, self.size
        return {"meta": meta, "model": model, "data": asdict(self.data), "train": asdict(self.train)}

    def validate(self) -> "RunConfig":
        d, t = self.data, self.train

        def need(cond: bool, key: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"{key}: {msg}")

        for sec, obj in (("data", d), ("train", t)):
            for key, value in asdict(obj).items():
                need(not isinstance(value, float) or math.isfinite(value), f"{sec}.{key}",
                     f"must be a finite number, got {value}")
        need(d.seq_len > 0, "data.seq_len", f"must be > 0, got {d.seq_len}")
        need(d.seq_len <= self.model.max_seq_len, "data.seq_len",
             f"{d.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}; lower it or raise model.max_seq_len")
        need(0.0 < d.val_fraction < 1.0, "data.val_fraction", f"must be in (0, 1), got {d.val_fraction}")
        need(d.val_tokens >= d.seq_len, "data.val_tokens", f"must be >= data.seq_len={d.seq_len}, got {d.val_tokens}")
        need(d.holdout in ("auto", "tail", "documents"), "data.holdout",
             f"unknown holdout {brief(d.holdout)}; choose auto, tail or documents")
        need(d.max_train_tokens is None or d.max_train_tokens > d.seq_len, "data.max_train_tokens",
             "must exceed data.seq_len (or be null for all)")
        for key in ("steps", "global_batch", "micro_batch", "eval_every", "tail_k", "checkpoint_every", "log_every"):
            need(getattr(t, key) > 0, f"train.{key}", f"must be > 0, got {getattr(t, key)}")
        need(t.global_batch % t.micro_batch == 0, "train.global_batch",
             f"{t.global_batch} is not a multiple of train.micro_batch={t.micro_batch}")
        need(t.threads >= 0, "train.threads", "must be >= 0 (0 = torch default)")
        need(t.warmup_steps >= 0, "train.warmup_steps", "must be >= 0")
        need(0.0 <= t.min_lr_ratio <= 1.0, "train.min_lr_ratio", f"must be in [0, 1], got {t.min_lr_ratio}")
        need(t.lr > 0, "train.lr", f"must be > 0, got {t.lr}")
        need(t.grad_clip >= 0, "train.grad_clip", "must be >= 0 (0 disables clipping)")
        need(t.device in ("auto", "cpu", "cuda"), "train.device",
             f"unknown device {brief(t.device)}; choose auto, cpu or cuda")
        need(t.dtype in ("auto", "fp32", "bf16"), "train.dtype",
             f"unknown dtype {brief(t.dtype)}; choose auto, fp32 or bf16")
        need(t.parallel in ("ddp", "fsdp"), "train.parallel",
             f"unknown parallel mode {brief(t.parallel)}; choose ddp or fsdp")
        for key in ("compile", "cuda_graph"):
            v = getattr(t, key)
            need(v == "auto" or isinstance(v, bool), f"train.{key}", f"expected auto, true or false, got {brief(v)}")
        need(t.decay_filter in ("all", "matrices"), "train.decay_filter",
             f"unknown filter {brief(t.decay_filter)}; choose all or matrices")
        need(t.z_loss >= 0, "train.z_loss", f"must be >= 0, got {t.z_loss}")
        need(0.0 <= t.ema_decay < 1.0, "train.ema_decay", f"must be in [0, 1) (0 disables), got {t.ema_decay}")
        t.tracking = tracker_names(t.tracking)
        return self


def tracker_names(value: Any) -> list[str]:
    """``train.tracking`` as a list of :data:`TRACKERS`: ``none``/null/[] -> [], a name -> [name];
    ConfigError for anything else."""
    if value is None or value == "none":
        return []
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"train.tracking: expected a list of tracker names ({', '.join(TRACKERS)}) or none, "
                          f"got {brief(value)}")
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ConfigError(f"train.tracking: unknown tracker(s) {', '.join(map(brief, unknown[:5]))}; "
                          f"choose from {', '.join(TRACKERS)} (or none)")
    return list(dict.fromkeys(names))


# --- overrides ----------------------------------------------------------------------------
def parse_overrides(items: Sequence[str]) -> list[tuple[list[str], Any]]:
    """``["train.lr=3e-4", ...]`` -> ``[(["train", "lr"], 0.0003), ...]`` (values as YAML scalars)."""
    out = []
    for item in items:
        if "=" not in item:
            raise ConfigError(f"override {brief(item)}: expected key=value with a dotted key, e.g. train.lr=3e-4")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"override {brief(item)}: empty component in key {brief(key)}")
        try:  # one value on a command line: no alias is needed in it
            parsed = yaml_load(value, aliases=False, what=f"override {brief(key.strip())}") if value.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(f"override {brief(key.strip())}: {yaml_error_line(e)}") from None
        out.append((parts, parsed))
    return out


def apply_overrides(raw: dict, overrides: Sequence[str] | Sequence[tuple[list[str], Any]]) -> dict:
    """Return a copy of ``raw`` with overrides set (unknown keys are caught later by validation)."""
    raw = copy.deepcopy(raw)
    parsed = parse_overrides(overrides) if overrides and isinstance(overrides[0], str) else overrides
    for parts, value in parsed:
        node = raw
        for i, p in enumerate(parts[:-1]):
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {'.'.join(parts)}: {'.'.join(parts[:i + 1])} is not a section")
            node = nxt
        node[parts[-1]] = value
    return raw


# --- loading ------------------------------------------------------------------------------
_SECTIONS = ("meta", "model", "data", "train")


def run_config_from_dict(raw: dict) -> RunConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"run config: expected a mapping with sections {', '.join(_SECTIONS)}, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"unknown config section(s) {', '.join(unknown)}; valid sections: {', '.join(_SECTIONS)}")
    sections = {k: (raw.get(k) or {}) for k in _SECTIONS}
    for k, v in sections.items():
        if not isinstance(v, dict):
            raise ConfigError(f"{k}: expected a mapping, got {type(v).__name__}")
    model_d = dict(sections["model"])
    preset = model_d.get("preset")
    cfg = RunConfig(
        meta=from_dict(MetaConfig, sections["meta"], "meta"),
        model=model_config_from_dict(model_d),
        data=from_dict(DataConfig, sections["data"], "data"),
        train=from_dict(TrainConfig, sections["train"], "train"),
        preset=preset,
    )
    return cfg.validate()


def drop_inapplicable_knobs(raw: dict, merged: dict, parsed: Sequence[tuple[list[str], Any]], source: str,
                            warn: Callable[[str], None]) -> None:
    """An override of ``model.residual.variant`` leaves the file's knobs of the other variant behind (cpu_tiny.yaml's
    ``heads: 4`` under ``model.residual.variant=attnres``): drop from ``merged`` each one the new variant does not
    read (its class's ``knobs``: nothing it computes changes, and the run identity is then the variant's own), with
    one ``warn`` line per knob. A knob the overrides set themselves is the user's word and stays."""
    given = {tuple(parts) for parts, _ in parsed}
    residual = (merged.get("model") or {}).get("residual") if isinstance(merged.get("model"), dict) else None
    file_model = raw.get("model") if isinstance(raw.get("model"), dict) else {}
    file_residual = file_model.get("residual") if isinstance(file_model.get("residual"), dict) else {}
    if ("model", "residual", "variant") not in given or not isinstance(residual, dict) or not file_residual:
        return
    if file_residual.get("variant") == residual.get("variant"):
        return
    for knob, why in inapplicable_knobs(residual).items():
        if knob in file_residual and ("model", "residual", knob) not in given:
            warn(f"warning: model.residual.{knob}: {str(file_residual[knob])[:40]} ({source}) does not apply to "
                 f"model.residual.variant={residual['variant']} ({why}): dropped")
            del residual[knob]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def load_run_config(path: str | Path | None, overrides: Sequence[str] = (),
                    warn: Callable[[str], None] = _stderr) -> RunConfig:
    """Read a YAML run config (``None`` = all defaults), apply ``key=value`` overrides, validate. A variant override
    drops the file's knobs the new variant does not read, one ``warn`` line each (:func:`drop_inapplicable_knobs`)."""
    raw: Any = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"run config file not found: {path}")
        try:
            raw = read_yaml_file(path) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: {'' if isinstance(e, YAMLRefused) else 'not valid YAML: '}"
                              f"{yaml_error_line(e)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping at top level, got {type(raw).__name__}")
    parsed = parse_overrides(list(overrides))
    merged = apply_overrides(raw, parsed)
    drop_inapplicable_knobs(raw, merged, parsed, str(path), warn)
    return run_config_from_dict(merged)


# --- run identity -----------------------------------------------------------------------------
# THE exclusion table: keys of the resolved config that cannot change a run's numbers, and why.
# Everything else is in the run identity. Pairing is derived from the same identity (PAIRING_VARIES).
IDENTITY_EXCLUDE: dict[str, str] = {
    "meta.name": "label (the workflow's variant label, a path component)",
    "meta.variant": "label (model.residual.variant is in)",
    "meta.size": "label (the resolved model shape is in)",
    "model.preset": "label (the resolved model shape is in)",
    "model.residual.routing_impl": "execution: every routing implementation computes the same function (the kernels "
                                   "are tested against the eager reference); a run trained fused resumes or is "
                                   "evaluated eager on a CPU",
    "train.compile": "execution: the same step, compiled or not",
    "train.cuda_graph": "execution: the same step, replayed as a CUDA graph or not",
    "train.device": "execution: where the step runs (provenance.json records the device); an explicit train.dtype is in",
    "train.parallel": "execution: DDP or FSDP2 over the same global batch",
    "train.micro_batch": "execution: gradient accumulation over the same global batch (train.global_batch is in)",
    "train.threads": "execution: CPU threads",
    "train.log_every": "cadence of the train log lines",
    "train.checkpoint_every": "cadence of checkpoints (a resume is bit-identical)",
    "train.save_model_every_checkpoint": "bookkeeping",
    "train.log_batch_hash": "bookkeeping (a digest of each batch in metrics.jsonl)",
    "train.tracking": "bookkeeping (which experiment trackers receive a copy of the metrics)",
    "train.tracking_group": "bookkeeping (the experiment tracker's group of the run)",
    "train.tracking_required": "execution: whether a tracker's failure stops the run or training goes on without it "
                               "(the steps computed are the same)",
    "data.cache_dir": "path (token cache)",
    "data.data_dir": "path (local data mirror)",
}
IDENTITY_LEN = 16  # hex digits of `identity` / `pairing` in records; run paths carry the first PATH_ID_LEN
PATH_ID_LEN = 10
# Keys left out of the identity while unset (None): options added after runs were recorded, so the identity of
# configs that do not use them stays what it was.
OMIT_UNSET = ("model.residual.module", "model.residual.gate_type", "model.residual.recency_bias_init")


def _drop(d: dict, dotted: str) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        d = d.get(p)
        if not isinstance(d, dict):
            return
    d.pop(leaf, None)


def _omit_unset(d: dict) -> None:
    for dotted in OMIT_UNSET:
        *parents, leaf = dotted.split(".")
        sub = d
        for part in parents:
            sub = sub.get(part, {}) if isinstance(sub, dict) else {}
        if isinstance(sub, dict) and leaf in sub and sub[leaf] is None:
            del sub[leaf]


def identity_config(cfg: RunConfig) -> dict:
    """The resolved config without :data:`IDENTITY_EXCLUDE`, ``data.seed`` resolved (null = the train seed):
    everything that can change the run's numbers. ``run.config`` of every record."""
    d = cfg.to_dict()
    d["data"]["seed"] = cfg.data_seed
    for key in IDENTITY_EXCLUDE:
        _drop(d, key)
    _omit_unset(d)
    return d


def pairing_config(identity: dict, varies: Sequence[str] = PAIRING_VARIES) -> dict:
    """An identity config without what paired runs may differ in (:data:`PAIRING_VARIES`)."""
    d = copy.deepcopy(identity)
    for key in varies:
        _drop(d, key)
    return d


def identity_hash(cfg: RunConfig, length: int = IDENTITY_LEN) -> str:
    """The run identity: hash of :func:`identity_config` (run paths carry its first ``PATH_ID_LEN`` digits)."""
    return config_hash(identity_config(cfg), length)


def pairing_hash(cfg: "RunConfig | dict", length: int = IDENTITY_LEN) -> str:
    """Hash of the identity without the residual section: two runs pair iff their pairing hashes are equal.
    ``cfg``: a run config, or an identity config as records carry it (``run.config``, :func:`identity_config`):
    the one pairing hash of a config and of a record."""
    ident = identity_config(cfg) if isinstance(cfg, RunConfig) else cfg
    return config_hash(pairing_config(ident), length)


def recorded_run_config(raw: Any) -> RunConfig:
    """A recorded run config (a run directory's ``config.yaml``), read for its identity. ``routing_impl`` is
    left out: an execution choice, not identity, and a name this code does not know must not stop the read."""
    if isinstance(raw, dict):
        raw = copy.deepcopy(raw)
        _drop(raw, "model.residual.routing_impl")
    return run_config_from_dict(raw)


def run_identity(cfg: RunConfig) -> dict:
    """The ``run`` record of summary.json, provenance.json, the exported model's ``extra`` and eval results:
    label, residual (its knobs, routing_impl left out), size, seed, data_seed, ``identity``, ``pairing``
    and ``config`` (:func:`identity_config`, so a reader can name the first field two runs differ in)."""
    ident = identity_config(cfg)
    residual = {k: v for k, v in asdict(cfg.model.residual).items() if k != "routing_impl"}
    # label: the workflow's variant label (meta.name); a hand-run config without a name: its variant
    return {"label": cfg.meta.name if cfg.meta.name != "run" else cfg.variant, "residual": residual,
            "size": cfg.size, "seed": cfg.seed, "data_seed": cfg.data_seed,
            "identity": config_hash(ident, IDENTITY_LEN), "pairing": pairing_hash(ident),
            "config": ident}
