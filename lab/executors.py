"""Executors: where a study's independent jobs run.

A study is many independent jobs (here: one fine-tune per relation x method x seed x label
category), each carrying its own seed and writing its own result file atomically when it
finishes. An executor only decides *where* they run:

- :class:`SerialExecutor` (the default): one after another in this process;
- :class:`ProcessExecutor`: in ``workers`` local processes (spawned), one torch thread each by
  default;
- :class:`GroupedExecutor`: jobs of a stage that can train together (:attr:`lab.stages.Stage.group`:
  the study's fine-tunes, :func:`lab.study.finetune.finetune_group`) in groups of up to ``size``,
  each group one job of an inner executor (serial by default; ``"processes"`` or ``"ray"`` run
  several groups at once). A stage without a group function runs its jobs one by one on the inner
  executor;
- :class:`RayExecutor`: as Ray tasks on a Ray cluster (``ray.init()`` locally, or
  ``address="auto"`` / ``"ray://head:10001"`` for an existing cluster), one GPU per task when the
  cluster has GPUs. Install with ``pip install -e ".[ray]"``.

Because every job is seeded and writes its result as it finishes, a crashed worker or a killed
driver loses no finished job, and rerunning the study runs only what is missing.

**Threads.** Every executor takes ``threads=``, the torch threads each job runs with: by default
the serial executor keeps this process's setting and a Ray task uses the CPUs it was given
(``num_cpus``), so jobs never oversubscribe the machine (two 2-thread workers on 2 cores ran 10x
slower than two 1-thread ones). Float reductions depend on the thread count, so results are
bit-identical across executors when the jobs run with the same number of threads, e.g.
``SerialExecutor(threads=1)`` and ``RayExecutor(num_cpus=1)`` (tested); with different counts they
differ in the last digits. Jobs that fail are collected and reported together
(:class:`JobsFailedError`) after every other job has finished.

**A hook in the worker.** ``before=fn`` calls ``fn(label)`` where each job runs (in the Ray
worker, for Ray) just before the job: for logging, or for fault injection in tests (a hook that
kills its process on one label is how the tests check that a crashed worker loses nothing).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch

from interp.progress import progress_bar


class JobsFailedError(RuntimeError):
    """Some jobs failed; ``failures`` maps each failed item's index to its error."""

    def __init__(self, failures: dict[int, BaseException], labels: Sequence[str]):
        self.failures = failures
        lines = "\n".join(f"  {labels[i]}: {type(e).__name__}: {e}" for i, e in sorted(failures.items()))
        super().__init__(
            f"{len(failures)} job(s) failed (finished jobs are saved; rerun to retry only these):\n{lines}"
        )


class Executor(ABC):
    name: str = "executor"
    #: torch threads per job (None: the executor's default, see the module docstring)
    threads: int | None = None
    #: called with each job's label where the job runs, just before it (see the module docstring)
    before: Callable[[str], None] | None = None

    @abstractmethod
    def map(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[Any],
        on_result: Callable[[int, Any], None] | None = None,
        labels: Sequence[str] | None = None,
        desc: str = "jobs",
    ) -> list:
        """``fn`` on every item; ``on_result(index, result)`` as each finishes; results in item order."""


class SerialExecutor(Executor):
    name = "serial"

    def __init__(
        self, progress: bool | None = None, threads: int | None = None, before: Callable[[str], None] | None = None
    ):
        self.progress = progress
        self.threads = threads
        self.before = before

    def map(self, fn, items, on_result=None, labels=None, desc="jobs"):
        labels = list(labels or map(str, range(len(items))))
        results, failures = [None] * len(items), {}
        for i, item in enumerate(progress_bar(items, desc=desc, unit="jobs", progress=self.progress)):
            try:
                results[i] = _call_with_threads(fn, item, self.threads, self.before, labels[i])
            except Exception as err:  # keep going: every other job still runs and is saved
                failures[i] = err
                continue
            if on_result:
                on_result(i, results[i])
        if failures:
            raise JobsFailedError(failures, labels)
        return results


