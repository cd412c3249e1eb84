"""Local files for ``python -m vertal2kubo run``: --file in, --out out.

Mirrors cmd/vertal/run_files.go. The returned files' paths come from the
server, so they are treated as hostile: a path that is absolute, has an
empty, "." or ".." part, or reaches through a symlink is refused. Where the
platform can (Linux, macOS, the BSDs) every step is taken relative to an
open directory with O_NOFOLLOW, so nothing outside --out is ever touched
even if the tree changes meanwhile; elsewhere the same checks are made on
paths. Each file is written under a temporary name and renamed into place,
so a symlink at the final name is never written through.
"""

from __future__ import annotations

import os
import secrets
import stat
from typing import Optional

__all__ = ["read_file_flag", "split_returned_path", "write_beneath", "ReturnedPathError"]

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)
_AT = _O_NOFOLLOW != 0 and all(f in os.supports_dir_fd for f in (os.open, os.stat, os.mkdir, os.rename, os.unlink))


class ReturnedPathError(ValueError):
    """A returned file that is not written, and why."""


def read_file_flag(value: str) -> tuple[str, bytes]:
    """The (path, content) a --file flag names: LOCAL or LOCAL:PATH. A value
    that names an existing file is LOCAL alone, so a local name with a colon
    still works; otherwise the first colon splits it. Raises ValueError or
    OSError."""
    local, path = value, ""
    if not os.path.exists(value) and ":" in value:
        local, path = value.split(":", 1)
    if local == "":
        raise ValueError("want LOCAL or LOCAL:PATH")
    if path == "":
        path = os.path.basename(local)
    st = os.stat(local)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{local} is not a regular file")
    with open(local, "rb") as f:
        content = f.read()
    return path.replace(os.sep, "/"), content


def split_returned_path(path: str) -> list:
    """A returned file's '/'-separated relative path, checked and split."""
    if not path or path.startswith("/") or "\\" in path or "\0" in path:
        raise ReturnedPathError("not a relative '/'-separated path")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ReturnedPathError("has an empty, . or .. component")
    return parts


def write_beneath(root: str, path: str, content: bytes) -> None:
    """Write content at the returned path under the directory root,
    creating directories, without following any symlink below root."""
    parts = split_returned_path(path)
    if _AT:
        _write_at(root, parts, content)
    else:
        _write_by_path(root, parts, content)


def _lstat_at(name: str, dir_fd: int) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _check_dir(name: str, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise ReturnedPathError(f"{name} is a symlink")
    if not stat.S_ISDIR(st.st_mode):
        raise ReturnedPathError(f"{name} is not a directory")


def _check_target(name: str, st: Optional[os.stat_result]) -> None:
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ReturnedPathError(f"{name} exists and is not a regular file")


def _temp_name() -> str:
    return ".vertal-" + secrets.token_hex(8) + ".tmp"


def _write_at(root: str, parts: list, content: bytes) -> None:
    fd = os.open(root, os.O_RDONLY | _O_DIRECTORY)
    try:
        for name in parts[:-1]:
            st = _lstat_at(name, fd)
            if st is None:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            else:
                _check_dir(name, st)
            try:
                # O_NOFOLLOW: a symlink swapped in since the check is refused.
                sub = os.open(name, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW, dir_fd=fd)
            except OSError as e:
                raise ReturnedPathError(f"{name}: {e.strerror}") from None
            os.close(fd)
            fd = sub
        name = parts[-1]
        _check_target(name, _lstat_at(name, fd))
        tmp = _temp_name()
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_BINARY, 0o644, dir_fd=fd)
        try:
            with os.fdopen(out, "wb") as f:
                f.write(content)
            os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=fd)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


def _write_by_path(root: str, parts: list, content: bytes) -> None:
    d = root
    for name in parts[:-1]:
        d = os.path.join(d, name)
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            os.makedirs(d, 0o755, exist_ok=True)
            st = os.lstat(d)
        _check_dir(name, st)
    name = parts[-1]
    target = os.path.join(d, name)
    try:
        _check_target(name, os.lstat(target))
    except FileNotFoundError:
        pass
    tmp = os.path.join(d, _temp_name())
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_BINARY, 0o644)
    try:
        with os.fdopen(out, "wb") as f:
            f.write(content)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
