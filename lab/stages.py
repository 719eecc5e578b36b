"""Stages: one way to run a step, save its result and resume.

A **stage** is a pure function from typed inputs (a frozen dataclass) to a result, saved as one
file. A :class:`Runner` owns an output folder and is the only place in :mod:`lab` that decides
whether a step is done:

- a result on disk is **reloaded** instead of recomputed (so an interrupted run resumes, and
  deleting one job's file redoes only that job);
- every result is keyed by a **digest of its inputs** (:func:`digest`), kept beside it under
  ``.stages/``; a result made from other inputs is refused with what differs, not silently
  reused;
- results are **written atomically** (:mod:`interp.results`), after their key (written before
  the step runs): a run killed mid-write leaves no half file, and a result on disk always has
  the key it was made with (a key without its result is overwritten when the step reruns). A
  result with no key was not written by a runner (an older version's folder): it is adopted
  only in a folder the experiment has claimed, whose record says it holds this experiment, and
  refused elsewhere;
- :meth:`Runner.map` runs many tasks of a stage on an executor (:mod:`lab.executors`): serially
  in this process or as Ray tasks, through the same code path (the task, its inputs and the stage
  function are what a worker receives; a model handle travels by reference,
  :meth:`interp.models.Model.__reduce__`);
- :meth:`Runner.claim` refuses a folder that holds another experiment (compared by content).

What a digest covers: every field of the inputs, except those declared with
``field(metadata=DERIVED)``: values computed from the other fields (a study's probe read-out is a
function of the model, the relation and the configuration, all keyed), which may differ in the
last float digit between a fresh and a resumed run without the step's inputs having changed.
A field declared with ``field(metadata=ADDED)`` (added after results were keyed) enters only
when it differs from its default, so results saved before it existed keep their keys.
Objects digest by content: a model by its weights' fingerprint, a relation by its name,
subjects, answers, prompts and properties, dataclasses field by field, tables by their values;
a whole-valued float digests as the integer it equals (``lr=1`` and ``lr=1.0`` are one input).

>>> runner = Runner("results/x")
>>> result = runner.run(Task(FINETUNE, inputs, "runs/a.json"))     # computed, or reloaded
>>> results = runner.map([Task(FINETUNE, i, f"runs/{i.id}.json") for i in jobs], executor="ray")
"""

from __future__ import annotations

import hashlib
import json
import pickle
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import pandas as pd

from interp.results import atomic_path, write_json, write_table

from .executors import Executor, GroupedExecutor, SerialExecutor, executor_for

I = TypeVar("I")  # noqa: E741
R = TypeVar("R")

#: ``field(metadata=DERIVED)``: an input computed from the other inputs, left out of the digest
DERIVED = {"digest": False}
#: ``field(metadata=WHERE)``: where or how a step runs or writes (a folder, a thread count), not
#: what it computes
WHERE = {"digest": False}
#: ``field(metadata=ADDED)``: a field added after results were keyed without it; keyed only when it
#: differs from its default, so the keys of results made before it existed (at its default) hold
ADDED = {"digest": "unless default"}


REFUSAL = (
    "{folder} holds a different {what} ({differences}); use a new output folder (or delete this one) to start over"
)


class StageInputsChanged(ValueError):
    """A saved result was made from other inputs than the ones given now."""


# codecs ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Codec:
    """How a result is written (atomically) and read back. (Not ``save``/``load``: nnsight adds
    a ``save`` method to every object, which a dataclass would take for the field's default.)"""

    write: Callable[[Any, Path], None]
    read: Callable[[Path], Any]


def _read_json(path: Path):
    return json.loads(path.read_text())


JSON = Codec(write_json, _read_json)


def table_codec(**read_csv) -> Codec:
    """A DataFrame saved as CSV and read back with ``pd.read_csv(**read_csv)``."""
    return Codec(write_table, partial(_read_csv, **read_csv))


def parquet_codec() -> Codec:
    """A DataFrame saved as parquet (list-valued columns stay lists, floats exact)."""
    return Codec(_save_parquet, _load_parquet)


