"""The activation store: shards, manifest, resume after an interruption."""

import json

import pytest
import torch

import interp
from interp import ActivationStore, Prompt
from interp.store import StoreMismatchError

PROMPTS = [
    Prompt(f"Vorn Kallit lives in the city of {c}", "Vorn Kallit") for c in "Paris Berlin Rome Madrid Tokyo".split()
] * 3


def test_store_matches_in_memory_capture(model_dirs, backend, tmp_path):
    model = interp.load_model(model_dirs["gpt2"], backend=backend)
    sites = ["blocks.0.hook_resid_post", "blocks.1.attn.hook_z"]
    mem = interp.capture(model, PROMPTS, sites=sites, positions="subject_last", batch_size=4)
    store = interp.capture(
        model, PROMPTS, sites=sites, positions="subject_last", batch_size=4, store=tmp_path / "s", shard_size=4
    )
    assert store.complete and store.n_shards == 4
    reopened = ActivationStore(tmp_path / "s")
    for s in sites:
        assert torch.equal(reopened[s], mem[s])


def test_interrupted_capture_resumes_to_an_identical_store(model_dirs, tmp_path, monkeypatch):
    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    kwargs = dict(sites=["blocks.1.hook_resid_post"], positions="all", batch_size=2, shard_size=3)
    interp.capture(model, PROMPTS, store=tmp_path / "full", **kwargs)

    written = []
    original = ActivationStore.write_shard

    def crash_after_two(self, index, tensors):
        if len(written) == 2:
            raise KeyboardInterrupt("simulated kill")
        written.append(index)
        original(self, index, tensors)

    monkeypatch.setattr(ActivationStore, "write_shard", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        interp.capture(model, PROMPTS, store=tmp_path / "resumed", **kwargs)
    monkeypatch.setattr(ActivationStore, "write_shard", original)
    half = ActivationStore(tmp_path / "resumed")
    assert half.missing_shards() == [2, 3, 4] and not half.complete

    redone = []
    monkeypatch.setattr(ActivationStore, "write_shard", lambda self, i, t: (redone.append(i), original(self, i, t)))
    interp.capture(model, PROMPTS, store=tmp_path / "resumed", **kwargs)
    assert redone == [2, 3, 4]  # finished shards were not recomputed

    full, resumed = ActivationStore(tmp_path / "full"), ActivationStore(tmp_path / "resumed")
    assert json.loads((tmp_path / "full" / "manifest.json").read_text()) == json.loads(
        (tmp_path / "resumed" / "manifest.json").read_text()
    )
    for i in range(full.n_shards):
        a, b = full.shard(i), resumed.shard(i)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list((tmp_path / "resumed").glob("*.tmp"))


def test_store_refuses_a_different_capture(model_dirs, tmp_path):
    model = interp.load_model(model_dirs["gpt2"], backend="nnsight")
    interp.capture(model, PROMPTS, sites=["blocks.0.hook_resid_post"], store=tmp_path / "s", shard_size=8)
    with pytest.raises(StoreMismatchError, match="differs in: sites"):
        interp.capture(model, PROMPTS, sites=["blocks.1.hook_resid_post"], store=tmp_path / "s", shard_size=8)


def test_atomic_writes_leave_the_old_file_or_folder_on_failure(tmp_path):
    from interp.results import atomic_dir, atomic_path

    f = tmp_path / "t.csv"
    f.write_text("old")
    with pytest.raises(RuntimeError), atomic_path(f) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert f.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["t.csv"]
    d = tmp_path / "model"
    d.mkdir()
    (d / "weights").write_text("old")
    with pytest.raises(RuntimeError), atomic_dir(d) as tmp:
        (tmp / "weights").write_text("half")
        raise RuntimeError("killed")
    assert (d / "weights").read_text() == "old" and not (tmp_path / "model.tmp").exists()
    with atomic_dir(d) as tmp:
        (tmp / "config").write_text("new")
    assert [p.name for p in d.iterdir()] == ["config"]  # replaced whole: the old contents are gone
