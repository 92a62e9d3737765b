"""YAML in and out: the one place YAML text from a user or a file becomes Python values (no torch).

Every YAML the project reads goes through here: run configs and their ``key=value`` overrides, the workflow's
config and overlays (``--configfile``, ``--config``), recorded ``config.yaml`` files, manifests, and the task
YAMLs handed to lm-eval (checked by :func:`check_yaml_file` before lm-eval's own loader reads them).

* Safe: no tag constructs an object (``!!python/...`` is refused, never executed).
* YAML-1.2 floats: ``3e-4`` is a number (PyYAML's YAML-1.1 resolver reads it as a string).
* Bounded, refused in one line before anything is built: a document over :data:`MAX_YAML_BYTES`; aliases
  that would expand past :data:`MAX_YAML_NODES` values (a "billion laughs" document: a few lines that expand
  to hundreds of millions of strings) or refer to themselves; any alias where none is needed (a ``key=value``
  override: ``aliases=False``); nesting deeper than the parser can follow. PyYAML builds an alias as a shared
  reference, so nothing expands while loading; the expansion happens in whatever walks the value later (a
  schema check, a deep copy into JSON, an error message), which is why the check comes first.

:func:`yaml_error_line` words any YAML error (these refusals included: :class:`YAMLRefused` is a
``yaml.YAMLError``) as one line; :func:`dump_yaml` writes YAML that :func:`yaml_load` reads back as it was.
"""
from __future__ import annotations

import os
import re
from typing import Any

import yaml

__all__ = ["MAX_YAML_BYTES", "MAX_YAML_NODES", "YAMLRefused", "yaml_load", "read_yaml_file", "check_yaml_file",
           "yaml_error_line", "dump_yaml"]

MAX_YAML_BYTES = 1 << 20  # 1 MiB: the project's configs, overlays, manifests and task YAMLs are a few KiB
MAX_YAML_NODES = 100_000  # values (scalars, lists, mappings) a document with aliases may expand to


class YAMLRefused(yaml.YAMLError):
    """A YAML document refused before it was built (too large, an expanding or forbidden alias, too deep)."""


_FLOAT_RE = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)


def _where(mark) -> str:
    return f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""


def _expanded_size(root: yaml.Node, limit: int) -> int:
    """Values the node graph ``root`` stands for once every alias is written out, counted without writing
    anything out (a node reached twice counts twice; its count is computed once). Stops past ``limit``;
    raises YAMLRefused for an alias inside the node it names."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            size[key] = min(limit + 1, 1 + sum(size[id(c)] for c in children))
            continue
        if key in size:
            continue
        if key in on_path:
            raise YAMLRefused(f"a YAML alias{_where(node.start_mark)} refers to the value that contains it "
                              "(a recursive document): refused; write the value out")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    return size[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _guard(loader: yaml.SafeLoader, node: yaml.Node) -> None:
    if loader.saw_alias and _expanded_size(node, MAX_YAML_NODES) > MAX_YAML_NODES:
        raise YAMLRefused(f"YAML aliases expand this document past {MAX_YAML_NODES} values (a 'billion laughs' "
                          "document?): refused before building it; write the values out")


class _Composer(yaml.SafeLoader):
    """Parses into nodes (every tag allowed: nothing is constructed) and notes aliases; refuses them where
    ``allow_aliases`` is off."""

    allow_aliases = True

    def __init__(self, stream):
        super().__init__(stream)
        self.saw_alias = False

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if not self.allow_aliases:
                raise YAMLRefused(f"YAML alias *{event.anchor[:40]}{_where(event.start_mark)} is refused here "
                                  "(no alias is needed in this value): write the value out")
            self.saw_alias = True
        return super().compose_node(parent, index)


class _Loader(_Composer):
    def construct_document(self, node):
        _guard(self, node)  # before anything is built
        return super().construct_document(node)


class _NoAliasLoader(_Loader):
    allow_aliases = False


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+0123456789."))


def _check_size(text: "str | bytes", what: str) -> None:
    n = len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    if n > MAX_YAML_BYTES:
        raise YAMLRefused(f"{what} is {n} bytes, over the {MAX_YAML_BYTES}-byte limit of a YAML document: "
                          "refused unread (is this the right file?)")


def _parse(loader: yaml.SafeLoader, op):
    try:
        return op(loader)
    except RecursionError:
        raise YAMLRefused("YAML nested too deeply to read (thousands of levels): refused") from None
    finally:
        loader.dispose()


def yaml_load(text: "str | bytes", *, aliases: bool = True, what: str = "the YAML document") -> Any:
    """Safe, bounded YAML (module docstring) with YAML-1.2 floats; ``aliases=False`` refuses any alias."""
    _check_size(text, what)
    return _parse((_Loader if aliases else _NoAliasLoader)(text), lambda ld: ld.get_single_data())


def _read_bounded(path: "str | os.PathLike") -> bytes:
    with open(path, "rb") as f:
        data = f.read(MAX_YAML_BYTES + 1)
    _check_size(data, str(path))
    return data


def read_yaml_file(path: "str | os.PathLike", *, aliases: bool = True) -> Any:
    """:func:`yaml_load` of the file at ``path``, read no further than the size limit (OSError propagates)."""
    return yaml_load(_read_bounded(path), aliases=aliases, what=str(path))


def check_yaml_file(path: "str | os.PathLike") -> None:
    """Refuse (YAMLRefused, or the parser's YAMLError) a YAML file that another loader will read (lm-eval's, with
    its own tags): the size limit and the alias bound, every tag allowed, nothing constructed."""
    data = _read_bounded(path)

    def compose(ld):
        node = ld.get_single_node()
        if node is not None:
            _guard(ld, node)

    _parse(_Composer(data), compose)


def yaml_error_line(e: "yaml.YAMLError") -> str:
    """One line for a YAML error: the problem and where; a tag that would build an object says it is refused."""
    if isinstance(e, YAMLRefused):
        return str(e).replace("\n", " ")
    problem = getattr(e, "problem", None) or (str(e).splitlines() or [type(e).__name__])[0]
    mark = getattr(e, "problem_mark", None)
    if "could not determine a constructor for the tag" in problem:
        tag = problem.split("tag", 1)[1].strip()[:80]
        return (f"YAML tag {tag}{_where(mark)} is refused: tags that construct objects are never executed; "
                "give a plain value (number, string, list or mapping)")
    return f"{problem[:200]}{_where(mark)}".replace("\n", " ")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+0123456789."))


def dump_yaml(obj: Any) -> str:
    """YAML that :func:`yaml_load` reads back as it was: a string that reads as a YAML-1.2 float (a hash such
    as ``8e123456``) is quoted."""
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