class RayExecutor(Executor):
    """Run jobs as Ray tasks.

    Parameters
    ----------
    address : a running cluster's address (None: start or reuse a local one)
    num_cpus : CPUs reserved per task
    threads : torch threads inside each task (default: ``num_cpus``, the CPUs the task was given;
        see the module docstring for what makes results bit-identical across executors)
    num_gpus : GPUs per task (None: 1 when the cluster has GPUs, else 0)
    max_retries : Ray's automatic retries of a task whose worker died
    init_kwargs : passed to ``ray.init`` (e.g. ``num_cpus=2`` for a local cluster)
    runtime_env : Ray runtime environment for the tasks (env vars, working dir, ...)
    before : called with each job's label in its worker, before the job (module docstring)
    """

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        num_cpus: float = 1,
        num_gpus: float | None = None,
        max_retries: int = 3,
        init_kwargs: dict | None = None,
        runtime_env: dict | None = None,
        threads: int | None = None,
        progress: bool | None = None,
        before: Callable[[str], None] | None = None,
    ):
        self.before = before
        self.address, self.num_cpus, self.num_gpus = address, num_cpus, num_gpus
        self.threads = threads
        self.max_retries, self.init_kwargs, self.runtime_env = max_retries, dict(init_kwargs or {}), runtime_env
        self.progress = progress

    def _ray(self):
        try:
            import ray
        except ImportError as err:
            raise ImportError('the Ray executor needs ray: pip install -e ".[ray]" (or pip install ray)') from err
        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": False, **self.init_kwargs}
            ray.init(address=self.address, **kwargs)
        return ray

    def map(self, fn, items, on_result=None, labels=None, desc="jobs"):
        ray = self._ray()
        labels = list(labels or map(str, range(len(items))))
        gpus = self.num_gpus
        if gpus is None:
            gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        options = {"num_cpus": self.num_cpus, "num_gpus": gpus, "max_retries": self.max_retries}
        if self.runtime_env:
            options["runtime_env"] = self.runtime_env
        task = ray.remote(_call_with_threads).options(**options)
        threads = self.threads or max(1, int(self.num_cpus))
        refs = {task.remote(fn, item, threads, self.before, labels[i]): i for i, item in enumerate(items)}
        bar = progress_bar(total=len(items), desc=f"{desc} (ray)", unit="jobs", progress=self.progress)

        def finished():
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                yield from ((refs[ref], ref) for ref in done)

        return _gather(finished(), len(items), ray.get, on_result, labels, bar)


def _call_with_threads(fn, item, threads: int | None, before=None, label: str = ""):
    """``fn(item)`` with ``threads`` torch threads (None: as they are), restored afterwards, after
    ``before(label)``."""
    if before is not None:
        before(label)
    was = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return fn(item)
    finally:
        torch.set_num_threads(was)


