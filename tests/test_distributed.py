"""Scale-out: the Ray executor, crash recovery, out-of-core probe sweeps, the remote code path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from interp.store import synthetic_store
from lab.executors import JobsFailedError, RayExecutor, SerialExecutor

RELATIONS = ["continent", "hand", "season", "diet"]


def _config():
    from lab.study import FinetuneConfig, StudyConfig

    return StudyConfig(
        n_finetune=3,
        methods=("full",),
        label_seeds=(0,),
        finetune_seeds=(0,),
        other_categories=(),
        n_null=200,
        folds=3,
        n_boot=100,
        n_perm=100,
        finetune=FinetuneConfig(max_steps=30, check_every=10),
        nonlinear_probes=(),
    )


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    return {name: pd.read_csv(out / f"{name}.csv") for name in ("relations", "stats", "predictions", "finetunes")}


def _assert_same(a: dict, b: dict):
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name], check_exact=False, rtol=1e-6, obj=name)


@pytest.fixture(scope="module")
def ray_cluster():
    import ray  # a dev dependency: a missing ray fails here rather than skipping the tests

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def serial_study(tmp_path_factory):
    from lab.study import run_study

    out = tmp_path_factory.mktemp("serial")
    run_study("world", RELATIONS, out=out, config=_config(), progress=False, executor=SerialExecutor(threads=1))
    return out


@pytest.mark.slow
def test_ray_study_equals_serial(ray_cluster, serial_study, tmp_path):
    from lab.study import run_study

    result = run_study(
        "world", RELATIONS, out=tmp_path, config=_config(), progress=False, executor=RayExecutor(num_cpus=1)
    )
    assert result.complete
    _assert_same(_tables(serial_study), _tables(tmp_path))


def test_a_study_in_local_processes_equals_serial(serial_study, tmp_path):
    """``executor="processes"``: two spawned processes, one thread each (the serial study's
    thread count), each loading the model again by reference; the same tables."""
    from lab.study import run_study

    result = run_study("world", RELATIONS, out=tmp_path, config=_config(), progress=False, executor="processes")
    assert result.complete
    _assert_same(_tables(serial_study), _tables(tmp_path))


@pytest.mark.slow
def test_the_thread_count_changes_only_the_last_digits_of_losses(serial_study, tmp_path):
    """Same commit, same machine, another thread count: float reductions change order, so the
    fine-tunes' losses may differ in the last digits (measured: 6e-7); every prediction, label and
    statistic is unchanged. The stated tolerance: losses within 1e-5, all else equal to 1e-6."""
    from lab.study import run_study

    run_study("world", RELATIONS, out=tmp_path, config=_config(), progress=False, executor=SerialExecutor(threads=2))
    a, b = _tables(serial_study), _tables(tmp_path)
    assert (a["predictions"].predicted_label == b["predictions"].predicted_label).all()
    assert (a["finetunes"].final_loss - b["finetunes"].final_loss).abs().max() < 1e-5
    _assert_same(
        {k: v.drop(columns=["final_loss"], errors="ignore") for k, v in a.items()},
        {k: v.drop(columns=["final_loss"], errors="ignore") for k, v in b.items()},
    )


@pytest.mark.slow
def test_killed_worker_loses_nothing_and_restart_recomputes_nothing(ray_cluster, serial_study, tmp_path):
    from lab.study import Study, run_study

    jobs = [j.id for j in Study.jobs(_FakeStudy())]
    victim = jobs[1]
    crash = RayExecutor(num_cpus=1, max_retries=0, before=_killer(victim))  # the executor's documented hook
    with pytest.raises(JobsFailedError, match=victim):
        run_study("world", RELATIONS, out=tmp_path, config=_config(), progress=False, executor=crash)
    runs = tmp_path / "runs"
    finished = {p.stem: p.stat().st_mtime_ns for p in runs.glob("*.json")}
    assert victim not in finished and len(finished) == len(jobs) - 1  # every other job finished and was saved
    result = run_study(
        "world", RELATIONS, out=tmp_path, config=_config(), progress=False, executor=RayExecutor(num_cpus=1)
    )
    assert result.complete
    for stem, mtime in finished.items():  # finished jobs were not recomputed
        assert (runs / f"{stem}.json").stat().st_mtime_ns == mtime
    assert (runs / f"{victim}.json").exists()
    # The recomputed job ran alone in a fresh worker process. Measured here (world v3): one held-out
    # prediction in ~1,000 of a 2-answer relation can flip on a near-tie, from last-digit float
    # differences between a fresh and a warm process (issue 20 is about making this exact). Stated
    # tolerance: every table equal except held-out predictions, which agree on >= 99.5% of subjects.
    a, b = _tables(serial_study), _tables(tmp_path)
    _assert_same({"finetunes": a["finetunes"]}, {"finetunes": b["finetunes"]})
    pa, pb = a["predictions"], b["predictions"]
    assert len(pa) == len(pb) and (pa.predicted_label == pb.predicted_label).mean() >= 0.995
    ra, rb = a["relations"], b["relations"]
    assert (ra.relation == rb.relation).all() and (
        (ra.generalization_full - rb.generalization_full).abs() <= 0.005
    ).all()
    assert ra.drop(columns=[c for c in ra if c.startswith("generalization")]).equals(
        rb.drop(columns=[c for c in rb if c.startswith("generalization")])
    )


def _killer(victim: str):
    """A ``before`` hook (:mod:`lab.executors`) that kills its worker process on one job: fault
    injection. A local function, so that Ray's cloudpickle sends it by value to the worker."""

    def kill(label: str) -> None:
        if label == victim:
            import os

            os._exit(1)

    return kill


