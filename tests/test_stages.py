"""The stage runner (lab.stages): results keyed by their inputs' content, reloaded instead of
recomputed, refused when made from other inputs, written atomically, run serially or on an
executor through one code path."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest

from lab.executors import Executor, GroupedExecutor, JobsFailedError, SerialExecutor
from lab.stages import DERIVED, JSON, Codec, Runner, Stage, StageInputsChanged, Task, digest, parquet_codec

CALLS: list[int] = []


@dataclass(frozen=True)
class Square:
    x: int
    scale: float = 1.0
    note: str = field(default="", metadata=DERIVED)


def square(inputs: Square) -> dict:
    CALLS.append(inputs.x)
    return {"x": inputs.x, "y": inputs.x**2 * inputs.scale}


SQUARE = Stage("square", square)


def _tasks(xs, scale=1.0):
    return [Task(SQUARE, Square(x, scale), f"runs/{x}.json") for x in xs]


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()


def test_the_digest_covers_the_inputs_content_but_not_derived_fields():
    assert digest(Square(2)) == digest(Square(2, note="anything"))
    assert digest(Square(2)) != digest(Square(3)) != digest(Square(2, 2.0))
    df = pd.DataFrame({"a": [1, 2]})
    assert digest({"t": df}) == digest({"t": df.copy()}) != digest({"t": df.assign(a=[1, 3])})
    with pytest.raises(TypeError, match="content_digest"):
        digest(object())


def test_a_result_is_computed_once_then_reloaded(tmp_path):
    runner = Runner(tmp_path)
    task = Task(SQUARE, Square(3), "runs/3.json")
    assert runner.run(task) == {"x": 3, "y": 9.0}
    assert runner.run(task) == {"x": 3, "y": 9.0} and CALLS == [3]
    key = json.loads((tmp_path / ".stages" / "runs" / "3.json.key.json").read_text())
    assert key["stage"] == "square" and key["digest"] == task.key and key["inputs"]["x"] == 3


def test_a_result_made_from_other_inputs_is_refused_with_what_changed(tmp_path):
    runner = Runner(tmp_path)
    runner.run(Task(SQUARE, Square(3), "runs/3.json"))
    with pytest.raises(StageInputsChanged, match=r"scale: 1 -> 2.*new output folder"):
        runner.run(Task(SQUARE, Square(3, 2.0), "runs/3.json"))
    assert CALLS == [3]


def test_resume_computes_only_what_is_missing(tmp_path):
    runner = Runner(tmp_path)
    assert runner.map(_tasks(range(5)), limit=2) == [{"x": 0, "y": 0.0}, {"x": 1, "y": 1.0}, None, None, None]
    assert CALLS == [0, 1]
    first = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "runs").iterdir()}
    results = runner.map(_tasks(range(5)))
    assert [r["y"] for r in results] == [0, 1, 4, 9, 16] and CALLS == [0, 1, 2, 3, 4]
    assert all((tmp_path / "runs" / n).stat().st_mtime_ns == t for n, t in first.items())  # not rewritten
    # one job deleted: only it is redone
    (tmp_path / "runs" / "3.json").unlink()
    CALLS.clear()
    assert runner.map(_tasks(range(5))) == results and CALLS == [3]


def test_a_failed_write_leaves_neither_result_nor_key(tmp_path):
    def save(result, path):
        raise OSError("disk full")

    broken = Stage("square", square, Codec(save, JSON.read))
    runner = Runner(tmp_path)
    with pytest.raises(OSError, match="disk full"):
        runner.run(Task(broken, Square(2), "runs/2.json"))
    assert not (tmp_path / "runs" / "2.json").exists() and not list(tmp_path.rglob("*.key.json"))
    assert runner.run(Task(SQUARE, Square(2), "runs/2.json"))["y"] == 4.0  # recomputed, then saved


def test_a_result_without_a_key_is_adopted_only_in_a_folder_claimed_by_the_experiment(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "4.json").write_text(json.dumps({"x": 4, "y": 16.0}))
    with pytest.raises(StageInputsChanged, match="has no key"):  # nothing says what made it
        Runner(tmp_path).run(Task(SQUARE, Square(4), "runs/4.json"))
    runner = Runner(tmp_path)
    runner.claim("experiment.json", {"lr": 1}, lambda old, new: [], "experiment")  # an older version's folder
    assert runner.run(Task(SQUARE, Square(4), "runs/4.json")) == {"x": 4, "y": 16.0} and CALLS == []
    assert (tmp_path / ".stages" / "runs" / "4.json.key.json").exists()


def test_the_key_is_written_before_the_step_runs_and_removed_if_it_fails(tmp_path):
    key = tmp_path / ".stages" / "runs" / "5.json.key.json"

    def looks(inputs: Square) -> dict:
        assert key.exists()  # a step that writes its own result (a checkpoint) is keyed before it writes
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        Runner(tmp_path).run(Task(Stage("square", looks), Square(5), "runs/5.json"))
    assert not key.exists()
    assert Runner(tmp_path).run(Task(SQUARE, Square(5), "runs/5.json"))["y"] == 25.0


def test_whole_floats_digest_as_integers():
    assert digest(Square(2, 1)) == digest(Square(2, 1.0)) == digest(Square(2, np.float64(1.0)))
    assert digest(Square(2, 1.5)) != digest(Square(2, 1))


def test_failures_are_collected_and_the_others_saved(tmp_path):
    def fails_on_two(inputs: Square) -> dict:
        if inputs.x == 2:
            raise RuntimeError("boom")
        return square(inputs)

    stage = Stage("square", fails_on_two)
    tasks = [Task(stage, Square(x), f"runs/{x}.json") for x in range(4)]
    with pytest.raises(JobsFailedError, match="runs/2.json"):
        Runner(tmp_path).map(tasks, executor=SerialExecutor())
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["0.json", "1.json", "3.json"]


class _Elsewhere(Executor):
    """An executor that runs its jobs in 'another process': it pickles every item first."""

    name = "elsewhere"

    def map(self, fn, items, on_result=None, labels=None, desc="jobs"):
        return [pickle.loads(pickle.dumps(fn))(pickle.loads(pickle.dumps(item))) for item in items]


def test_every_executor_runs_the_same_code_path(tmp_path):
    serial = Runner(tmp_path / "a").map(_tasks(range(3)), executor="serial")
    elsewhere = Runner(tmp_path / "b").map(_tasks(range(3)), executor=_Elsewhere())
    assert serial == elsewhere
    assert (tmp_path / "b" / ".stages" / "runs" / "2.json.key.json").exists()


def test_inputs_that_cannot_travel_are_refused_before_any_work(tmp_path):
    local = Stage("local", lambda inputs: {"x": inputs.x})  # a lambda: no worker can import it
    with pytest.raises(ValueError, match="cannot run on the elsewhere executor"):
        Runner(tmp_path).map([Task(local, Square(1), "runs/1.json")], executor=_Elsewhere())
    assert not (tmp_path / "runs").exists()


def test_a_folder_claimed_by_another_experiment_is_refused(tmp_path):
    def differences(old, new):
        return [f"{k} {old[k]} -> {new[k]}" for k in new if old.get(k) != new[k]]

    runner = Runner(tmp_path)
    runner.claim("experiment.json", {"lr": 1}, differences, "experiment")
    runner.claim("experiment.json", {"lr": 1}, differences, "experiment")  # the same one resumes
    with pytest.raises(ValueError, match=r"holds a different experiment \(lr 1 -> 2\); use a new output folder"):
        runner.claim("experiment.json", {"lr": 2}, differences, "experiment")


def test_parquet_keeps_lists_and_exact_floats(tmp_path):
    df = pd.DataFrame({"subject": ["a", "b", "c"], "top": [None, ["x", "y"], []], "v": [0.1 + 0.2, 1 / 3, 2.0]})
    codec = parquet_codec()
    codec.write(df, tmp_path / "t.parquet")
    back = codec.read(tmp_path / "t.parquet")
    assert back.top.tolist() == [None, ["x", "y"], []] and back.v.tolist() == df.v.tolist()
    assert pickle.loads(pickle.dumps(codec)).read(tmp_path / "t.parquet").equals(back)  # travels to workers


def test_a_model_travels_by_reference_and_an_in_memory_one_is_refused(model_dirs):
    from tiny_models import build

    import interp

    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    again = pickle.loads(pickle.dumps(model))
    assert again.fingerprint() == model.fingerprint() and again.source == model.source
    assert pickle.loads(pickle.dumps(model)) is again  # loaded once per process
    # loaded again as it was loaded: the same name, dtype and tokenizer
    import torch

    wide = interp.load_model(model_dirs["gpt2"], backend="nnsight", dtype=torch.float64, name="wide")
    back = pickle.loads(pickle.dumps(wide))
    assert back is not again and back.name == "wide" and back.fingerprint() == wide.fingerprint()
    assert next(back.hf_model.parameters()).dtype == torch.float64
    hf, tokenizer = build("gpt2")
    with pytest.raises(TypeError, match="cannot be sent to a worker process"):
        pickle.dumps(interp.load_model(hf, tokenizer=tokenizer))


GROUPS: list[list[int]] = []


def square_group(items: list[Square]) -> list[dict]:
    """The group function of a stage whose every group fails if it holds x = 13."""
    GROUPS.append([s.x for s in items])
    if any(s.x == 13 for s in items):
        raise RuntimeError("the group met 13")
    return [square(s) for s in items]


def square_or_fail(inputs: Square) -> dict:
    if inputs.x == 13 and inputs.scale == 1.0:
        raise ValueError("13 fails alone too")
    return square(inputs)


GROUPED_SQUARE = Stage("square", square_or_fail, group=square_group)


def test_a_failed_group_saves_its_other_jobs_one_at_a_time(tmp_path):
    """One job that fails takes no other job of its group with it: they are computed alone and
    saved, and only the failing one is reported (its key removed, so a rerun retries it alone)."""
    GROUPS.clear()
    tasks = [Task(GROUPED_SQUARE, Square(x), f"runs/{x}.json") for x in (11, 12, 13, 14)]
    with pytest.warns(RuntimeWarning, match="computing its 4 unsaved jobs one at a time"):
        with pytest.raises(JobsFailedError, match="13 fails alone too"):
            Runner(tmp_path).map(tasks, GroupedExecutor(size=4))
    assert GROUPS == [[11, 12, 13, 14]] and sorted(CALLS) == [11, 12, 14]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["11.json", "12.json", "14.json"]
    assert not (tmp_path / ".stages" / "runs" / "13.json.key.json").exists()


def test_groups_are_cut_from_the_whole_stage_so_a_resume_regroups_nothing(tmp_path):
    """The jobs a resumed run still has to do train in the groups a fresh run gave them, and the
    inner executor's workers each get a group."""
    GROUPS.clear()
    runner = Runner(tmp_path)
    tasks = [Task(GROUPED_SQUARE, Square(x, 2.0), f"runs/{x}.json") for x in range(7)]
    runner.map(tasks[2:3], GroupedExecutor(size=3))  # one job done before
    runner.map(tasks, GroupedExecutor(size=3))
    assert GROUPS == [[2], [0, 1], [3, 4], [5, 6]]  # a fresh run: [0, 1], [2, 3, 4], [5, 6]
    assert [r["y"] for r in runner.map(tasks, GroupedExecutor(size=3))] == [2.0 * x**2 for x in range(7)]

    class TwoWorkers(SerialExecutor):
        workers = 2

    assert [len(c) for c in GroupedExecutor(size=16, inner=TwoWorkers()).chunks(5)] == [2, 3]
    assert [len(c) for c in GroupedExecutor(size=16).chunks(5)] == [5]
    assert GroupedExecutor(size=2).chunks(0) == []
