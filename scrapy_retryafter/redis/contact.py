"""A host the fleet meets for the first time: a few requests go to it, fleet-wide, until one answers.

Eight processes that each open eight connections to a new host send sixty
four requests before any of them hears what the host allows; a limiter with
no burst answers nearly all of them 429. So until the fleet has had one
response from a host, at most ``limit`` requests (CONCURRENT_REQUESTS_PER_DOMAIN,
what one crawler would send) go to it from the whole fleet: each process sends
only the first-contact sends Redis granted it. The first response opens the
host to every process, once the requests this process's downloader took for
the host while it was held have all left it (answered, or failed without a
response) or one of them was throttled: told at the first success of eight, a fleet opened its other
processes to a host that refused the other seven, and each sent its unpaced
burst into the cooldown before it heard of it. Each request is counted by the
hold it reached the downloader in (robots.txt too, which no queue releases),
so one from an earlier hold lowers no count. A send that never leaves would
hold the host for CONTACT_WAIT, so a success opens it anyway after as long
again as the hold had lasted, SETTLE at least, and never past the hold's end.
Pure: the caller passes the time.

The board drops a slot with nothing to remember (no pace, no cooldown) after
each answer, and meets it again at its next request. A slot met again keeps
the sends it was granted, and one this process heard from while unpaced is
not held again for half an hour after its last answer: held, every wave of
requests to a host never throttled waited for the fleet's next answer (100
pages of a free host: 5.8 s, against 1.5 s without Redis). A slot answered
while paced here, or one another process published a pace for, is held when
met again, until the fleet's answer brings that pace. The fleet hears again
of an unpaced host answering here every HEARD_FOR / 2, with the next
exchange, so its ``seen`` (an hour in Redis) does not lapse while the host
is crawled; a paced host's ``seen`` may lapse, and the next process to meet
it is granted first-contact sends again (it asks the fleet's pace with them).
"""

from __future__ import annotations

import collections
import math

__all__ = ["FirstContact"]

CONTACT_WAIT = 10.0
"""Seconds a process waits for the fleet's first response before sending anyway
(a host that never answers is the host-down rules' business, not a reason to hold forever)."""
HEARD_MEMORY = 100_000
"""Hosts this process heard from, the newest kept; one that fell out is held once more, until the fleet answers."""
HEARD_FOR = 1800.0
"""Seconds a host heard from stays open here; the fleet's own ``seen`` lasts an hour from its last write."""
SETTLE = 1.0
"""The least a first-contact success waits for the other sends before it opens the host: a send
that never leaves the downloader would hold it CONTACT_WAIT. It waits as long again as the hold
had lasted, so a host whose answers are only slow still answers the others first."""


