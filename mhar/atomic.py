"""Generic file I/O of every stage, without torch (the lowest floor: imports nothing of the project).

Atomic writes (same-folder temp file ``.<name>.<pid>.tmp`` + fsync + rename + fsync of the folder): a crash or
kill never leaves a half-written record; readers see the old file or the new one. Every record of the project
is written through here (JSON with :func:`atomic_write_json`; weights and training states through
:func:`mhar.runs.checkpoint.atomic_torch_save`, built on :func:`tmp_of` and :func:`write_synced`), and read
back with :func:`read_json`. :func:`clean_stale_temps` removes the temp files of killed writes (a pending
``.sha256`` whose file was already renamed into place is completed instead: :func:`sha256_path`,
:func:`file_sha256`); :func:`pid_alive` tells whether a temp file's, lock's or staging folder's owner lives.

Also the one-line wording of operating-system errors (:func:`os_error_line`: disk full, read-only, no
permission) and :func:`check_writable`, which a command calls on its output folder before long work.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional

__all__ = ["atomic_write_bytes", "atomic_write_text", "atomic_write_json", "read_json", "check_writable",
           "os_error_line", "name_max", "tmp_of", "fsync_dir", "fsync_file", "write_synced", "clean_stale_temps",
           "pid_alive", "sha256_path", "file_sha256", "recorded_sha256"]


def fsync_dir(path: Path) -> None:
    """fsync a folder (a rename in it is durable); a file system that cannot is left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike) -> None:
    """fsync a file written by someone else (e.g. lm-eval's output files) before it is renamed into place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_of(path: Path) -> Path:
    """The same-folder temp file of this process's write of ``path`` (:func:`clean_stale_temps` knows the form)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_synced(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Create ``path``, let ``write`` fill it, flush and fsync it."""
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_bytes(path: str | os.PathLike, data: "bytes | Callable[[BinaryIO], None]") -> Path:
    """Write ``data`` (bytes, or a function writing to a binary file) to ``path`` atomically.

    On any failure (a full disk included) the temp file is removed and ``path`` keeps its old content."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_of(path)
    try:
        write_synced(tmp, data if callable(data) else lambda f: f.write(data))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 1) -> Path:
    """``obj`` as indented JSON (values JSON does not know written with ``str``), atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=indent, default=str) + "\n")


def read_json(path: str | os.PathLike, error: Optional[type[Exception]] = None) -> Any:
    """The JSON document at ``path``.

    Without ``error``: None when the file is missing or unreadable (a record the caller rebuilds or does
    without). With ``error`` (an exception class): a missing file or invalid JSON raises it, one line naming the
    file and what to do; other operating-system errors propagate."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        if error is None:
            return None
        raise error(f"{path}: file not found (did the producing step run?)") from None
    except ValueError as e:  # invalid JSON or not UTF-8
        if error is None:
            return None
        raise error(f"{path}: not valid JSON ({e}); re-run the step that wrote it "
                    "(or check that this is the right file)") from None
    except OSError:
        if error is None:
            return None
        raise


# --- operating-system errors --------------------------------------------------------------------
_ADVICE = {
    errno.ENOSPC: "the disk is full: free space there (or point the output elsewhere)",
    errno.EDQUOT: "the disk quota is exhausted: free space there (or point the output elsewhere)",
    errno.EROFS: "the file system is read-only: choose a writable location",
    errno.EACCES: "permission denied: choose a location you may write, or fix its permissions",
    errno.EPERM: "operation not permitted: choose a location you may write, or fix its permissions",
    errno.ENOTDIR: "a file stands where a folder is needed: choose another path",
    errno.EISDIR: "a folder stands where a file is needed: choose another path",
}


def os_error_line(e: OSError, doing: str = "", after: str = "") -> str:
    """One line for an OSError: what failed, on which file, why (errno name), what to do; ``after``
    (e.g. "completed checkpoints are kept") is appended."""
    name = errno.errorcode.get(e.errno, "") if e.errno is not None else ""
    where = f" {e.filename}" if getattr(e, "filename", None) else ""
    why = e.strerror or str(e) or type(e).__name__
    advice = _ADVICE.get(e.errno, "check the path and its file system")
    parts = [f"{doing + ' ' if doing else ''}failed{' on' + where if where else ''}: {why}"
             + (f" ({name})" if name else ""), advice]
    if after:
        parts.append(after)
    return "; ".join(parts).replace("\n", " ")


def name_max(folder: str | os.PathLike) -> int:
    """The longest file name (bytes) the file system of ``folder`` (or of its nearest existing parent) allows."""
    p = Path(folder).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return int(os.pathconf(p, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255  # the limit of every common Linux and macOS file system


def check_writable(folder: str | os.PathLike) -> Optional[list[Path]]:
    """Create ``folder`` (and missing parents) and write, fsync and remove a small probe file in it, so a
    read-only, full or forbidden location fails now, before long work; raises the OSError. Returns the
    folders it created (the caller may remove them if it gives up)."""
    folder = Path(folder)
    created = []
    p = folder
    while not p.exists() and p != p.parent:
        created.append(p)
        p = p.parent
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / f".write-probe.{os.getpid()}.tmp"
    try:
        with open(probe, "wb") as f:
            f.write(b"mhar write probe\n" * 64)  # ~1 KiB: a full disk refuses it
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        probe.unlink(missing_ok=True)
        for c in created:  # leave nothing behind on refusal
            try:
                c.rmdir()
            except OSError:
                break
        raise
    probe.unlink(missing_ok=True)
    return list(reversed(created))


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (the owner of a temp file, lock or staging folder)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- temp files of killed writes ------------------------------------------------------------------
_TMP_RE = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")


def sha256_path(path: str | os.PathLike) -> Path:
    """The checksum file beside ``path`` (``<file>.sha256``, ``sha256sum -c`` format)."""
    path = Path(path)
    return path.with_name(path.name + ".sha256")


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def recorded_sha256(sidecar: Path) -> Optional[str]:
    """The digest a checksum file records (None: unreadable or not a sha256)."""
    try:
        word = sidecar.read_text().split()[0]
    except (OSError, IndexError, UnicodeDecodeError):
        return None
    return word.lower() if len(word) == 64 else None


def clean_stale_temps(folder: str | os.PathLike) -> list[Path]:
    """Remove temp files of killed writes (``.<name>.<pid>.tmp`` of a dead pid) in ``folder``; returns them.

    A pending checksum whose file was already renamed into place is completed, not removed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for tmp in sorted(folder.glob(".*.tmp")):
        m = _TMP_RE.match(tmp.name)
        if not m or not tmp.is_file() or pid_alive(int(m["pid"])):
            continue
        name = m["name"]
        if name.endswith(".sha256"):
            target = folder / name[: -len(".sha256")]
            rec = recorded_sha256(tmp)
            if target.is_file() and rec is not None and rec == file_sha256(target):
                os.replace(tmp, sha256_path(target))
                continue
        tmp.unlink(missing_ok=True)
        removed.append(tmp)
    return removed