# codecs travel to workers with their stage: module-level functions, so that pickle finds them
def _read_csv(path: Path, **read_csv) -> pd.DataFrame:
    return pd.read_csv(path, **read_csv)


def _save_parquet(df: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)


def _load_parquet(path: Path) -> pd.DataFrame:
    df = pd.read_parquet(path)
    for c in df.columns:  # parquet reads lists back as numpy arrays
        if df[c].dtype == object and any(isinstance(v, np.ndarray) for v in df[c]):
            df[c] = df[c].map(_as_list)
    return df


def _as_list(v):
    return v.tolist() if isinstance(v, np.ndarray) else v


# stages and tasks -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Stage(Generic[I, R]):
    """A named step: ``fn(inputs) -> result``, saved with ``codec``. ``fn`` must be a module-level
    function (a worker imports it) that depends on nothing but its inputs. ``group`` (optional,
    module-level too): ``group([inputs, ...]) -> [result, ...]``, the same results for many inputs
    computed together (the :class:`~lab.executors.GroupedExecutor` uses it)."""

    name: str
    fn: Callable[[I], R]
    codec: Codec = JSON
    group: Callable[[list[I]], list[R]] | None = None


@dataclass(frozen=True)
class Task(Generic[I, R]):
    """One application of a stage to inputs, saved at ``path`` (relative to the runner's folder)."""

    stage: Stage[I, R]
    inputs: I
    path: str

    @property
    def key(self) -> str:
        return digest(self.inputs)


