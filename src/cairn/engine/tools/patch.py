"""The `apply_patch` grammar used by Codex-style agents: add, update (with move) and delete
files in one patch.

    *** Begin Patch
    *** Add File: PATH          followed by lines starting with "+"
    *** Update File: PATH       optionally "*** Move to: PATH", then hunks:
    @@ [anchor text]            each hunk: lines starting with " " (context), "-" or "+"
    *** Delete File: PATH
    *** End Patch

A hunk is located by its context and removed lines, searched forward from the previous
hunk: exactly first, then ignoring trailing whitespace, then ignoring surrounding
whitespace. A patch is parsed and checked completely before any file is touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cairn.errors import InvalidRequestError

__all__ = ["FileChange", "Hunk", "apply_hunks", "parse_patch"]


class PatchError(InvalidRequestError):
    default_code = "invalid_patch"


@dataclass(slots=True)
class Hunk:
    anchor: str | None
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    at_end: bool = False


@dataclass(slots=True)
class FileChange:
    kind: str  # "add" | "update" | "delete"
    path: str
    move_to: str | None = None
    content: list[str] = field(default_factory=list)
    hunks: list[Hunk] = field(default_factory=list)


_HEADERS = {"*** Add File: ": "add", "*** Update File: ": "update", "*** Delete File: ": "delete"}


def parse_patch(text: str) -> list[FileChange]:
    lines = text.replace("\r\n", "\n").strip("\n").split("\n")
    if not lines or lines[0].strip() != "*** Begin Patch":
        raise PatchError("a patch must start with '*** Begin Patch'", param="patch")
    if lines[-1].strip() != "*** End Patch":
        raise PatchError("a patch must end with '*** End Patch'", param="patch")
    changes: list[FileChange] = []
    for number, line in enumerate(lines[1:-1], start=2):
        header = next((h for h in _HEADERS if line.startswith(h)), None)
        if header is not None:
            path = line[len(header) :].strip()
            if not path:
                raise PatchError(f"line {number}: missing path", param="patch")
            changes.append(FileChange(kind=_HEADERS[header], path=path))
            continue
        if not changes:
            raise PatchError(f"line {number}: expected a file header, got {line!r}", param="patch")
        _parse_body_line(changes[-1], line, number)
    if not changes:
        raise PatchError("the patch changes no files", param="patch")
    for change in changes:
        if change.kind == "update" and not change.hunks and change.move_to is None:
            raise PatchError(f"update of {change.path} has no hunks", param="patch")
    return changes


def _parse_body_line(change: FileChange, line: str, number: int) -> None:
    if change.kind == "add":
        if not line.startswith("+"):
            raise PatchError(f"line {number}: lines of an added file start with '+'", param="patch")
        change.content.append(line[1:])
    elif change.kind == "delete":
        raise PatchError(f"line {number}: a deleted file takes no body", param="patch")
    elif line.startswith("*** Move to: "):
        change.move_to = line[len("*** Move to: ") :].strip()
    elif line.startswith("@@"):
        change.hunks.append(Hunk(anchor=line[2:].strip() or None))
    elif line.strip() == "*** End of File":
        if not change.hunks:
            raise PatchError(f"line {number}: '*** End of File' outside a hunk", param="patch")
        change.hunks[-1].at_end = True
    else:
        if not change.hunks:
            change.hunks.append(Hunk(anchor=None))
        hunk = change.hunks[-1]
        marker, body = (line[:1], line[1:]) if line else (" ", "")
        if marker == " ":
            hunk.old.append(body)
            hunk.new.append(body)
        elif marker == "-":
            hunk.old.append(body)
        elif marker == "+":
            hunk.new.append(body)
        else:
            raise PatchError(f"line {number}: hunk lines start with ' ', '-' or '+', got {line!r}", param="patch")


_MATCHERS: tuple[Callable[[str], str], ...] = (lambda s: s, str.rstrip, str.strip)


def _find(lines: Sequence[str], needle: Sequence[str], start: int, at_end: bool) -> int:
    if not needle:
        return len(lines) if at_end else start
    for norm in _MATCHERS:
        wanted = [norm(x) for x in needle]
        candidates = [len(lines) - len(needle)] if at_end else range(start, len(lines) - len(needle) + 1)
        for i in candidates:
            if i >= 0 and [norm(x) for x in lines[i : i + len(needle)]] == wanted:
                return i
    return -1


def apply_hunks(original: str, hunks: Sequence[Hunk], path: str) -> str:
    lines = original.split("\n")
    trailing_newline = original.endswith("\n")
    if trailing_newline:
        lines.pop()
    cursor = 0
    for number, hunk in enumerate(hunks, start=1):
        if hunk.anchor is not None:
            anchor_at = _find(lines, [hunk.anchor], cursor, False)
            if anchor_at >= 0:
                cursor = anchor_at + 1
        at = _find(lines, hunk.old, cursor, hunk.at_end)
        if at < 0:
            context = "\n".join(hunk.old[:5])
            raise PatchError(f"hunk {number} of {path} does not match the file; expected lines:\n{context}", param="patch")
        lines[at : at + len(hunk.old)] = hunk.new
        cursor = at + len(hunk.new)
    return "\n".join(lines) + ("\n" if trailing_newline or not original else "")
