"""The pairing rule: which two runs may be compared paired, and the first field in which two configs differ.

Two runs are paired iff their identity configs (``run.config``, :func:`mhar.runs.config.identity_config`) differ
only under :data:`PAIRING_VARIES` (the residual section) and what a comparison allows besides (``ignore``: the
seeds within one table row, ``train.init_from`` for the two CPT arms). :func:`first_difference` names the first
field two config dicts differ in; :func:`pairing_difference` applies the rule to two ``run`` records as the
analysis reads them (``analysis.load.runs.run_identity``): the one function the tables, the CPT check and the run
identity check use.
"""
from __future__ import annotations

import json
from typing import Any, Iterator, Optional, Sequence

__all__ = ["PAIRING_VARIES", "differences", "first_difference", "pairing_difference"]

# What two runs may differ in and still be paired (on top of mhar.runs.config.IDENTITY_EXCLUDE): the residual
# variant and its knobs. Equal everything else means the same size, seeds (train and resolved data seed), data
# order (corpus, tokenizer, seq_len, ...) and schedule.
PAIRING_VARIES = ("model.residual",)


def differences(a: Any, b: Any, ignore: Sequence[str] = (), prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) of every difference of two config dicts, in a's key order, then
    b's extra keys, skipping the dotted keys in ``ignore`` and what lies below them."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        if a != b:
            yield prefix.rstrip(".") or "(config)", a, b
        return
    for k in list(a) + [k for k in b if k not in a]:
        key = f"{prefix}{k}"
        if key in ignore:
            continue
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            yield from differences(va, vb, ignore, key + ".")
        elif va != vb:
            yield key, va, vb


def first_difference(a: Any, b: Any, ignore: Sequence[str] = (), prefix: str = "") -> Optional[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) of the first difference of two config dicts (in a's key order,
    then b's extra keys), skipping the dotted keys in ``ignore`` and what lies below them; None when equal."""
    return next(differences(a, b, ignore, prefix), None)


def _short(v: Any) -> str:
    t = json.dumps(v, default=str) if not isinstance(v, str) else repr(v)
    return t if len(t) <= 60 else t[:57] + "..."


def pairing_difference(a: dict, b: dict, ignore: Sequence[str] = ()) -> Optional[str]:
    """None when runs ``a`` and ``b`` may be paired, else the first field that differs, as
    'field (value of a vs value of b)'.

    ``a`` / ``b`` are run records as the analysis reads them: keys ``config`` (the identity config; None for a
    released checkpoint, never trained here), ``size``, ``seed``, ``data_seed``, ``pairing`` (pairing hash, or
    "released-<group>") and ``where``. Two trained runs: their configs may differ under :data:`PAIRING_VARIES`
    and ``ignore`` alone. Two released checkpoints pair when size, seed and declared pairing agree. A trained run
    and a released checkpoint never pair (one's data order and schedule are unknown)."""
    skip = tuple(PAIRING_VARIES) + tuple(ignore)
    if a["config"] is not None and b["config"] is not None:
        d = first_difference(a["config"], b["config"], ignore=skip)
        return None if d is None else f"{d[0]} ({_short(d[1])} vs {_short(d[2])})"
    if a["config"] is None and b["config"] is None:
        checks = [("size", a["size"], b["size"]), ("pairing", a["pairing"], b["pairing"])]
        if "train.seed" not in skip:
            checks.insert(1, ("seed", a["seed"], b["seed"]))
        for name, va, vb in checks:
            if va != vb:
                return f"{name} ({_short(va)} vs {_short(vb)})"
        return None
    released = a if a["config"] is None else b
    return (f"training (a run trained here vs {released['where']}, a released checkpoint whose data order and "
            "schedule are unknown)")
