"""Host-side file access to a session's workspace that can never leave it.

The file tools (`read_file`, `write_file`, `apply_patch`) and artifact publishing run on
the host, where the workspace is an ordinary directory that sandboxed commands may fill
with hostile symlinks. Every path is resolved component by component from an open
directory descriptor with `O_NOFOLLOW`; a symlink is read and re-resolved as a path
inside the workspace (as `/workspace` would see it), and anything that would end up
outside is refused. No check-then-open race exists, because nothing is opened by name
from the host's root.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cairn.errors import InvalidRequestError
from cairn.sandbox.base import WORKSPACE_MOUNT

__all__ = ["PathEscapeError", "WorkspaceFiles", "workspace_relative"]

_MAX_SYMLINK_HOPS = 40
# Linux's NAME_MAX and PATH_MAX, in bytes: past them the kernel answers ENAMETOOLONG.
_MAX_NAME_BYTES = 255
_MAX_PATH_BYTES = 4096
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK


class PathEscapeError(InvalidRequestError):
    """A path that names something outside `/workspace`."""

    default_code = "path_outside_workspace"


def workspace_relative(path: str) -> str:
    """`/workspace/a/b` or `a/b` → `a/b` (normalized); refuse anything outside the workspace."""
    if not isinstance(path, str) or not path or "\x00" in path:
        raise InvalidRequestError("path must be a non-empty string", param="path")
    if path.startswith("/"):
        normalized = posixpath.normpath(path)
        if normalized != WORKSPACE_MOUNT and not normalized.startswith(WORKSPACE_MOUNT + "/"):
            raise PathEscapeError(f"path {path!r} is outside {WORKSPACE_MOUNT}")
        relative = normalized[len(WORKSPACE_MOUNT) :].lstrip("/")
    else:
        relative = posixpath.normpath(path)
    if relative in ("", "."):
        return ""
    if relative == ".." or relative.startswith("../"):
        raise PathEscapeError(f"path {path!r} is outside {WORKSPACE_MOUNT}")
    if len(relative.encode("utf-8", "surrogatepass")) > _MAX_PATH_BYTES:
        raise InvalidRequestError(f"path is longer than {_MAX_PATH_BYTES} bytes", param="path")
    for name in relative.split("/"):
        if len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME_BYTES:
            raise InvalidRequestError(f"path component {name[:40]!r}... is longer than {_MAX_NAME_BYTES} bytes", param="path")
    return relative


@dataclass(frozen=True, slots=True)
class FileInfo:
    path: str  # relative to the workspace
    size: int
    mode: int
    mtime_ns: int = 0


class WorkspaceFiles:
    """Synchronous file operations. None of them can wait on anything but the local disk:
    every open is non-blocking, so a FIFO or device planted in the workspace is refused
    instead of hanging (the caller decides whether an operation is small enough for the
    event loop)."""

    def __init__(self, root: Path, owner: tuple[int, int] | None = None) -> None:
        self.root = root
        self.owner = owner

    @contextmanager
    def _parent(self, path: str, *, create: bool) -> Iterator[tuple[int, str]]:
        """Yield (fd of the parent directory, final name) for a workspace path."""
        relative = workspace_relative(path)
        if not relative:
            raise InvalidRequestError(f"path {path!r} names the workspace itself, not a file", param="path")
        parts = relative.split("/")
        hops = 0
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            index = 0
            done: list[str] = []
            while index < len(parts) - 1:
                name = parts[index]
                try:
                    child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise InvalidRequestError(f"no such directory: /workspace/{'/'.join(done + [name])}", param="path") from None
                    os.mkdir(name, 0o755, dir_fd=fd)
                    self._chown(name, fd)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    if not stat.S_ISLNK(os.lstat(name, dir_fd=fd).st_mode):
                        raise InvalidRequestError(f"/workspace/{'/'.join(done + [name])} is not a directory", param="path") from None
                    hops += 1
                    if hops > _MAX_SYMLINK_HOPS:
                        raise PathEscapeError(f"too many symbolic links in {path!r}") from None
                    target = os.readlink(name, dir_fd=fd)
                    base = WORKSPACE_MOUNT + "/" + "/".join(done)
                    rest = "/".join([target] + parts[index + 1 :])
                    relative = workspace_relative(posixpath.join(base, rest))
                    parts, index, done = relative.split("/"), 0, []
                    os.close(fd)
                    fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
                    continue
                os.close(fd)
                fd = child
                done.append(name)
                index += 1
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def _chown(self, name: str, dir_fd: int) -> None:
        if self.owner is not None:
            os.chown(name, *self.owner, dir_fd=dir_fd, follow_symlinks=False)

    def _final_symlink(self, path: str, dir_fd: int, name: str) -> str | None:
        """The workspace path a final-component symlink points to, or None if not a symlink."""
        try:
            if not stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode):
                return None
        except FileNotFoundError:
            return None
        target = os.readlink(name, dir_fd=dir_fd)
        parent = posixpath.dirname(WORKSPACE_MOUNT + "/" + workspace_relative(path))
        return WORKSPACE_MOUNT + "/" + workspace_relative(posixpath.join(parent, target))

    def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        for _ in range(_MAX_SYMLINK_HOPS):
            with self._parent(path, create=False) as (dir_fd, name):
                redirect = self._final_symlink(path, dir_fd, name)
                if redirect is None:
                    try:
                        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
                    except FileNotFoundError:
                        raise InvalidRequestError(f"no such file: {path}", param="path") from None
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        os.close(fd)
                        raise InvalidRequestError(f"{path} is not a regular file", param="path")
                    with os.fdopen(fd, "rb") as f:
                        data = f.read(max_bytes + 1)
                    if len(data) > max_bytes:
                        raise InvalidRequestError(f"{path} is larger than {max_bytes} bytes", param="path")
                    return data
            path = redirect
        raise PathEscapeError(f"too many symbolic links in {path!r}")

    def write_bytes(self, path: str, data: bytes) -> None:
        for _ in range(_MAX_SYMLINK_HOPS):
            with self._parent(path, create=True) as (dir_fd, name):
                redirect = self._final_symlink(path, dir_fd, name)
                if redirect is None:
                    try:
                        fd = os.open(name, _WRITE_FLAGS, 0o644, dir_fd=dir_fd)
                    except OSError as exc:
                        if exc.errno != errno.ENXIO:  # a FIFO nobody reads
                            raise
                        raise InvalidRequestError(f"{path} is not a regular file", param="path") from None
                    with os.fdopen(fd, "wb") as f:
                        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                            raise InvalidRequestError(f"{path} is not a regular file", param="path")
                        f.write(data)
                    self._chown(name, dir_fd)
                    return
            path = redirect
        raise PathEscapeError(f"too many symbolic links in {path!r}")

    def delete(self, path: str) -> None:
        with self._parent(path, create=False) as (dir_fd, name):
            try:
                if stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
                    raise InvalidRequestError(f"{path} is a directory", param="path")
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                raise InvalidRequestError(f"no such file: {path}", param="path") from None

    def regular_files(self, directory: str) -> Iterator[FileInfo]:
        """Regular files under `directory`, recursively; symlinks are listed never followed."""
        relative = workspace_relative(directory)
        try:
            # Resolve a dummy child so that `directory` itself is walked like any parent.
            with self._parent(posixpath.join(relative, "_"), create=False) as (dir_fd, _):
                top = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
        except InvalidRequestError:
            return
        yield from self._walk(top, relative)

    def _walk(self, fd: int, prefix: str) -> Iterator[FileInfo]:
        try:
            for entry in sorted(os.listdir(fd)):
                st = os.lstat(entry, dir_fd=fd)
                child_path = f"{prefix}/{entry}" if prefix else entry
                if stat.S_ISREG(st.st_mode):
                    yield FileInfo(child_path, st.st_size, st.st_mode, st.st_mtime_ns)
                elif stat.S_ISDIR(st.st_mode):
                    child = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    yield from self._walk(child, child_path)
        finally:
            os.close(fd)

    def open_regular(self, path: str) -> int:
        """An fd for reading a regular file found by `regular_files` (no symlink following)."""
        with self._parent(path, create=False) as (dir_fd, name):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise InvalidRequestError(f"{path} is not a regular file", param="path")
            return fd