class ProcessExecutor(Executor):
    """Run jobs in ``workers`` local processes (``spawn``: a fresh interpreter each, nothing
    inherited), ``threads`` torch threads each (default 1: small models are bound by per-operation
    overhead, which threads do not share out). Jobs and their function must be picklable.

    A worker process that dies (killed, out of memory, a crash in native code) breaks the pool it
    belongs to, and every job still in that pool with it (queued ones too). Those jobs are run
    again in a fresh pool (a one-off death costs one restart); if that pool breaks as well, each
    job left is run in a process of its own (``workers`` at a time), so that the job that kills
    its process fails alone (reported with the others) and the rest finish."""

    name = "process"

    def __init__(
        self,
        workers: int = 2,
        threads: int | None = 1,
        progress: bool | None = None,
        before: Callable[[str], None] | None = None,
    ):
        self.workers, self.threads, self.progress, self.before = workers, threads, progress, before

    def map(self, fn, items, on_result=None, labels=None, desc="jobs"):
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        labels = list(labels or map(str, range(len(items))))
        bar = progress_bar(total=len(items), desc=f"{desc} (processes)", unit="jobs", progress=self.progress)
        broken: list[int] = []

        def shared(todo: list[int]):
            with self._pool(self.workers) as pool:
                futures = {self._submit(pool, fn, items[i], labels[i]): i for i in todo}
                for f in as_completed(futures):
                    if isinstance(f.exception(), BrokenProcessPool):
                        broken.append(futures[f])  # an innocent bystander, or the job that died
                    else:
                        yield futures[f], f

        def finished():
            yield from shared(list(range(len(items))))
            if broken:  # once more in a fresh pool
                again = sorted(broken)
                broken.clear()
                yield from shared(again)
            for start in range(0, len(broken), self.workers):  # still dying: each in a process of its own
                pools = {i: self._pool(1) for i in broken[start : start + self.workers]}
                futures = {self._submit(pool, fn, items[i], labels[i]): i for i, pool in pools.items()}
                for f in as_completed(futures):
                    yield futures[f], f
                for pool in pools.values():
                    pool.shutdown()

        return _gather(finished(), len(items), _future_result, on_result, labels, bar)

    @staticmethod
    def _pool(workers: int):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))

    def _submit(self, pool, fn, item, label):
        return pool.submit(_call_with_threads, fn, item, self.threads, self.before, label)


def _future_result(future):
    return future.result()


def _gather(finished, n: int, get, on_result, labels, bar) -> list:
    """The results of ``n`` jobs from ``finished`` (``(index, handle)`` in the order they finish),
    ``get(handle)`` each; a failed job (or a worker that died past its retries) is collected and
    all failures are raised together after every other job has finished."""
    results, failures = [None] * n, {}
    for i, handle in finished:
        try:
            results[i] = get(handle)
        except Exception as err:
            failures[i] = err
        else:
            if on_result:
                on_result(i, results[i])
        bar.update(1)
    bar.close()
    if failures:
        raise JobsFailedError(failures, labels)
    return results


class GroupedExecutor(Executor):
    """Jobs in groups of up to ``size`` (module docstring); ``inner``: where each group runs
    (an executor or its name). Its own :meth:`map` runs items one by one on ``inner``: grouping is
    done by the stage runner (:meth:`lab.stages.Runner.map`), which knows the stage's group
    function."""

    name = "grouped"

    def __init__(self, size: int = 16, inner: Executor | str | None = None):
        if size < 1:
            raise ValueError(f"a group holds at least one job; got size={size}")
        self.size = size
        self.inner = executor_for(inner)
        self.threads, self.before = self.inner.threads, self.inner.before

    @property
    def progress(self):
        return getattr(self.inner, "progress", None)

    @progress.setter
    def progress(self, value):
        if hasattr(self.inner, "progress"):
            self.inner.progress = value

    def map(self, fn, items, on_result=None, labels=None, desc="jobs"):
        return self.inner.map(fn, items, on_result, labels, desc)

    def chunks(self, n: int) -> list[range]:
        """``n`` jobs cut into groups of at most :attr:`size`, as equal as possible, and at least
        as many groups as the inner executor runs at once (``workers``), so that none of its
        workers idles while another trains every job."""
        if n < 1:
            return []
        k = max(-(-n // self.size), min(n, getattr(self.inner, "workers", 1)))
        bounds = [round(i * n / k) for i in range(k + 1)]
        return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def executor_for(spec) -> Executor:
    """An executor from ``None``/``"serial"``, ``"processes"`` (two local processes, one thread
    each), ``"grouped"`` (fine-tunes trained in groups, :class:`GroupedExecutor`), ``"ray"`` or an
    Executor."""
    if spec is None or spec == "serial":
        return SerialExecutor()
    if spec == "processes":
        return ProcessExecutor()
    if spec == "grouped":
        return GroupedExecutor()
    if spec == "ray":
        return RayExecutor()
    if isinstance(spec, Executor):
        return spec
    raise ValueError(f"unknown executor {spec!r}; use 'serial', 'processes', 'grouped', 'ray' or an Executor instance")
