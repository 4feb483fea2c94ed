"""Load traces for the alert and rebalance tests: one hour of cpu readings whose raises and
continues were counted by hand."""

from __future__ import annotations


def hour_trace() -> list[int]:
    """One hour (t = 0 .. 3600 s every 10 s) of cpu percent, in phases counted by hand below."""
    trace: list[int] = []

    def phase(until: int, pct: int) -> None:
        while len(trace) * 10 < until:
            trace.append(pct)

    phase(600, 40)  # A: quiet
    phase(630, 95)  # B: a 20 s spike (3 readings): nothing
    phase(900, 40)
    phase(1500, 90)  # C: raise at 960, continue at 1020 .. 1440 (8)
    phase(1800, 80)  # D: between min and max, continue at 1500 .. 1740 (5)
    phase(1830, 60)  # E: a 20 s dip below min: no trigger, no fall
    phase(2000, 80)  # F: continue at 1830 (overdue), 1890, 1950 (3)
    phase(2400, 50)  # G: falls at 2060
    phase(3000, 84)  # H: just below max: never raises
    phase(3610, 85)  # I: exactly max: raise at 3060, continue at 3120 .. 3600 (9)
    return trace


HOUR_REBALANCES = 1 + 8 + 5 + 3 + 1 + 9  # = 27, by hand from the phases above
