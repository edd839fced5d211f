"""Hyperband (`scheduler: {type: hyperband}`): brackets of asha's successive halving, each starting
its trials at a higher rung. With rungs r0 < r1 < ... < rK-1, bracket b starts its trials at rung
rb (bracket K trains them straight to the end); trial N is in bracket N mod (K + 1), and a trial
is ranked only against the trials of its own bracket. Pausing and promoting are asha's
(sweep/schedulers/asha.py); docs/schedulers.md says it for users."""

from __future__ import annotations

from sweep.schedulers.asha import Asha


class Hyperband(Asha):
    """asha's keys and rules; only the brackets differ."""

    def bracket(self, number: int, steps: int) -> int:
        return number % (len(self.rungs(steps)) + 1)
