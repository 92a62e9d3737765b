"""The residual-variant registry: ``register`` (the class decorator every variant module uses) and lookups.

``mhar.model.residuals`` (the package) imports every built-in variant module, so its functions see them all.
"""
from __future__ import annotations

import importlib
import re
from typing import TYPE_CHECKING, Callable, Optional

from mhar.model.choices import ConfigError, brief
from mhar.model.residuals.base import Residual

if TYPE_CHECKING:
    from mhar.model.config import ModelConfig

RESIDUALS: dict[str, type[Residual]] = {}
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def register(name: str) -> Callable[[type[Residual]], type[Residual]]:
    """Class decorator: make ``cls`` the residual variant ``name`` (``model.residual.variant: name``)."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ValueError(f"residual variant name {name!r}: use letters, digits, '_', '.', '-' (it names "
                         "result directories and table rows)")

    def deco(cls: type[Residual]) -> type[Residual]:
        if not (isinstance(cls, type) and issubclass(cls, Residual)):
            raise TypeError(f"@register({name!r}) needs a subclass of mhar.model.residuals.base.Residual, got {cls!r}")
        old = RESIDUALS.get(name)
        # the same class imported again (importlib.reload) may register again; another class may not
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"residual variant {name!r} is registered twice: {old.__module__}.{old.__qualname__} "
                             f"and {cls.__module__}.{cls.__qualname__}; rename one")
        cls.name = name
        RESIDUALS[name] = cls
        return cls

    return deco


def variant_names() -> tuple[str, ...]:
    """Names of the registered variants (the built-in ones plus any imported module's), sorted."""
    return tuple(sorted(RESIDUALS))


def routed_variants() -> tuple[str, ...]:
    """Registered variants that route over every earlier sublayer output with one query per site
    (``Residual.routes_full_depth``): the ones the mechanism probe runs on, sorted."""
    return tuple(sorted(n for n, cls in RESIDUALS.items() if cls.routes_full_depth))


def display_record(variant: str) -> dict:
    """How tables and reports show ``variant`` (its class's ``display_name``, ``table_order``, ``shows_heads``):
    ``{"display": str, "order": int, "shows_heads": bool}``, plus ``"heads"`` when the class fixes its routing
    head count (``fixed_heads``). The trainer records it in summary.json (``display``)."""
    cls = residual_class(variant)
    out = {"display": cls.display_name or cls.name, "order": int(cls.table_order),
           "shows_heads": bool(cls.shows_heads)}
    if cls.fixed_heads is not None:
        out["heads"] = int(cls.fixed_heads)
    return out


def import_variant_module(module: str) -> None:
    """Import ``module`` (``model.residual.module``) so that the variants it defines register themselves.

    Any failure of the import (no such module, a syntax error, an exception raised while it runs, a package it
    imports that is not installed) is one ConfigError line naming the module and the cause."""
    if not isinstance(module, str) or not _MODULE_NAME.match(module):
        raise ConfigError(f"model.residual.module: {brief(module)} is not a Python module name (e.g. mypkg.my_variant)")
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name is not None and (module == e.name or module.startswith(e.name + ".")):
            raise ConfigError(
                f"model.residual.module: cannot import {brief(module)} (no module {brief(e.name)}); install the "
                "package that holds it or run from the folder that does (it must be importable on the Python path)"
            ) from None
        raise ConfigError(
            f"model.residual.module: importing {brief(module)} failed: it imports {brief(e.name)}, which is not "
            f"installed ({_where_raised(e)}); install that package (pip install ...) or remove the import"
        ) from None
    except SyntaxError as e:  # IndentationError, TabError included
        where = f"{e.filename}, line {e.lineno}" if e.filename else "its source"
        raise ConfigError(
            f"model.residual.module: importing {brief(module)} failed: {type(e).__name__}: {_text(e.msg)} ({where}); "
            "fix the module"
        ) from None
    except Exception as e:  # whatever the module's own code raised while it was imported
        raise ConfigError(
            f"model.residual.module: importing {brief(module)} failed: {type(e).__name__}: {_text(str(e))} "
            f"({_where_raised(e)}); fix the module (it runs when the config is checked)"
        ) from None


def _text(message: str, limit: int = 200) -> str:
    """An exception's message on one line, at most ``limit`` characters."""
    one = " ".join(str(message).split())
    return one if len(one) <= limit else one[: limit - 3] + "..."


def _where_raised(e: BaseException) -> str:
    """``file, line N`` of the innermost frame of ``e``'s traceback outside the import machinery."""
    tb, last = e.__traceback__, None
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith("<frozen"):
            last = tb
        tb = tb.tb_next
    return f"{last.tb_frame.f_code.co_filename}, line {last.tb_lineno}" if last is not None else "during its import"


def residual_class(variant: str, module: Optional[str] = None) -> type[Residual]:
    """The class registered as ``variant``, importing ``module`` first when one is given."""
    if module is not None:
        import_variant_module(module)
    if variant not in RESIDUALS:
        where = (f"module {brief(module)} does not register it (@mhar.model.residuals.register({brief(variant)}))"
                 if module else "if it is defined outside mhar.model.residuals, name its module in model.residual.module")
        raise ConfigError(f"model.residual.variant: unknown variant {brief(variant)}; choose one of "
                          f"{', '.join(variant_names())} ({where})")
    return RESIDUALS[variant]


def build_residual(cfg: ModelConfig) -> Residual:
    cls = residual_class(cfg.residual.variant, cfg.residual.module)
    cls.check_config(cfg)
    return cls(cfg)
