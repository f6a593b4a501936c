"""Hot statements: constant Core statements compiled once per dialect and run as SQL text.

A tool step of the agent loop runs a handful of statements, and on a local SQLite database
SQLAlchemy's work per execution of an already compiled statement (cache lookup, parameter
and result processing, result objects) costs three to four times what SQLite spends
running it. A `Prepared` statement is still built from `tables.py` and compiled by
SQLAlchemy, for the connection's dialect; its parameters go through the column types' own
bind processors, and it runs in the caller's connection and transaction. Only the
per-execution work is skipped: on SQLite the SQL goes straight to the driver, on
PostgreSQL through `exec_driver_sql`. Results are not type-processed, so a prepared
statement returns counts and plain numbers only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.compiler import SQLCompiler

from cairn.errors import CairnMisuseError
from cairn.store.db import Connection, DriverParameters, DriverResult, InlineConnection

__all__ = ["Prepared"]


# A named bind: its value is given at each execution.
_GIVEN = object()


@dataclass(frozen=True, slots=True)
class _Compiled:
    dialect: sa.Dialect
    sql: str
    # (bind name, the bind processor of its type, the constant a literal in the statement
    # carries or _GIVEN), in the driver's parameter order.
    binds: Sequence[tuple[str, Callable[[Any], Any] | None, Any]]
    positional: bool

    def parameters(self, values: Mapping[str, Any]) -> DriverParameters:
        converted = []
        for name, process, constant in self.binds:
            value = values[name] if constant is _GIVEN else constant
            converted.append(value if process is None else process(value))
        return tuple(converted) if self.positional else dict(zip((name for name, _, _ in self.binds), converted))


class Prepared:
    """One constant statement (no values known only at execution, such as expanding IN lists).
    Named binds (`sa.bindparam("name")`) are given at each execution; literals written in the
    statement (`status == JobStatus.RUNNING`, `attempts + 1`) keep their value."""

    __slots__ = ("_compiled", "column_keys", "statement")

    def __init__(self, statement: sa.ClauseElement, *, column_keys: Sequence[str] | None = None) -> None:
        """`column_keys`: the columns an INSERT without explicit values sets (as `compile` takes them)."""
        self.statement = statement
        self.column_keys = list(column_keys) if column_keys is not None else None
        self._compiled: _Compiled | None = None

    def _for(self, dialect: sa.Dialect) -> _Compiled:
        compiled = self._compiled
        if compiled is None or compiled.dialect is not dialect:
            sql = self.statement.compile(dialect=dialect, column_keys=self.column_keys)
            assert isinstance(sql, SQLCompiler)
            assert not sql.post_compile_params and not sql.literal_execute_params, "not a constant statement"
            names = sql.positiontup if dialect.positional else list(sql.binds)
            assert names is not None
            binds = [
                (name, bind.type.dialect_impl(dialect).bind_processor(dialect), _GIVEN if bind.required else bind.value)
                for name, bind in ((name, sql.binds[name]) for name in names)
            ]
            compiled = self._compiled = _Compiled(dialect, sql.string, binds, dialect.positional)
        return compiled

    async def _run(self, conn: Connection, parameters: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> DriverResult:
        compiled = self._for(conn.dialect)
        converted = (
            compiled.parameters(parameters) if isinstance(parameters, Mapping) else [compiled.parameters(p) for p in parameters]
        )
        if isinstance(conn, InlineConnection):
            return conn.run_driver_sql(compiled.sql, converted)
        result = await conn.exec_driver_sql(compiled.sql, converted)
        return DriverResult(result.rowcount, result.fetchall() if result.returns_rows else [])

    async def execute(self, conn: Connection, parameters: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> int:
        """Run with one set of `parameters` (keyed by bind name), or once for each of a list;
        returns the number of rows changed."""
        return (await self._run(conn, parameters)).rowcount

    async def rows(self, conn: Connection, parameters: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
        """Run once and return the rows, as the driver gives them (not type-processed)."""
        return (await self._run(conn, parameters)).rows

    async def scalar(self, conn: Connection, parameters: Mapping[str, Any]) -> Any:
        """Run once and return the single value of the single row it returns."""
        rows = (await self._run(conn, parameters)).rows
        if len(rows) != 1 or len(rows[0]) != 1:
            raise CairnMisuseError(f"expected one value from {self.statement}, got {len(rows)} row(s)")
        return rows[0][0]