def content(value) -> Any:
    """A JSON-able stand-in for ``value``'s content (see the module docstring)."""
    if hasattr(value, "content_digest"):
        return {"digest": value.content_digest()}
    if is_dataclass(value) and not isinstance(value, type):
        return {
            "type": type(value).__name__,
            **{
                f.name: content(getattr(value, f.name))
                for f in fields(value)
                if f.metadata.get("digest", True) is True
                or (f.metadata.get("digest") == ADDED["digest"] and getattr(value, f.name) != f.default)
            },
        }
    if isinstance(value, pd.DataFrame):
        return {"table": hashlib.sha256(pd.util.hash_pandas_object(value, index=True).values.tobytes()).hexdigest()}
    if isinstance(value, dict):
        return {str(k): content(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [content(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, np.generic):
        return content(value.item())
    raise TypeError(f"cannot digest a {type(value).__name__}: give it a content_digest() method or mark it DERIVED")


def digest(value) -> str:
    """A short SHA-256 of ``value``'s content."""
    return hashlib.sha256(json.dumps(content(value), sort_keys=True, default=str).encode()).hexdigest()[:16]


# the runner -----------------------------------------------------------------------------------
class Runner:
    """Runs stages into ``folder``: reloads what is saved, computes what is missing, refuses what
    was made from other inputs (see the module docstring). ``progress``: the serial executor's
    progress bars."""

    def __init__(self, folder: str | Path, progress: bool | None = None):
        self.folder = Path(folder)
        self.progress = progress
        #: whether :meth:`claim` found (or wrote) this experiment's record in the folder
        self.claimed = False

    # one folder, one experiment -----------------------------------------------------------------
    def claim(
        self,
        name: str,
        meta: dict,
        differences: Callable[[dict, dict], list[str]],
        what: str,
        refusal: str = REFUSAL,
    ) -> None:
        """Record ``meta`` (what the folder holds) as ``name``, or refuse a folder whose record
        differs: ``differences(old, new)`` says how, ``what`` names the experiment; ``refusal``
        is the error's text (``{folder}``, ``{what}``, ``{differences}``)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / name
        if path.exists():
            diffs = differences(json.loads(path.read_text()), meta)
            if diffs:
                raise ValueError(refusal.format(folder=self.folder, what=what, differences="; ".join(diffs)))
        else:
            write_json(meta, path)
        self.claimed = True

    # tasks ---------------------------------------------------------------------------------------
    def done(self, task: Task) -> bool:
        """Whether ``task``'s result is saved (from these inputs: another key is refused)."""
        path = self.folder / task.path
        if not path.exists():
            return False
        key_path = self._key_path(task)
        if key_path.exists():
            saved = json.loads(key_path.read_text())
            if saved["digest"] != task.key:
                raise StageInputsChanged(
                    f"{path} was made by stage {saved['stage']!r} from other inputs "
                    f"({_changed(saved.get('inputs'), content(task.inputs))}); use a new output folder, "
                    "or delete the file to recompute it"
                )
        elif self.claimed:  # an older version's result, in a folder that holds this experiment: adopt it
            key_path.parent.mkdir(parents=True, exist_ok=True)
            write_json(_key(task), key_path)
        else:
            raise StageInputsChanged(
                f"{path} has no key ({key_path}), so nothing says which inputs made it (it was not written by "
                "this runner); delete it to recompute it, or use a new output folder"
            )
        return True

    def load(self, task: Task[Any, R]) -> R:
        return task.stage.codec.read(self.folder / task.path)

    def run(self, task: Task[Any, R]) -> R:
        """``task``'s result: reloaded when saved, else computed, saved and returned as computed
        (a codec may save less than the result holds: a fine-tuned model beside its record)."""
        if not self.done(task):
            return compute(task, self.folder)
        return self.load(task)

    def map(
        self,
        tasks: Sequence[Task],
        executor: Executor | str | None = None,
        desc: str = "jobs",
        labels: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list:
        """Compute every missing task on ``executor`` (at most ``limit`` new ones), then return
        every task's result in order (None for one not computed because of ``limit``). Failed
        tasks are reported together after the others finish (:class:`~lab.executors.JobsFailedError`)."""
        labels = list(labels or [t.path for t in tasks])
        todo = [i for i, t in enumerate(tasks) if not self.done(t)]
        if limit is not None:
            todo = todo[:limit]
        if todo:
            ex = executor_for(executor)
            grouped = isinstance(ex, GroupedExecutor) and tasks[todo[0]].stage.group is not None
            if isinstance(ex, GroupedExecutor):
                ex = ex if grouped else ex.inner
            if isinstance(ex, SerialExecutor) or (grouped and isinstance(ex.inner, SerialExecutor)):
                if ex.progress is None:
                    ex.progress = self.progress
            else:  # a worker receives the task: say now, not from inside the executor, if it cannot travel
                try:
                    pickle.dumps(tasks[todo[0]])
                except (TypeError, AttributeError, pickle.PicklingError) as err:
                    raise ValueError(f"{labels[todo[0]]} cannot run on the {ex.name} executor: {err}") from err
            if grouped:  # each group one job of the inner executor
                # groups cut from the whole task list, not from what is left to do, so that a
                # resumed run trains the missing jobs in the groups a fresh run gives them
                wanted = set(todo)
                parts = [[i for i in c if i in wanted] for c in ex.chunks(len(tasks))]
                parts = [part for part in parts if part]
                ex.inner.map(
                    _compute_group,
                    [([tasks[i] for i in part], self.folder) for part in parts],
                    labels=[f"{labels[part[0]]} .. ({len(part)} jobs)" for part in parts],
                    desc=f"{desc} (groups)",
                )
            else:
                ex.map(
                    _compute_item,
                    [(tasks[i], self.folder) for i in todo],
                    labels=[labels[i] for i in todo],
                    desc=desc,
                )
        return [self.load(t) if (self.folder / t.path).exists() else None for t in tasks]

    def _key_path(self, task: Task) -> Path:
        return self.folder / ".stages" / f"{task.path}.key.json"


def compute(task: Task[Any, R], folder: Path) -> R:
    """Save ``task``'s key, then run it and save its result (in a worker or in this process). The
    key comes first because some stages write their result themselves (a checkpoint folder); a
    failed step or write removes the key again."""
    path = Path(folder) / task.path
    key_path = _write_key(task, folder)
    try:
        result = task.stage.fn(task.inputs)
        task.stage.codec.write(result, path)
    except BaseException:
        key_path.unlink(missing_ok=True)
        raise
    return result


def _write_key(task: Task, folder: Path) -> Path:
    """Save ``task``'s key (and make its result's folder); the key's path."""
    (Path(folder) / task.path).parent.mkdir(parents=True, exist_ok=True)
    key_path = Path(folder) / ".stages" / f"{task.path}.key.json"
    key_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(_key(task), key_path)
    return key_path


def compute_group(tasks: Sequence[Task], folder: Path) -> list:
    """:func:`compute` of tasks of one stage at once, through the stage's group function: every
    key saved first, then every result (a failure removes the keys of the results not saved). A
    group that fails is not a failure of each of its jobs: its unsaved jobs are computed one at a
    time (with a warning), and only those that fail alone too are reported
    (:class:`GroupFailedError`), after the others are saved."""
    stage = tasks[0].stage
    if any(t.stage is not stage for t in tasks):
        raise ValueError("a group's tasks must all be of one stage")
    keys = [_write_key(t, folder) for t in tasks]
    saved, results = 0, []
    try:
        results = stage.group([t.inputs for t in tasks])
        for t, result in zip(tasks, results, strict=True):
            stage.codec.write(result, Path(folder) / t.path)
            saved += 1
    except BaseException as err:
        for key_path in keys[saved:]:
            key_path.unlink(missing_ok=True)
        if len(tasks) == 1 or not isinstance(err, Exception):  # an interrupt stops, a lone job fails
            raise
        warnings.warn(
            f"a group of {len(tasks)} {stage.name} jobs failed ({type(err).__name__}: {err}); "
            f"computing its {len(tasks) - saved} unsaved jobs one at a time",
            RuntimeWarning,
            stacklevel=2,
        )
        return _one_at_a_time(tasks[saved:], folder, list(results[:saved]))
    return results


def _one_at_a_time(tasks: Sequence[Task], folder: Path, results_before: list) -> list:
    """:func:`compute` of each task alone, after its group failed; raises
    :class:`GroupFailedError` naming the tasks that fail alone too, once the others are saved."""
    results, failed = list(results_before), {}
    for t in tasks:
        try:
            results.append(compute(t, folder))
        except Exception as err:
            failed[t.path] = f"{type(err).__name__}: {err}"
            results.append(None)
    if failed:
        raise GroupFailedError(failed)
    return results


class GroupFailedError(RuntimeError):
    """Jobs of a group that failed alone too (the group's other jobs were saved); ``failures``
    maps each one's result path to its error (as text, so that the error travels back from a
    worker process)."""

    def __init__(self, failures: dict[str, str]):
        self.failures = failures
        lines = "\n".join(f"  {p}: {e}" for p, e in failures.items())
        super().__init__(f"{len(failures)} job(s) of the group failed, each alone too (the others are saved):\n{lines}")

    def __reduce__(self):
        return type(self), (self.failures,)


def _compute_group(item: tuple[Sequence[Task], Path]) -> None:
    compute_group(*item)


def _compute_item(item: tuple[Task, Path]) -> None:
    compute(*item)  # the result stays in the worker: the runner reads it back from the folder


def _key(task: Task) -> dict:
    return {"stage": task.stage.name, "digest": task.key, "inputs": content(task.inputs)}


def _changed(old, new, prefix: str = "") -> str:
    """Where two input contents differ (first few paths)."""
    out: list[str] = []

    def walk(a, b, at):
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b)):
                walk(a.get(k), b.get(k), f"{at}.{k}" if at else k)
        elif a != b:
            out.append(f"{at or 'inputs'}: {_short(a)} -> {_short(b)}")

    walk(old, new, prefix)
    return "; ".join(out[:5]) + (f"; and {len(out) - 5} more" if len(out) > 5 else "") if out else "unrecorded"


def _short(v) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= 60 else s[:57] + "..."
