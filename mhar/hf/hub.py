"""Where a Hugging Face checkpoint comes from, pinned: a hub snapshot (its commit) or a local folder (its content).

    from mhar.hf.hub import fetch
    src = fetch("wdlctc/open-attnres-block")        # hub: downloads (or reuses the cache), resolves the commit
    src = fetch("/data/open-attnres-block")         # local: hashes the folder's files
    src.folder, src.record()                        # the folder to import; what to write into provenance

A hub name resolves to the commit that ``revision`` (default: the repository's main branch) points at when it is
read: ``huggingface_hub.snapshot_download`` returns the cache folder ``snapshots/<commit hash>``, so the commit
is the snapshot folder's name. A local folder has no commit; its record says ``local`` and carries
``content_sha256``, a hash over every file's relative path and sha256 (hidden folders such as ``.git`` and
``.cache`` left out), so two copies of one checkpoint hash alike wherever they lie.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from mhar.runs.checkpoint import file_sha256

# what an import reads: config, weights (safetensors; index files are *.json), tokenizer files
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.model", "tokenizer*", "merges.txt", "vocab.*"]
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class HubUnreachable(RuntimeError):
    """A hub repository could not be read (offline, unknown or gated repository, unknown revision)."""

    def __init__(self, repo: str, revision: Optional[str], cause: BaseException):
        first = (str(cause).strip().splitlines() or [""])[0]
        at = f" at revision {revision!r}" if revision else ""
        super().__init__(f"the Hugging Face hub repository {repo!r}{at} could not be reached "
                         f"({type(cause).__name__}{': ' + first if first else ''})")
        self.repo, self.revision = repo, revision


class NotACheckpoint(ValueError):
    """A local path that is not a Hugging Face model folder."""


@dataclass(frozen=True)
class CheckpointSource:
    folder: Path  # the local folder holding config.json, weights and tokenizer files
    hub: Optional[str]  # the hub repository, None for a local folder
    revision: Optional[str]  # the revision asked for (hub only; None = the main branch)
    commit: Optional[str]  # the commit the revision resolved to (hub only)
    content_sha256: str  # over every file of the folder (relative path + sha256)

    def record(self) -> dict:
        """Plain-JSON provenance: hub name, revision asked and commit read; or ``local`` and the folder."""
        if self.hub is None:
            return {"kind": "local", "folder": str(self.folder.resolve()), "content_sha256": self.content_sha256}
        return {"kind": "hub", "repo": self.hub, "revision": self.revision, "commit": self.commit,
                "content_sha256": self.content_sha256}

    def describe(self) -> str:
        if self.hub is None:
            return f"local folder {self.folder} (content sha256 {self.content_sha256[:12]})"
        return f"{self.hub}@{self.commit}"


def is_local_spec(spec: Union[str, Path]) -> bool:
    """Whether ``spec`` names a local path (absolute, or starting with '.' or '~') rather than a hub name."""
    return str(spec).startswith(("/", ".", "~"))


def folder_sha256(folder: Union[str, Path]) -> str:
    """sha256 over (relative path, file sha256) of every regular file under ``folder``, in sorted order."""
    root = Path(folder)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        h.update(f"{rel.as_posix()}\0{file_sha256(p)}\n".encode())
    return h.hexdigest()


def fetch(spec: Union[str, Path], revision: Optional[str] = None) -> CheckpointSource:
    """The checkpoint ``spec`` names, as a local folder with its provenance (see the module docstring)."""
    p = Path(spec).expanduser()
    if p.is_dir() or is_local_spec(spec) or str(spec).count("/") != 1:
        if not p.is_dir():
            raise NotACheckpoint(f"{spec}: no such folder (a hub name looks like 'org/name')")
        if not (p / "config.json").is_file():
            raise NotACheckpoint(f"{p} has no config.json: not a Hugging Face model folder")
        return CheckpointSource(p, None, None, None, folder_sha256(p))
    from huggingface_hub import snapshot_download  # the hub client, needed only for hub names

    try:
        folder = Path(snapshot_download(str(spec), revision=revision, allow_patterns=ALLOW_PATTERNS))
    except Exception as e:  # offline, unknown / gated repository, unknown revision: huggingface_hub's many kinds
        raise HubUnreachable(str(spec), revision, e) from e
    commit = folder.name if _COMMIT.match(folder.name) else None
    if commit is None:  # not the hub cache's snapshots/<commit> layout: ask the hub which commit it served
        from huggingface_hub import HfApi

        try:
            commit = HfApi().model_info(str(spec), revision=revision).sha
        except Exception as e:
            raise HubUnreachable(str(spec), revision, e) from e
    return CheckpointSource(folder, str(spec), revision, commit, folder_sha256(folder))
