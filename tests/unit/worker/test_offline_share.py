"""OfflineShare: how much of a model's time offline work (batch jobs' messages) may take."""

from __future__ import annotations

import math

from conch.worker.offline_share import OfflineShare


def test_offline_share_lets_offline_work_take_a_share_of_the_time_while_online_work_runs() -> None:
    now = [100.0]
    share = OfflineShare(clock=lambda: now[0])
    assert share.allowance() is None  # nothing online about: offline work takes every slot
    earned = 0.04 * OfflineShare.SHARE / (1 - OfflineShare.SHARE)  # per 40 ms online batch
    runs = 0
    while share.allowance() in (None, 0):  # online batches of 8 rows, 5 ms a row
        share.ran(0.04, protected_rows=8, offline_rows=0)
        runs += 1
    assert runs == math.ceil(0.005 / earned)  # offline work gets SHARE of the time, no more
    assert share.allowance() == 1
    share.took(1, 1)  # a pop took an offline message of one row: its time is spent
    share.ran(0.045, protected_rows=8, offline_rows=1)
    assert share.allowance() == int((runs * earned + earned * 45 / 40 - 0.005) / 0.005)
    for _ in range(1000):  # however long online work runs, unused credit stays bounded
        share.ran(0.04, protected_rows=8, offline_rows=0)
    assert share.allowance() == int(OfflineShare.MAX_CREDIT_S / 0.005)
    now[0] += OfflineShare.QUIET_S + 0.01
    assert share.allowance() is None  # online went quiet: every slot again
    assert share.held_for() is None


def test_offline_share_counts_the_rows_an_offline_message_carries() -> None:
    """An offline message carries many of a batch job's lines (line_packing): the credit
    buys messages at their rows' cost, and one message is affordable even when it costs
    more than the cap."""
    now = [100.0]
    share = OfflineShare(clock=lambda: now[0])
    for _ in range(1000):  # online batches of 8 rows, 10 ms a row
        share.ran(0.08, protected_rows=8, offline_rows=0)
    assert share.allowance() == 1  # before any message ran: one, whatever it holds
    share.took(16, 1)  # a message of 16 rows, 160 ms: spent when taken, before it runs
    assert share.allowance() == 0  # so the pop before it runs takes no other
    share.ran(0.24, protected_rows=8, offline_rows=16)
    assert share.allowance() == 0  # its cost is owed
    runs = 0
    while not share.allowance():
        share.ran(0.08, protected_rows=8, offline_rows=0)
        runs += 1
    # Paid back at SHARE of the time: from MAX_CREDIT_S less the message's 160 ms (plus the
    # share its own execution earned) up to one message's cost, the cap now, above MAX_CREDIT_S.
    k = OfflineShare.SHARE / (1 - OfflineShare.SHARE)
    assert runs == math.ceil((0.16 - (OfflineShare.MAX_CREDIT_S - 0.16 + 0.24 * k)) / (0.08 * k))
    for _ in range(1000):
        share.ran(0.08, protected_rows=8, offline_rows=0)
    assert share.allowance() == 1


def test_offline_share_does_not_take_time_spent_on_offline_work_for_quiet() -> None:
    """Online requests that come while offline work runs wait unseen in the queue: a long
    run of offline work right after online work must not make the model look quiet (every
    slot to offline work)."""
    now = [100.0]
    share = OfflineShare(clock=lambda: now[0])
    share.ran(0.04, protected_rows=8, offline_rows=0)
    for _ in range(3):  # offline work alone, 0.4 s each: 1.2 s since online rows last ran
        now[0] += 0.4
        share.ran(0.4, protected_rows=0, offline_rows=32)
    assert share.allowance() is not None and share.held_for() is not None
    now[0] += OfflineShare.QUIET_S + 0.01  # then nothing at all for QUIET_S: quiet
    assert share.allowance() is None


def test_offline_share_fills_a_pop_with_the_messages_that_run_briefly() -> None:
    """With every slot theirs, offline messages come a few rows' worth at a time (RUN_S),
    so an online request that comes next waits for little; at least one message, whatever
    it holds."""
    share = OfflineShare()
    assert share.fill(64) == 64  # nothing known of the messages yet: the pop's count
    share.took(64, 2)  # two messages of 32 rows
    share.ran(0.32, protected_rows=0, offline_rows=64)  # 5 ms a row
    assert OfflineShare.RUN_S / 0.005 < 32  # less than one message's rows run in it...
    assert share.fill(64) == 1  # ...so one message a pop, not the two that fill 64 rows
    cheap = OfflineShare()
    cheap.took(16, 4)  # messages of 4 rows, 0.1 ms a row: the pop's rows decide
    cheap.ran(0.0016, protected_rows=0, offline_rows=16)
    assert cheap.fill(64) == 16


def test_a_refund_gives_back_what_offline_messages_sent_back_unrun_had_spent() -> None:
    """A batch with no room for offline messages sends them back: the time ``took`` spent
    on them is given back, so the next pop may take them again at once."""
    now = [100.0]
    share = OfflineShare(clock=lambda: now[0])
    share.took(8, 1)  # offline messages hold 8 rows (taken while quiet: nothing spent)
    for _ in range(1000):  # online batches of 8 rows, 5 ms a row: credit at its cap
        share.ran(0.04, protected_rows=8, offline_rows=0)
    before = share.allowance()
    assert before == int(OfflineShare.MAX_CREDIT_S / (0.005 * 8)) == 2
    share.took(8, 1)  # a message of 8 rows, 40 ms: spent when taken
    share.took(8, 1)
    assert share.allowance() == 0
    share.refund(16)  # both went back to the queue unrun
    assert share.allowance() == before
    assert share.message_rows == 8  # what a message holds is still known
    share.refund(0)
    assert share.allowance() == before
    now[0] += OfflineShare.QUIET_S + 0.01  # quiet: no credit is kept, nor given back
    credit = share.credit_s
    share.refund(16)
    assert share.credit_s == credit and share.allowance() is None
