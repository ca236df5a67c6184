"""Run an Airflow trigger to its end while a 10 ms ticker measures how long it blocks the loop."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def collect(trigger: Any) -> tuple[list[dict[str, Any]], float]:
    """The trigger's event payloads, and the longest the event loop was kept from the ticker."""
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    events = [event.payload async for event in trigger.run()]
    tick.cancel()
    return events, max(gaps, default=0.0)
