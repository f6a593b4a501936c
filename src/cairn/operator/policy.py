"""Approval policies: when a call of a tool waits for a person, who may decide it, for how
long, and what the person sees.

An operator tool carries its policy (`@cairn.tool(needs_approval=..., approvers=...,
approval_ttl=..., review=...)`); an agent gives one per built-in tool
(`cairn.Agent(approvals={"shell": cairn.commands_matching(r"^git push")})`). A policy is
data the approval gate reads through `LoadedAgent.approval_for`: it decides nothing itself
and holds no call. It is also part of the agent's revision, so `describe()` gives a stable
JSON form of it, predicates included (`callable_identity`).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import marshal
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic_core import to_jsonable_python

from cairn.errors import AgentDefinitionError

__all__ = [
    "DEFAULT_APPROVERS",
    "ApprovalPolicy",
    "ApprovalRequirement",
    "ArgumentsMatching",
    "Predicate",
    "ReviewBuilder",
    "callable_identity",
    "commands_matching",
    "matching",
]

log = logging.getLogger(__name__)

DEFAULT_APPROVERS = frozenset({"admin", "approver"})
_SUMMARY_CHARS = 200

# A predicate over a call's parsed arguments: True means the call needs an approval.
Predicate = Callable[[Mapping[str, Any]], bool]
# Builds the redacted snapshot an approver sees from a call's parsed arguments.
ReviewBuilder = Callable[[Mapping[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class ApprovalRequirement:
    """What the gate needs to hold a call for a person."""

    approvers: frozenset[str]  # roles allowed to decide
    ttl_s: float | None  # None: the deployment's default
    review: Mapping[str, Any]  # the redacted snapshot an approver sees (default: the arguments)
    summary: str  # one line, e.g. "deploy_release(release='r-42')"


@dataclass(frozen=True, slots=True)
class ArgumentsMatching:
    """A predicate as data: the call needs approval when the text argument `argument` matches
    one of `patterns` (regular expressions, searched anywhere in the text)."""

    argument: str
    patterns: tuple[str, ...]
    _compiled: tuple[re.Pattern[str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.patterns:
            raise AgentDefinitionError(f"matching({self.argument!r}) needs at least one pattern")
        try:
            compiled = tuple(re.compile(p) for p in self.patterns)
        except re.error as exc:
            raise AgentDefinitionError(f"matching({self.argument!r}): bad pattern {exc.pattern!r}: {exc}") from exc
        object.__setattr__(self, "_compiled", compiled)

    def __call__(self, arguments: Mapping[str, Any]) -> bool:
        value = arguments.get(self.argument)
        return isinstance(value, str) and any(p.search(value) for p in self._compiled)

    def describe(self) -> dict[str, Any]:
        return {"argument": self.argument, "patterns": list(self.patterns)}


def matching(argument: str, *patterns: str) -> ArgumentsMatching:
    """Needs approval when the text argument `argument` matches any of the regular expressions."""
    return ArgumentsMatching(argument, patterns)


def commands_matching(*patterns: str) -> ArgumentsMatching:
    """For `shell`: needs approval when the command matches any of the regular expressions."""
    return ArgumentsMatching("command", patterns)


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """When a tool's calls need an approval (`needs_approval`: never, always, or a predicate
    over the parsed arguments), who may decide (`approvers`, roles), how long a request stays
    open (`ttl_s`; None = the deployment's default) and what the approver sees (`review`; by
    default the arguments)."""

    needs_approval: bool | Predicate = False
    approvers: frozenset[str] = DEFAULT_APPROVERS
    ttl_s: float | None = None
    review: ReviewBuilder | None = None

    def __post_init__(self) -> None:
        owner = "cairn.ApprovalPolicy"
        if not isinstance(self.needs_approval, bool) and not callable(self.needs_approval):
            raise AgentDefinitionError(f"{owner}: needs_approval must be True, False or a predicate, not {self.needs_approval!r}")
        if self.review is not None and not callable(self.review):
            raise AgentDefinitionError(f"{owner}: review must be a function of the arguments, not {self.review!r}")
        object.__setattr__(self, "approvers", _approvers(owner, self.approvers))
        object.__setattr__(self, "ttl_s", _ttl(owner, self.ttl_s))

    @classmethod
    def of(
        cls,
        owner: str,
        *,
        needs_approval: bool | Predicate | ApprovalPolicy = False,
        approvers: Iterable[str] | None = None,
        approval_ttl: float | timedelta | None = None,
        review: ReviewBuilder | None = None,
    ) -> ApprovalPolicy:
        """A checked policy for `owner` (a tool, named in errors)."""
        if isinstance(needs_approval, ApprovalPolicy):
            return needs_approval
        try:
            return cls(needs_approval, _approvers(owner, approvers), _ttl(owner, approval_ttl), review)
        except AgentDefinitionError as exc:
            raise AgentDefinitionError(exc.message.replace("cairn.ApprovalPolicy", owner, 1)) from None

    @property
    def may_need_approval(self) -> bool:
        return self.needs_approval is not False

    def requirement(self, tool_name: str, parsed: Mapping[str, Any] | None, snapshot: Mapping[str, Any]) -> ApprovalRequirement | None:
        """What a call with these arguments needs: None when it runs without an approval.

        `parsed` is None for arguments that do not validate: such a call gets a requirement
        (fail closed) with an empty review, since what it carries cannot be redacted.
        `snapshot` is the arguments as JSON, shown when there is no `review`."""
        if parsed is None:
            return self._required(tool_name, {}) if self.may_need_approval else None
        if not self._needed(tool_name, parsed):
            return None
        return self._required(tool_name, self._review(tool_name, parsed, snapshot))

    def describe(self) -> dict[str, Any]:
        """The policy as stable JSON (for the revision and the API)."""
        needs = self.needs_approval if isinstance(self.needs_approval, bool) else {"predicate": callable_identity(self.needs_approval)}
        return {
            "needs_approval": needs,
            "approvers": sorted(self.approvers),
            "ttl_s": self.ttl_s,
            "review": callable_identity(self.review) if self.review is not None else None,
        }

    def _needed(self, tool_name: str, parsed: Mapping[str, Any]) -> bool:
        if isinstance(self.needs_approval, bool):
            return self.needs_approval
        try:
            return bool(self.needs_approval(parsed))
        except Exception:
            log.exception("the needs_approval predicate of %s failed; the call needs an approval", tool_name)
            return True

    def _review(self, tool_name: str, parsed: Mapping[str, Any], snapshot: Mapping[str, Any]) -> Mapping[str, Any]:
        if self.review is None:
            return snapshot
        try:
            review = to_jsonable_python(self.review(parsed))
        except Exception as exc:
            # Never fall back to the arguments: the review exists to hide some of them.
            log.exception("the review of %s failed; the approver sees no arguments", tool_name)
            return {"review_failed": f"{type(exc).__name__}: the tool's review function failed"}
        if not isinstance(review, dict):
            log.error("the review of %s returned %s, not a mapping; the approver sees no arguments", tool_name, type(review).__name__)
            return {"review_failed": "the tool's review function did not return a mapping"}
        return review

    def _required(self, tool_name: str, review: Mapping[str, Any]) -> ApprovalRequirement:
        return ApprovalRequirement(self.approvers, self.ttl_s, review, summary(tool_name, review))


def summary(tool_name: str, review: Mapping[str, Any]) -> str:
    """One line naming the call: `name(key=value, ...)` from the review, clipped."""
    text = f"{tool_name}({', '.join(f'{k}={v!r}' for k, v in review.items())})"
    return text if len(text) <= _SUMMARY_CHARS else text[: _SUMMARY_CHARS - 4] + "...)"


def _approvers(owner: str, approvers: Iterable[str] | None) -> frozenset[str]:
    if approvers is None:
        return DEFAULT_APPROVERS
    if isinstance(approvers, str):
        raise AgentDefinitionError(f"{owner}: approvers is a list of roles, e.g. [{approvers!r}]")
    roles = frozenset(approvers)
    if not roles or not all(isinstance(r, str) and r.strip() for r in roles):
        raise AgentDefinitionError(f"{owner}: approvers must name at least one role (e.g. ['approver'])")
    return roles


def _ttl(owner: str, ttl: float | timedelta | None) -> float | None:
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < float("inf"):
        raise AgentDefinitionError(f"{owner}: approval_ttl must be a positive number of seconds or a timedelta, not {ttl!r}")
    return float(seconds)


def callable_identity(fn: Callable[..., Any]) -> Any:
    """A JSON value that names `fn` and changes when its code does: data for a predicate that
    is data (`matching`), else its qualified name and a digest of its source (of its code when
    the source is not available). Values a closure captures are not part of it: they may not
    have a stable text form, and an identity that changed from one process to the next would
    make every pinned session look changed."""
    if isinstance(fn, ArgumentsMatching):
        return {"matching": fn.describe()}
    target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn)
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"
    try:
        body = inspect.getsource(target).encode()
    except (OSError, TypeError):
        code = getattr(target, "__code__", None)
        body = marshal.dumps(code.co_code) if code is not None else name.encode()
    return {"callable": name, "sha256": hashlib.sha256(body).hexdigest()}