class FirstContact:
    """The hosts this process holds until the fleet has heard from them, and the sends it may make."""

    def __init__(self, limit: int, wait: float = CONTACT_WAIT, memory: int = HEARD_MEMORY) -> None:
        self.limit = limit
        self.wait = wait
        self.memory = memory
        self._gated: dict[str, tuple[int, float, int, float]] = {}
        """Sends left here, since when (the hold's mark), requests in the downloader, and when a
        success that waits for them opens the slot anyway (inf: none yet), per slot the fleet
        has not heard from."""
        self._heard: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()
        """Unpaced slots this process had a response from (or the fleet had): when, and when the fleet was last told."""

    def __len__(self) -> int:
        return len(self._gated)

    def meet(self, slot: str, now: float) -> bool:
        """A slot met (again, once the board dropped it): hold it until the fleet grants sends (True), if on."""
        if self.limit <= 0:
            return False
        heard = self._heard.get(slot)
        if heard is not None:
            if now - heard[0] < HEARD_FOR:
                self._heard.move_to_end(slot)
                return False
            del self._heard[slot]
        self._gated.setdefault(slot, (0, now, 0, math.inf))
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
            self._gated[slot] = (max(0, gated[0] - 1), gated[1], gated[2], gated[3])

    def reached(self, slot: str) -> float | None:
        """A request of the slot reached the downloader: counted while held; the hold's mark, for ``left``."""
        gated = self._gated.get(slot)
        if gated is None:
            return None
        self._gated[slot] = (gated[0], gated[1], gated[2] + 1, gated[3])
        return gated[1]

    def claims(self) -> list[tuple[str, int]]:
        """(slot, how many) for each held slot with no send left: ask the fleet again."""
        return [(slot, self.limit) for slot, (left, *_) in self._gated.items() if left <= 0]

    def granted(self, slot: str, count: int, now: float) -> bool:
        """The fleet's answer: ``count`` sends, or -1 when it has heard from the host. True if the slot may send."""
        gated = self._gated.get(slot)
        if gated is None:
            return False
        if count < 0:
            del self._gated[slot]
            self._hear(slot, now, now)
            return True
        if count > 0:
            self._gated[slot] = (gated[0] + count, gated[1], gated[2], gated[3])
            return True
        return False

    def answered(self, slot: str, now: float, paced: bool) -> tuple[bool, bool]:
        """A response came from the slot: (tell the fleet, it was held: tell it now).

        ``paced``: the slot has a pace here, or this answer was a throttle (a pace follows).
        A success while other first-contact sends are on the wire waits for them to leave the
        downloader (``left``), or for ``opens_at``: (False, False).
        """
        gated = self._gated.get(slot)
        if gated is not None and not paced and gated[2] > 1 and self.limit > 0:
            opens = min(gated[3], now + max(SETTLE, now - gated[1]), gated[1] + self.wait)
            self._gated[slot] = (gated[0], gated[1], gated[2], opens)
            return False, False
        held = self._gated.pop(slot, None) is not None
        if self.limit <= 0 or paced:
            self._heard.pop(slot, None)  # met again, it waits for the fleet's pace
            return held, held
        heard = self._heard.get(slot)
        if held or heard is None or now - heard[1] >= HEARD_FOR / 2:
            self._hear(slot, now, now)
            return True, held
        self._hear(slot, now, heard[1])
        return False, held

    def left(self, slot: str, mark: float, now: float) -> bool:
        """A request counted by ``reached`` (its ``mark``) left the downloader, answered or not: True
        when it was the last one a success waited for, which opens the slot (tell the fleet)."""
        gated = self._gated.get(slot)
        if gated is None or gated[1] != mark:
            return False
        wire = max(0, gated[2] - 1)
        if wire == 0 and gated[3] < math.inf:
            del self._gated[slot]
            self._hear(slot, now, now)
            return True
        self._gated[slot] = (gated[0], gated[1], wire, gated[3])
        return False

    def opens_at(self, slot: str) -> float:
        """When a success that waits for the slot's other sends opens it anyway (inf: none waits)."""
        gated = self._gated.get(slot)
        return math.inf if gated is None else gated[3]

    def settled(self, slot: str, now: float) -> bool:
        """A success has waited its time for the slot's other sends: open it here (True: tell the fleet)."""
        gated = self._gated.get(slot)
        if gated is None or now < gated[3]:
            return False
        del self._gated[slot]
        self._hear(slot, now, now)
        return True

    def paced_elsewhere(self, slot: str) -> None:
        """Another process published a pace for the slot: met again, it waits for the fleet's answer."""
        self._heard.pop(slot, None)

    def _hear(self, slot: str, now: float, told: float) -> None:
        self._heard[slot] = (now, told)
        self._heard.move_to_end(slot)
        if len(self._heard) > self.memory:
            self._heard.popitem(last=False)

    def sweep(self, now: float) -> list[str]:
        """Open the slots whose success waited its time, then drop the holds that waited out
        theirs; the slots opened (tell the fleet: no request may come to ask for them)."""
        opened = [slot for slot, gated in self._gated.items() if now >= gated[3]]
        for slot in opened:
            self.settled(slot, now)
        for slot in [slot for slot, (_, since, *_) in self._gated.items() if now - since > self.wait]:
            del self._gated[slot]
        return opened