class _FakeStudy:
    """The job list of the study above, without loading a model."""

    def __init__(self):
        self.config = _config()
        self.relations = {r: None for r in RELATIONS}


def test_serial_executor_collects_failures():
    def fn(x):
        if x == 2:
            raise RuntimeError("boom")
        return x * 10

    seen = []
    with pytest.raises(JobsFailedError, match="job-2: RuntimeError: boom"):
        SerialExecutor(progress=False).map(
            fn, [1, 2, 3], on_result=lambda i, r: seen.append(r), labels=["job-1", "job-2", "job-3"]
        )
    assert seen == [10, 30]  # the other jobs still ran


@pytest.mark.slow
def test_a_dead_worker_process_fails_its_job_alone():
    """A process that dies breaks its pool and every job in it; the others are run again, each in
    a process of its own, so that only the job that kills its process fails."""
    from faults import KillOn, times_ten

    from lab.executors import ProcessExecutor

    executor = ProcessExecutor(workers=2, progress=False, before=KillOn("job-2"))
    seen = {}
    with pytest.raises(JobsFailedError, match=r"1 job\(s\) failed.*\n  job-2: BrokenProcessPool") as err:
        executor.map(times_ten, [1, 2, 3, 4], on_result=seen.__setitem__, labels=[f"job-{i}" for i in (1, 2, 3, 4)])
    assert list(err.value.failures) == [1] and seen == {0: 10, 2: 30, 3: 40}


def test_jobs_run_with_the_threads_their_executor_gives_them(ray_cluster):
    """A Ray task gets as many torch threads as CPUs it was given (not the driver's count, which
    oversubscribed small machines); the serial executor applies ``threads=`` per job and restores
    the caller's setting."""
    before = torch.get_num_threads()
    _threads = lambda _: torch.get_num_threads()  # noqa: E731 (a lambda: Ray pickles it by value)
    assert RayExecutor(num_cpus=1, progress=False).map(_threads, [0, 1]) == [1, 1]
    assert RayExecutor(num_cpus=1, threads=2, progress=False).map(_threads, [0]) == [2]
    assert SerialExecutor(progress=False, threads=1).map(_threads, [0, 1]) == [1, 1]
    assert SerialExecutor(progress=False).map(_threads, [0]) == [before]
    assert torch.get_num_threads() == before


def test_models_loaded_from_disk_record_their_source(model_dirs):  # what Ray workers reload
    import interp

    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    assert model.source == str(model_dirs["gpt2"])
    in_memory = interp.load_model(model.hf_model, backend="nnsight", tokenizer=model.tokenizer)
    assert in_memory.source is None


# --- out-of-core probe sweeps ------------------------------------------------------------------------------
def _sweep(store: Path, mode: str, tmp_path: Path) -> tuple[dict, pd.DataFrame]:
    script = Path(__file__).parent / "out_of_core_sweep.py"
    csv = tmp_path / f"{mode}.csv"
    out = subprocess.run(
        [sys.executable, str(script), str(store), mode, str(csv)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1]), pd.read_csv(csv)


@pytest.mark.slow
def test_out_of_core_sweep_stays_under_a_memory_cap(tmp_path):
    store = synthetic_store(tmp_path / "store")  # 24 sites x 12,000 x 256 float32: 281 MB
    cap_mb = 240.0  # one site's features plus the probe fit's working memory fit; the store does not
    ooc, ooc_table = _sweep(store, "out_of_core", tmp_path)
    mem, mem_table = _sweep(store, "in_memory", tmp_path)
    assert ooc["store_mb"] > cap_mb  # the store is larger than the cap
    assert ooc["peak_growth_mb"] < cap_mb, ooc
    assert mem["peak_growth_mb"] > cap_mb, mem  # holding it all would not fit
    key = ["relation", "site", "seed", "fold"]
    a = ooc_table.sort_values(key).reset_index(drop=True)
    b = mem_table.sort_values(key).reset_index(drop=True)
    pd.testing.assert_series_equal(a.accuracy, b.accuracy)


# --- remote models ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_remote_capture_reaches_the_ndif_request(tmp_path):
    import os
    import shutil

    snapshot = tmp_path / "hf" / "hub" / "models--interp-test--tiny" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for f in (Path(__file__).resolve().parent.parent / "lab" / "checkpoints" / "induction").iterdir():
        shutil.copy(f, snapshot / f.name)
    refs = snapshot.parent.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text("0" * 40)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "remote_request.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["reached"] and '"repo_id": "interp-test/tiny"' in result["model_key"]
    assert result["device"] == "cpu" and result["bytes"] > 0  # inputs stay local; the intervention was serialized


def test_remote_needs_nnsight_and_a_hub_name(model_dirs):
    import interp

    with pytest.raises(ValueError, match="backend='nnsight'"):
        interp.load_model("gpt2", backend="transformer_lens", remote=True)
    with pytest.raises(ValueError, match="hub name"):
        interp.load_model(str(model_dirs["gpt2"]), backend="nnsight", remote=True)
