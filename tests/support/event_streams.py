"""Server-sent events, as the dashboard streams them."""

from __future__ import annotations

import json
from typing import Any


async def next_message(response: Any) -> dict[str, Any]:
    """The next ``data:`` message of an event stream."""
    while True:
        line = (await response.content.readline()).decode()
        if line.startswith("data: "):
            return dict(json.loads(line[len("data: ") :]))
