"""Fault injection for the executors' tests: ``before`` hooks (:mod:`lab.executors`) importable
by name, so that a spawned worker process can unpickle them."""

from __future__ import annotations

import os


class KillOn:
    """Kill the worker process (no cleanup, as the OOM killer would) just before the job ``victim``."""

    def __init__(self, victim: str):
        self.victim = victim

    def __call__(self, label: str) -> None:
        if label == self.victim:
            os._exit(1)


def times_ten(x: int) -> int:
    return x * 10
