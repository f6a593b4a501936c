"""Test helpers shipped with the package: a workspace that exercises every fidelity rule, and a
comparable description of a tree.

`build_fidelity_workspace` makes what issue 4 lists: regular files, modes, old mtimes, empty
directories, symlinks inside and outside the workspace (absolute and dangling), hardlinks,
unicode, undecodable and odd file names, a sparse file, a FIFO, files owned by another uid
when run as root, and optionally a Python virtualenv. `describe_tree` returns everything a
restore must reproduce, so a round trip is checked with one `==`.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["build_fidelity_workspace", "describe_tree", "SANDBOX_UID"]

SANDBOX_UID = 4321
_OLD_NS = 1_000_000_000 * 1_000_000_000


def build_fidelity_workspace(root: Path, *, with_venv: bool = False, sparse_size: int = 64 * 1024 * 1024) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("print('hello')\n")
    (root / "src" / "run.sh").write_text("#!/bin/sh\necho run\n")
    os.chmod(root / "src" / "run.sh", 0o755)
    (root / "src" / "secret.txt").write_text("only me\n")
    os.chmod(root / "src" / "secret.txt", 0o600)
    (root / "empty" / "nested-empty").mkdir(parents=True)
    (root / "readonly").mkdir()
    (root / "readonly" / "frozen.txt").write_text("frozen\n")
    os.chmod(root / "readonly" / "frozen.txt", 0o444)
    os.chmod(root / "readonly", 0o555)
    (root / "data.bin").write_bytes(os.urandom(300_000))
    (root / "zero-length").write_bytes(b"")
    os.symlink("src/main.py", root / "link-inside")
    os.symlink("/etc/hostname", root / "link-outside-absolute")
    os.symlink("../../outside/of/workspace", root / "link-outside-relative")
    os.symlink("does-not-exist", root / "link-dangling")
    os.symlink("src", root / "link-to-dir")
    os.link(root / "data.bin", root / "hardlink-to-data.bin")
    (root / "unicode-é-日本-🙂.txt").write_text("unicode\n")
    (root / "with space and\nnewline").write_text("odd\n")
    (root / "-leading-dash").write_text("dash\n")
    os.close(os.open(os.path.join(os.fsencode(root), b"latin1-\xe9.txt"), os.O_CREAT | os.O_WRONLY, 0o644))
    with open(root / "sparse.img", "wb") as handle:
        handle.truncate(sparse_size)
        handle.seek(sparse_size // 2)
        handle.write(b"middle of a hole")
    os.mkfifo(root / "pipe")
    if os.geteuid() == 0:
        (root / "owned-by-sandbox").write_text("uid\n")
        os.chown(root / "owned-by-sandbox", SANDBOX_UID, SANDBOX_UID)
        os.lchown(root / "link-inside", SANDBOX_UID, SANDBOX_UID)
    if with_venv:
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True, capture_output=True
        )
    os.utime(root / "data.bin", ns=(_OLD_NS, _OLD_NS))
    os.utime(root / "link-inside", ns=(_OLD_NS, _OLD_NS), follow_symlinks=False)


def describe_tree(root: Path) -> dict[str, Any]:
    """Path → (kind, mode, uid, gid, mtime, size, content digest, link target, hardlink group)."""
    described: dict[str, Any] = {}
    inodes: dict[int, str] = {}
    root_bytes = os.fsencode(root)
    for directory, dirs, files in os.walk(root_bytes):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root_bytes).decode(errors="surrogateescape")
            st = os.lstat(path)
            kind = stat.S_IFMT(st.st_mode)
            item: dict[str, Any] = {
                "kind": kind,
                "mode": stat.S_IMODE(st.st_mode),
                "uid": st.st_uid,
                "gid": st.st_gid,
            }
            if stat.S_ISLNK(st.st_mode):
                item["target"] = os.readlink(path)
                item["mtime_ns"] = st.st_mtime_ns
            elif stat.S_ISREG(st.st_mode):
                item["mtime_ns"] = st.st_mtime_ns
                item["size"] = st.st_size
                item["link_group"] = inodes.setdefault(st.st_ino, relative)
                with open(path, "rb") as handle:
                    item["sha256"] = hashlib.file_digest(handle, "sha256").hexdigest()
            elif not stat.S_ISDIR(st.st_mode):
                item["mtime_ns"] = st.st_mtime_ns
            described[relative] = item
    return described
