"""The residual-variant registry: the one list of variant names.

A variant is a :class:`~mhar.model.residuals.base.Residual` subclass decorated with ``@register("name")``.
Every module of this package is imported when the package is (``pkgutil`` discovery), so a new built-in
variant is one module here and nothing else. A variant defined outside the package registers itself the
same way in its own module; the model config names that module and it is imported on demand::

    model:
      residual: {variant: my_variant, module: mypkg.my_variant}

``variant_names()`` is what config validation (``mhar.model.config.ModelConfig.validate``) and the workflow's
run configs check against; ``build_residual(cfg)`` picks the class by ``cfg.residual.variant``.
``routed_variants()`` (classes with ``routes_full_depth``) is what the mechanism probe and the workflow's
probe jobs run on.
"""
from __future__ import annotations

import importlib
import pkgutil

from mhar.model.residuals.base import Residual
from mhar.model.residuals.registry import (RESIDUALS, build_residual, display_record, import_variant_module, register,
                                           residual_class, routed_variants, variant_names)


def _import_variant_modules(path: list[str]) -> None:
    """Built-in variants: every module of this package registers its own classes when imported. (A Hugging Face
    export ships a flat copy of this file, which is not a package: there the export imports the variant modules.)"""
    for info in pkgutil.iter_modules(path):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_import_variant_modules(globals().get("__path__", []))

__all__ = ["Residual", "RESIDUALS", "register", "variant_names", "routed_variants", "residual_class", "display_record",
           "import_variant_module", "build_residual"]
