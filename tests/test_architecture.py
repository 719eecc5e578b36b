"""The architecture's contract: layers with one direction of dependency (import-linter), no
hidden upward imports, the model handle as the only way to run a model (a study gives the same
tables on both backends), one results writer with normal file permissions, one site builder."""

import ast
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pandas as pd
import pytest
import torch

import interp
from interp.models import default_backend_for
from interp.results import save_table, write_json, write_table
from interp.sites import site_name
from interp.trainable import LoraSpec

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("interp", "probes", "circuits", "jacobians", "lab")


def _lint_imports(root: Path = ROOT) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    return subprocess.run([exe], cwd=root, capture_output=True, text=True, timeout=300)


def _copy_of_the_packages(dest: Path) -> Path:
    """The packages' Python files and pyproject.toml (the contracts), copied: tests never write into the tree."""

    def not_python(folder, names):
        return [n for n in names if n == "__pycache__" or not (n.endswith(".py") or (Path(folder) / n).is_dir())]

    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=not_python)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_import_contract_holds_and_fails_on_an_upward_import(tmp_path):
    ok = _lint_imports()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 broken" in ok.stdout
    copy = _copy_of_the_packages(tmp_path / "tree")
    (copy / "interp" / "_upward_import_probe.py").write_text(
        "import lab  # an upward import: the foundation must not know the application\n"
    )
    bad = _lint_imports(copy)  # lint-imports puts its working directory first on the path: the copy is analysed
    assert bad.returncode != 0 and "BROKEN" in bad.stdout
    assert "interp._upward_import_probe -> lab" in bad.stdout
    assert not (ROOT / "interp" / "_upward_import_probe.py").exists()


