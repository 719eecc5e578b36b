"""One training loop for every trainer in the project: seeding, threads, progress and a log.

The world model, the induction model, grokking, in-context regression and relabelling fine-tunes
all train with it, so each seeds, sets its thread count and reports progress the same way::

    seed_torch(config.seed)                           # before the model is built
    loop = TrainingLoop(config.steps, desc="pretrain", threads=config.threads, progress=progress)
    for step in loop:
        loss = model(...).loss
        loop.optimize(loss, opt, clip=1.0)            # zero_grad, backward, clip, step
        if loop.logging(step):
            loop.log(step, loss=loss.item())          # a row of ``loop.rows`` and the bar's postfix
        if done:
            loop.stop()

``threads`` applies for the loop's duration only (the caller's setting is restored); ``None``
keeps the current one. A row gets the step first and the wall-clock ``seconds`` last. A resumed
run passes ``start`` (the first step still to run), the rows logged so far and the seconds they
took, so its log reads as one run's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from .progress import progress_bar


def seed_torch(value: int) -> None:
    """Seed torch's global generator, from which the trainers draw initial weights and adapters.
    (The caller's numpy and Python generators are left alone; the trainers draw data from
    generators of their own, seeded from their configuration.)"""
    torch.manual_seed(value)


class TrainingLoop:
    """Iterate over ``steps`` training steps with a progress bar, a thread setting and a log."""

    def __init__(
        self,
        steps: int,
        *,
        desc: str = "train",
        threads: int | None = None,
        progress: bool | None = None,
        log_every: int = 50,
        start: int = 0,
        rows: list[dict] | None = None,
        elapsed: float = 0.0,
    ):
        self.steps = steps
        self.start = start
        self.elapsed = elapsed
        self.desc = desc
        self.threads = threads
        self.progress = progress
        self.log_every = log_every
        self.rows: list[dict] = list(rows or [])
        self._stop = False
        self._bar = None
        self._start = time.time()

    def __iter__(self) -> Iterator[int]:
        before = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        self._start = time.time() - self.elapsed
        self._bar = progress_bar(range(self.start, self.steps), desc=self.desc, unit="step", progress=self.progress)
        try:
            for step in self._bar:
                yield step
                if self._stop:
                    break
        finally:
            self._bar.close()
            torch.set_num_threads(before)

    def logging(self, step: int) -> bool:
        """Whether ``step`` is one to log: every ``log_every`` steps and the last."""
        return step % self.log_every == 0 or step == self.steps - 1

    def log(self, step: int, **values) -> dict:
        row = {"step": step, **values, "seconds": round(time.time() - self._start, 1)}
        self.rows.append(row)
        if self._bar is not None:
            self._bar.set_postfix({k: f"{v:.3g}" if isinstance(v, float) else v for k, v in values.items()})
        return row

    @property
    def seconds(self) -> float:
        return time.time() - self._start

    @staticmethod
    def optimize(loss: torch.Tensor, optimizer: torch.optim.Optimizer, clip: float | None = None, params=None) -> None:
        """``zero_grad``, ``backward``, optional gradient-norm clipping of ``params``, ``step``."""
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(
                params if params is not None else [p for g in optimizer.param_groups for p in g["params"]], clip
            )
        optimizer.step()

    def stop(self) -> None:
        """End the loop after the current step."""
        self._stop = True
