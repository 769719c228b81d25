"""A host the fleet meets for the first time: a few requests go to it, fleet-wide, until one answers.

Eight processes that each open eight connections to a new host send sixty
four requests before any of them hears what the host allows; a limiter with
no burst answers nearly all of them 429. So until the fleet has had one
response from a host, at most ``limit`` requests (CONCURRENT_REQUESTS_PER_DOMAIN,
what one crawler would send) go to it from the whole fleet: each process sends
only the first-contact sends Redis granted it. The first response opens the
host to every process. Pure: the caller passes the time.
"""

from __future__ import annotations

__all__ = ["FirstContact"]

CONTACT_WAIT = 10.0
"""Seconds a process waits for the fleet's first response before sending anyway
(a host that never answers is the host-down rules' business, not a reason to hold forever)."""


class FirstContact:
    """The hosts this process holds until the fleet has heard from them, and the sends it may make."""

    def __init__(self, limit: int, wait: float = CONTACT_WAIT) -> None:
        self.limit = limit
        self.wait = wait
        self._gated: dict[str, tuple[int, float]] = {}
        """Sends left here, and since when, per slot the fleet has not heard from."""

    def __len__(self) -> int:
        return len(self._gated)

    def meet(self, slot: str, now: float) -> bool:
        """A slot met for the first time: hold it until the fleet grants sends (True), if on."""
        if self.limit <= 0:
            return False
        self._gated[slot] = (0, now)
        return True

    def holds(self, slot: str, now: float) -> bool:
        """The slot may not send now: no first-contact send left, and no response yet."""
        gated = self._gated.get(slot)
        if gated is None:
            return False
        if now - gated[1] > self.wait:
            del self._gated[slot]
            return False
        return gated[0] <= 0

    def sent(self, slot: str) -> None:
        gated = self._gated.get(slot)
        if gated is not None:
            self._gated[slot] = (max(0, gated[0] - 1), gated[1])

    def claims(self) -> list[tuple[str, int]]:
        """(slot, how many) for each held slot with no send left: ask the fleet again."""
        return [(slot, self.limit) for slot, (left, _) in self._gated.items() if left <= 0]

    def granted(self, slot: str, count: int) -> bool:
        """The fleet's answer: ``count`` sends, or -1 when it has heard from the host. True if the slot may send."""
        gated = self._gated.get(slot)
        if gated is None:
            return False
        if count < 0:
            del self._gated[slot]
            return True
        if count > 0:
            self._gated[slot] = (gated[0] + count, gated[1])
            return True
        return False

    def answered(self, slot: str) -> bool:
        """A response came from the slot: True if it was held (the fleet must hear of it)."""
        return self._gated.pop(slot, None) is not None

    def sweep(self, now: float) -> None:
        """Drop the holds that waited out their time."""
        for slot in [slot for slot, (_, since) in self._gated.items() if now - since > self.wait]:
            del self._gated[slot]
