"""How much of a model's time offline work may take, so that it never starves online work.

Offline work is a batch job's messages: they wait at the lowest priority step of a model's
queue and fill what online requests and async jobs leave (``wire.broker.PRIORITY_OFFLINE``).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class OfflineShare:
    """How many offline messages a pop may take, so that offline work never starves online.

    A slot is not free on a model whose rows cost compute: a batch padded with offline
    rows runs longer, and the online requests in it and behind it wait for them. So while
    online or async work has come within ``QUIET_S``, offline work may take only ``SHARE``
    of the model's execution time: each execution with such work earns offline work that
    share of its duration, spent at the recent time per row, and a pop takes the messages
    the credit buys (an offline message carries several of a batch job's lines as rows:
    line_packing). With no such work about, offline work takes every slot. Why ``SHARE`` is
    what it is, and what online traffic kept beside a batch job at other shares:
    bench/README.md, text_embedding runs 3 and 4.
    """

    SHARE = 0.05
    QUIET_S = 0.5
    MAX_CREDIT_S = 0.1  # unused credit does not pile up into a burst of offline work
    RUN_S = 0.1  # offline work one pop takes when it may take every slot, in execution time

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.protected_at = float("-inf")  # when online or async rows last ran
        self.credit_s = 0.0
        self.row_s = 0.0  # recent execution time per row
        self.message_rows = 0.0  # recent rows per offline message (0: none seen yet)

    def allowance(self) -> int | None:
        """Offline messages the next pop may take (None: no limit)."""
        if self.clock() - self.protected_at > self.QUIET_S:
            return None
        if self.row_s <= 0 or self.credit_s <= 0:
            return 0
        if not self.message_rows:  # how many rows a message holds is not known yet
            return min(1, int(self.credit_s / self.row_s))
        return int(self.credit_s / (self.row_s * self.message_rows))

    def held_for(self) -> float | None:
        """How long offline work is held back for now (until online work has been quiet
        for ``QUIET_S``), or None when it is not."""
        left = self.protected_at + self.QUIET_S - self.clock()
        return left if left > 0 else None

    def ran(self, seconds: float, protected_rows: int, offline_rows: int) -> None:
        """An execution of ``seconds`` ran these rows: online and async ones, and offline
        ones (whose cost was spent when they were taken: ``took``)."""
        rows = protected_rows + offline_rows
        if rows <= 0:
            return
        per_row = seconds / rows
        self.row_s = per_row if not self.row_s else 0.8 * self.row_s + 0.2 * per_row
        if not protected_rows:
            # Time spent on offline work alone is not quiet time: online work that came
            # meanwhile waits in the queue unseen, so a long run of offline work must not
            # count as its absence (else it takes every slot next and starves online work).
            if self.clock() - seconds - self.protected_at <= self.QUIET_S:
                self.protected_at += seconds
        else:
            self.protected_at = self.clock()
            earned = seconds * self.SHARE / (1 - self.SHARE)
            # Unused credit stays bounded, but never below what one message costs.
            cap = max(self.MAX_CREDIT_S, self.row_s * self.message_rows)
            self.credit_s = min(cap, self.credit_s + earned)

    def took(self, rows: int, messages: int) -> None:
        """A pop took ``messages`` offline messages of ``rows`` rows. Their time is spent
        now, so the pops before they run (a prefetch, the next batch's) cannot spend it
        again."""
        if messages > 0:
            each = rows / messages
            self.message_rows = (
                each if not self.message_rows else 0.8 * self.message_rows + 0.2 * each
            )
        if rows and self.clock() - self.protected_at <= self.QUIET_S:
            self.credit_s -= rows * self.row_s

    def refund(self, rows: int) -> None:
        """Offline messages of ``rows`` rows went back to the queue unrun (a batch had no
        room for them). ``took`` spent their time when they were taken; it is given back,
        or the share would pay for work that never ran and starve offline work for it."""
        if rows and self.clock() - self.protected_at <= self.QUIET_S:
            self.credit_s += rows * self.row_s

    def fill(self, rows: int) -> int:
        """How many offline messages a pop for ``rows`` rows takes (at least one): those
        that fill them, and no more than run in about ``RUN_S``, so online requests that
        come while they run wait for little even when offline work has every slot."""
        if not self.message_rows:  # none taken yet: a message a row, what is over goes back
            return rows
        if self.row_s > 0:
            rows = min(rows, int(self.RUN_S / self.row_s))
        return max(1, int(rows / self.message_rows))
