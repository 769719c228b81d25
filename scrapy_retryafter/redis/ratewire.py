"""A learned rate as the fleet writes it in Redis's rates hash, and the checked reading of it.

Kept apart from the exchange: it is a wire format, read by every process of the
fleet, and its writer (the fleet rules) and reader must agree on it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .script import MAX_RATE

__all__ = ["Rate", "bounded", "rate_value", "read_rates", "text"]

Rate = tuple[str, float, bool, str]
"""(slot, rate, cut?, who wrote it)."""

_NUMBER = r"([0-9][0-9.eE+-]{0,30})"
_RATE = re.compile(rf"^{_NUMBER}:(cut|pin|grow)(?:@{_NUMBER})?(?:~{_NUMBER})? (\S{{1,200}})$")


def text(item: Any) -> str:
    if not isinstance(item, bytes):
        return str(item)
    try:
        return item.decode("utf-8", "surrogatepass")  # a slot name sent with a lone surrogate comes back as itself
    except UnicodeDecodeError:
        return item.decode("utf-8", "replace")


def bounded(raw: str, low: float, high: float) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and low <= value <= high else None


def read_rates(flat: list[Any], plateaus: dict[str, tuple[float, bool, float]]
           ) -> tuple[list[Rate], tuple[float, str] | None, int]:
    """(slot, rate, cut?, who) of each well-formed entry; the cursor past the last; how many were garbage. A
    value is ``rate:cut@plateau~passed`` (``pin``: pinned down; ``~passed`` at slow start's exit) or
    ``rate:grow``, then who; plateaus go in ``plateaus``."""
    read: list[Rate] = []
    texts = [text(item) for item in flat]
    cursor: tuple[float, str] | None = None
    garbage = 0
    for slot, value, at in zip(texts[::3], texts[1::3], texts[2::3]):
        cursor = (float(at), slot)
        if not value:
            continue  # deleted meanwhile
        match = _RATE.match(value)
        rate = bounded(match.group(1), 0.0, MAX_RATE) if match else None
        if match is None or rate is None or rate <= 0.0:
            garbage += 1
            continue
        plateau = bounded(match.group(3), 0.0, MAX_RATE) if match.group(3) else None
        passed = bounded(match.group(4), 0.0, MAX_RATE) if match.group(4) else 0.0
        garbage += bool(match.group(3)) and not (plateau or 0.0) >= rate  # the cut stands, its plateau not
        garbage += bool(match.group(4)) and not 0.0 < (passed or 0.0) < rate
        if match.group(2) != "grow" and plateau is not None and plateau >= rate:
            plateaus[slot] = (plateau, match.group(2) == "pin", passed if passed and passed < rate else 0.0)
        read.append((slot, rate, match.group(2) != "grow", match.group(5)))
    return read, cursor, garbage


def rate_value(rate: float, kind: str, plateau: float | None = None, passed: float = 0.0) -> str:
    """``kind`` is ``cut``, ``pin`` (a cut pinned down) or ``grow``; a cut's ``plateau`` is what its
    cutter regrows to, ``passed`` the pace slow start last passed when the cut was its exit."""
    value = f"{rate!r}:{kind}"
    if plateau is not None:
        value += f"@{plateau!r}"
    if 0.0 < passed < rate:
        value += f"~{passed!r}"
    return value
