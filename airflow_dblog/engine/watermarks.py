"""The watermark strategy of a stream: the mode its config names, as its source kind offers it.

The strategies themselves live with their database (``sources/<kind>/watermarks.py``); the
registry lists them per kind.
"""

from __future__ import annotations

from typing import Any

from airflow_dblog.errors import ConfigError
from airflow_dblog.sources.base import Source
from airflow_dblog.sources.registry import KINDS, source_kind
from airflow_dblog.sources.watermark import WatermarkStrategy

STRATEGIES: dict[tuple[str, str], type[WatermarkStrategy[Any]]] = {
    (mode, kind.name): strategy
    for kind in KINDS.values()
    for mode, strategy in kind.watermark_strategies().items()
}
"""Every strategy by (watermark mode, source kind)."""


def watermark_strategy(mode: str, source: Source, stream: str) -> WatermarkStrategy[Any]:
    """The strategy of ``source.watermark`` for this source, checked against the server."""
    offered = source_kind(source.kind).watermark_strategies()
    try:
        kind = offered[mode]
    except KeyError:
        raise ConfigError(
            f"source.watermark {mode!r} is not available on {source.kind}",
            f"set source.watermark to one of: {', '.join(sorted(offered))}",
        ) from None
    strategy = kind(source, stream)
    strategy.check()
    return strategy
