"""One exception family whose message is always a single line: problem, then fix."""

from __future__ import annotations


class DblogError(Exception):
    """Any user-facing failure. ``str(err)`` is one line naming the problem and the fix."""

    def __init__(self, problem: str, fix: str | None = None) -> None:
        message = problem if fix is None else f"{problem}; {fix}"
        super().__init__(" ".join(message.split()))


class ConfigError(DblogError):
    """The YAML config is malformed or names something that cannot work."""


class SourceError(DblogError):
    """The source database is unreachable, misconfigured or lacks what capture needs."""


class InputError(DblogError):
    """A user's request (table, keys, settings) does not match the source."""


class MetadataError(DblogError):
    """The metadata store refused an operation (unknown dump, illegal state change)."""


class FencedError(DblogError):
    """This process lost the leader lease: another stream process leads and it must not write."""