def _local_own_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (
                    node.level > 0 or (node.module or "").split(".")[0] in PACKAGES
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
                elif isinstance(node, ast.Import) and any(a.name.split(".")[0] in PACKAGES for a in node.names):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_function_local_imports_of_our_own_modules():
    """A function-local import of our own module is usually a hidden upward import."""
    found = [hit for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py")) for hit in _local_own_imports(path)]
    assert found == []


def test_one_default_backend_everywhere():
    assert interp.DEFAULT_BACKEND in interp.BACKENDS
    import inspect

    from lab.study import run_study

    # load_model's backend=None means "the object's own backend, else the default"
    assert inspect.signature(interp.load_model).parameters["backend"].default is None
    assert default_backend_for("world") == default_backend_for(torch.nn.Linear(1, 1)) == interp.DEFAULT_BACKEND
    assert inspect.signature(run_study).parameters["backend"].default == interp.DEFAULT_BACKEND


def test_results_are_written_atomically_with_normal_permissions(tmp_path):
    mask = os.umask(0o022)
    try:
        write_table(pd.DataFrame({"a": [1, 2]}), tmp_path / "t.csv")
        write_json({"x": 1}, tmp_path / "x.json")
        df = pd.DataFrame({"a": [1]})
        df.attrs["note"] = "hi"
        save_table(df, tmp_path, "s")
    finally:
        os.umask(mask)
    for name in ("t.csv", "x.json", "s.csv", "s.json"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o644, name
    assert json.loads((tmp_path / "s.json").read_text()) == {"note": "hi"}
    assert not list(tmp_path.glob(".*tmp"))


def test_one_site_builder():
    assert site_name("resid_post", 3) == "blocks.3.hook_resid_post"
    assert site_name("attn.hook_z", 0) == site_name("z", 0) == "blocks.0.attn.hook_z"
    assert site_name("embed") == "hook_embed" and site_name("ln_final.hook_normalized") == "ln_final.hook_normalized"
    with pytest.raises(ValueError, match="give its layer"):
        site_name("resid_pre")


def test_registered_names_come_from_the_application():
    assert {"world", "induction"} <= set(interp.registered_models())
    with pytest.raises(interp.ModelNotFoundError):
        interp.load_model("./no/such/model")


@pytest.mark.parametrize("lora", [None, LoraSpec(r=2, alpha=4)])
def test_trainable_copies_train_through_either_backend(model_dirs, backend, lora):
    """A trainable copy is a handle on the same backend; training it leaves the original alone;
    LoRA trains only its adapters, and they change the output."""
    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    before = [p.detach().clone() for p in model.module.parameters()]
    x = ["the city is", "a country is"]
    base = model.forward(x).detach()
    torch.manual_seed(0)
    copy = model.trainable_copy(lora=lora)
    assert copy.backend_name == backend and copy.module is not model.module
    params = copy.trainable_parameters()
    assert params and (lora is None) == (len(params) == len(list(copy.module.parameters())))
    opt = torch.optim.SGD(params, lr=0.5)
    copy.train()
    for _ in range(2):
        loss = copy.forward(x)[:, -1].logsumexp(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert not torch.allclose(copy.eval().forward(x), base)
    assert all(torch.equal(b, p) for b, p in zip(before, model.module.parameters()))
    assert torch.equal(model.forward(x), base)


def test_a_transformer_lens_native_model_fine_tunes(model_dirs):
    from tiny_models import word_tokenizer
    from transformer_lens.config import TransformerBridgeConfig

    from lab.study import FinetuneConfig, finetune

    tok = word_tokenizer()
    cfg = TransformerBridgeConfig(
        d_model=32, d_head=8, n_layers=2, n_ctx=32, n_heads=4, d_vocab=len(tok), d_mlp=64, act_fn="gelu", seed=0
    )
    model = interp.load_model(cfg, backend="transformer_lens", tokenizer=tok)
    tuned, info = finetune(
        model,
        ["the city is", "a country is"],
        ["Paris", "Rome"],
        ["Paris", "Rome"],
        "full",
        FinetuneConfig(max_steps=30, check_every=5, lr=3e-3),
        seed=0,
    )
    assert tuned.backend_name == "transformer_lens" and info["steps"] <= 30
    assert tuned.logprobs(["the city is"], ["Paris", "Rome"]).shape == (1, 2)
    assert info["train_accuracy"] == 1.0
    with pytest.raises(ValueError, match="TransformerLens-native"):
        model.trainable_copy(lora=LoraSpec())


STUDY_TABLES = (
    "readability_layers",
    "readability_baselines",
    "probe_readout",
    "pretrained",
    "finetunes",
    "predictions",
    "relations",
    "stats",
)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["world", "world-llama"])
def test_a_study_gives_the_same_tables_on_both_backends(name, tmp_path):
    """The study runs only through the model handle, so the backend does not change its tables:
    on the embedded GPT-2-shaped world and on the Llama-shaped zoo model (:data:`lab.world.zoo.ZOO`:
    separate q/k/v, grouped-query attention, RoPE), with full fine-tuning, and with LoRA on Llama,
    whose q/k/v projections are separate layers (GPT-2's and NeoX's fused q/k/v layer gets three
    adapters on TransformerLens, one on HuggingFace: :mod:`interp.trainable`).
    Stated tolerances: floats (losses, accuracies averaged over folds, statistics) agree within
    1e-4, since the TransformerLens bridge computes attention its own way (~1e-7 per forward
    pass); a probe's ranking of *wrong* answers may swap two near-tied answers (at most 0.1% of the
    rankings; the predicted answer never differs); the shuffled-label control probe, which fits
    noise and has many near ties, may flip one subject's prediction in a fold (its accuracy and the
    selectivity within 0.004); the MLP probe (:mod:`probes.nonlinear`) is not convex, so a 1e-7
    difference in the states flips a few of its held-out predictions (5% of one world relation's
    under a 1e-6 relative perturbation, measured): its kappa and accuracy agree within 0.06, its
    predictions in 90%, and the statistics built on it are compared for presence only (the kNN
    probe is held to 1e-4); ``trainable_params`` counts the bridge's own
    parameters, which hold q/k/v both fused and split. Everything else (every prediction, label,
    count and string) is identical."""
    from conftest import STUDY_RELATIONS

    from lab.study import FinetuneConfig, StudyConfig, run_study

    config = StudyConfig(
        finetune_budget=(9, 16),
        methods=("full", "lora") if name == "world-llama" else ("full",),
        label_seeds=(0,),
        finetune_seeds=(0,),
        other_categories=(),
        folds=3,
        n_boot=100,
        n_perm=100,
        n_null=100,
        finetune=FinetuneConfig(max_steps=30, check_every=10),
    )
    tables = {}
    for backend in interp.BACKENDS:
        out = tmp_path / backend
        # the grouped executor cannot group fine-tunes on the TransformerLens bridge: it trains
        # them one at a time and says so, so that its tables are the serial ones
        executor = "grouped" if backend == "transformer_lens" and name == "world" else None
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            run_study(name, STUDY_RELATIONS, out=out, config=config, backend=backend, progress=False, executor=executor)
        if executor:
            assert any("one at a time, not as a group" in str(w.message) for w in seen)
        tables[backend] = {table: pd.read_csv(out / f"{table}.csv") for table in STUDY_TABLES}
    a, b = tables["nnsight"], tables["transformer_lens"]
    for table in STUDY_TABLES:
        x, y = a[table], b[table]
        assert list(x.columns) == list(y.columns) and len(x) == len(y), table
        if table == "stats":  # statistics on the MLP probe's kappa: present on both, values noisy (above)
            mlp = x.analysis.str.contains("mlp")
            assert (mlp == y.analysis.str.contains("mlp")).all()
            x, y = x[~mlp], y[~mlp]
        for col in x.columns:
            if col in ("trainable_params", "mlp_best_layer"):
                continue
            if "mlp" in col and not pd.api.types.is_float_dtype(x[col]):  # the MLP's predicted answers
                assert (x[col].astype(str) != y[col].astype(str)).mean() <= 0.1, col
                continue
            if pd.api.types.is_float_dtype(x[col]):
                assert (x[col].isna() == y[col].isna()).all(), (table, col)
                tol = 0.004 if col in ("control_accuracy", "selectivity") else 0.06 if "mlp" in col else 1e-4
                assert not (x[col] - y[col]).abs().max() >= tol, (table, col)
            else:
                differ = ~((x[col].isna() & y[col].isna()) | (x[col].astype(str) == y[col].astype(str)))
                if (table, col) == ("probe_readout", "top_answers"):
                    assert differ.mean() <= 0.001, differ.mean()
                else:
                    assert not differ.any(), (
                        table,
                        col,
                        x[col][differ].head(3).tolist(),
                        y[col][differ].head(3).tolist(),
                    )
