"""SAEs read from sae-lens's format, checked against sae-lens's own outputs, and attached to models
as sites on both backends.

``tests/data/sae_lens/{standard,topk,jumprelu}/`` are folders sae-lens 6.54.12's ``SAE.save_model``
wrote, and ``<name>.reference.safetensors`` holds sae-lens's own ``encode``, ``decode`` and forward
on a fixed input, and the same read by sae-lens from the folder this toolkit's ``save_sae`` writes
of it; ``edge_cases.reference.safetensors`` holds two tiny hand-built SAEs and sae-lens's encoding
(``tests/data/make_sae_fixtures.py`` says how). sae-lens does not import beside TransformerLens 4,
so the suite cannot call it; these files are its output. The reader must reproduce them to within
1e-6 (absolute and relative; on the machine that wrote them it does so bit for bit: the same
operations in the same order).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from conftest import BACKENDS
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import interp
import interp.sae
from interp import memory
from interp.backends import Backend
from interp.sae import SAEFormatError, SparseAutoencoder, as_sae, from_config, load_sae, save_sae
from interp.sae_sites import SAE_HOOKS, attach_sae, attached_saes, feature_site

DATA = Path(__file__).parent / "data" / "sae_lens"
ARCHITECTURES = ["standard", "topk", "jumprelu"]
PROMPTS = ["Chithix has a squirrel", "Gras drew a peach on the table", "Zim has a lemon"]
#: the reader reproduces sae-lens's outputs to within this, absolute and relative (the module docstring)
TOL = dict(atol=1e-6, rtol=1e-6)


def reference(name: str) -> dict[str, torch.Tensor]:
    return load_file(str(DATA / f"{name}.reference.safetensors"))


def reference_metadata(name: str) -> dict[str, str]:
    with safe_open(str(DATA / f"{name}.reference.safetensors"), framework="pt") as f:
        return f.metadata()


@pytest.fixture(scope="module", params=BACKENDS)
def world(request):
    return interp.load_model("world", backend=request.param)


# the reader, against sae-lens's own outputs ----------------------------------------------------
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_encode_and_decode_equal_sae_lens(name):
    sae, ref = load_sae(DATA / name), reference(name)
    assert sae.architecture == name and (sae.d_in, sae.d_sae) == (128, 256)
    features = sae.encode(ref["x"])
    torch.testing.assert_close(features, ref["features"], **TOL)
    torch.testing.assert_close(sae.decode(ref["features"]), ref["reconstruction"], **TOL)
    torch.testing.assert_close(sae(ref["x"]), ref["output"], **TOL)
    assert (features > 0).any() and (features == 0).any()  # the fixture exercises both sides of the activation
    if name == "topk":
        assert ((features != 0).sum(-1) <= sae.k).all()


def edge_case(name: str) -> tuple[SparseAutoencoder, torch.Tensor, torch.Tensor]:
    """A tiny hand-built SAE of the fixture, read as sae-lens's cfg.to_dict() and state_dict(); its
    input, and sae-lens's encoding of it."""
    tensors = load_file(str(DATA / "edge_cases.reference.safetensors"))
    mine = {k.split(".", 1)[1]: v for k, v in tensors.items() if k.startswith(f"{name}.")}
    cfg = json.loads(reference_metadata("edge_cases")[f"{name}.cfg"])
    weights = {k: v for k, v in mine.items() if k not in ("x", "features")}
    return from_config(cfg, weights), mine["x"], mine["features"]


def test_jumprelu_is_relu_above_a_strict_threshold():
    """Negative thresholds: a pre-activation above its threshold but below 0 gives 0 (the ReLU);
    feature 2 has W_enc = 0 and b_enc == threshold, so its pre-activation equals the threshold
    exactly: 0 (the comparison is >, not >=)."""
    sae, x, by_sae_lens = edge_case("jumprelu_edge")
    assert (sae.threshold < 0).any() and torch.equal(sae.W_enc[:, 2], torch.zeros(2))
    assert sae.b_enc[2] == sae.threshold[2]
    expected = torch.tensor([[0.0, 0.5, 0.0, 0.2, 0.3], [0.4, 0.0, 0.0, 0.0, 0.9], [0.0, 0.0, 0.0, 0.7, 0.0]])
    torch.testing.assert_close(sae.encode(x), expected)
    torch.testing.assert_close(sae.encode(x), by_sae_lens, **TOL)
    pre = sae.pre_activation(sae.sae_input(x))
    assert ((pre > sae.threshold) & (pre < 0)).any()  # where a JumpReLU without its ReLU would be negative
    assert (pre == sae.threshold).any()  # where >= would let the threshold itself through


def test_topk_keeps_only_the_positive_of_its_k_largest():
    """Every row has fewer positive pre-activations than k = 3: the rest of its top 3 are 0."""
    sae, x, by_sae_lens = edge_case("topk_edge")
    pre = sae.pre_activation(sae.sae_input(x))
    assert sae.k == 3 and ((pre > 0).sum(-1) < sae.k).all()
    expected = torch.tensor([[0.8, 0.0, 0.4, 0.0, 0.0], [0.0, 0.6, 0.0, 0.3, 0.0], [0.0, 0.1, 0.0, 0.05, 0.0]])
    torch.testing.assert_close(sae.encode(x), expected)
    torch.testing.assert_close(sae.encode(x), by_sae_lens, **TOL)


def test_the_config_and_sparsity_are_kept():
    sae = load_sae(DATA / "standard")
    assert sae.hook_name == "blocks.1.hook_resid_post" and sae.config["metadata"]["sae_lens_version"] == "6.54.12"
    assert sae.log_sparsity is not None and sae.log_sparsity.shape == (256,)
    assert load_sae(DATA / "topk").k == 16 and load_sae(DATA / "jumprelu").reshape_activations == "hook_z"
    assert load_sae(DATA / "standard", dtype=torch.float64).W_enc.dtype == torch.float64
    moved = sae.to("meta")  # the log sparsities move with the weights (a buffer, not a weight)
    assert moved.log_sparsity.device.type == "meta" and "log_sparsity" not in moved.state_dict()


def _copy(tmp_path: Path, name: str = "standard") -> Path:
    folder = tmp_path / name
    shutil.copytree(DATA / name, folder)
    return folder


def _edit_cfg(folder: Path, **changes) -> None:
    cfg = json.loads((folder / "cfg.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (folder / "cfg.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"architecture": "gated"}, "'gated' is not one this reader computes"),
        ({"architecture": None}, "names no architecture"),
        ({"d_sae": None}, r"lacks \['d_sae'\]"),
        ({"normalize_activations": "layer_norm"}, "normalizes every input by its own statistics"),
        ({"dtype": "float8"}, r"dtype 'float8' is not one sae-lens reads \(float32, float64, float16, bfloat16\)"),
    ],
)
def test_a_config_it_cannot_compute_is_refused_with_what_to_do(tmp_path, changes, message):
    folder = _copy(tmp_path)
    _edit_cfg(folder, **changes)
    (folder / "sae_weights.safetensors").unlink()  # refused from the config alone, before any weight is read
    with pytest.raises(SAEFormatError, match=message):
        load_sae(folder)


def test_torch_dtype_names_are_read_as_sae_lens_reads_them(tmp_path):
    folder = _copy(tmp_path)
    _edit_cfg(folder, dtype="torch.bfloat16")
    assert load_sae(folder).dtype == torch.bfloat16


@pytest.fixture
def tensors_read(monkeypatch):
    """The names of the tensors load_sae reads from a weights file."""
    read = []
    real = interp.sae.safe_open

    class Recording:
        def __init__(self, *args, **kwargs):
            self.file = real(*args, **kwargs)

        def __enter__(self):
            self.opened = self.file.__enter__()
            return self

        def __exit__(self, *exc):
            return self.file.__exit__(*exc)

        def keys(self):
            return self.opened.keys()

        def get_tensor(self, name):
            read.append(name)
            return self.opened.get_tensor(name)

    monkeypatch.setattr(interp.sae, "safe_open", Recording)
    return read


def test_weights_missing_or_unexpected_are_refused_before_any_is_read(tmp_path, tensors_read):
    folder = _copy(tmp_path)
    weights = load_file(str(folder / "sae_weights.safetensors"))
    save_file(
        {k: v for k, v in weights.items() if k != "b_enc"} | {"W_enc_extra": torch.ones(1)},
        folder / "sae_weights.safetensors",
    )
    with pytest.raises(SAEFormatError, match=r"missing \['b_enc'\]; unexpected \['W_enc_extra'\]"):
        load_sae(folder)
    assert tensors_read == []  # refused from the file's header
    _edit_cfg(folder, architecture="jumprelu")
    save_file(weights, folder / "sae_weights.safetensors")
    with pytest.raises(SAEFormatError, match=r"missing \['threshold'\]"):
        load_sae(folder)
    assert tensors_read == []
    _edit_cfg(folder, architecture="standard")
    save_file(weights | {"W_dec": weights["W_dec"].T.contiguous()}, folder / "sae_weights.safetensors")
    with pytest.raises(SAEFormatError, match=r"W_dec has shape \(128, 256\), expected \(256, 128\)"):
        load_sae(folder)


def test_an_all_ones_scaling_factor_is_dropped_as_sae_lens_drops_it(tmp_path):
    """SAEs saved before sae-lens 6 may hold scaling_factor = ones (SAELens PR #95); sae-lens's
    read_sae_components_from_disk deletes it. Other values are refused."""
    folder = _copy(tmp_path)
    weights = load_file(str(folder / "sae_weights.safetensors"))
    save_file(weights | {"scaling_factor": torch.ones(256)}, folder / "sae_weights.safetensors")
    sae, ref = load_sae(folder), reference("standard")
    assert "scaling_factor" not in sae.state_dict()
    torch.testing.assert_close(sae.encode(ref["x"]), ref["features"], **TOL)
    save_file(weights | {"scaling_factor": torch.full((256,), 2.0)}, folder / "sae_weights.safetensors")
    with pytest.raises(SAEFormatError, match="scaling_factor other than ones"):
        load_sae(folder)


def test_an_unfolded_training_checkpoint_and_a_wrong_folder_are_refused(tmp_path):
    folder = _copy(tmp_path)
    _edit_cfg(folder, normalize_activations="expected_average_only_in")
    assert torch.equal(
        load_sae(folder).W_enc, load_sae(DATA / "standard").W_enc
    )  # as sae-lens: folded, no runtime scaling
    (folder / "activation_scaler.json").write_text("{}")
    with pytest.raises(SAEFormatError, match="not folded into its weights"):
        load_sae(folder)
    with pytest.raises(SAEFormatError, match="give folder="):
        load_sae(DATA)
    with pytest.raises(SAEFormatError, match="no SAE folder"):
        load_sae(tmp_path / "nowhere")


def test_a_config_older_than_sae_lens_6_is_read_as_sae_lens_renames_it(tmp_path):
    folder = _copy(tmp_path)
    cfg = json.loads((folder / "cfg.json").read_text())
    # sae-lens renames hook_point to hook_name, replacing a hook_name written before it
    old = {"d_in": 128, "d_sae": 256, "dtype": "float32", "hook_name": "blocks.0.hook_resid_post"}
    old |= {"hook_point": cfg["metadata"]["hook_name"], "model_name": "world", "context_size": 64}
    old |= {"activation_fn_str": "relu", "normalize_activations": False, "sae_lens_version": "3.13.0"}
    (folder / "cfg.json").write_text(json.dumps(old))
    sae, ref = load_sae(folder), reference("standard")
    assert sae.hook_name == "blocks.1.hook_resid_post" and sae.apply_b_dec_to_input
    torch.testing.assert_close(sae.encode(ref["x"]), ref["features"], **TOL)
    metadata = sae.config["metadata"]  # gathered from the top level, as sae-lens gathers it
    assert metadata["model_name"] == "world" and metadata["context_size"] == 64
    again = load_sae(save_sae(sae, tmp_path / "again"))  # written in sae-lens 6's format, the metadata kept
    kept = again.config["metadata"]
    assert kept["model_name"] == "world" and kept["context_size"] == 64 and kept["sae_lens_version"] == "6.54.12"
    assert kept["sae_lens_training_version"] is None  # unknown before sae-lens 6, and kept so
    assert again.hook_name == "blocks.1.hook_resid_post"


def test_the_training_version_is_kept_when_saved(tmp_path):
    folder = _copy(tmp_path)
    cfg = json.loads((folder / "cfg.json").read_text())
    _edit_cfg(folder, metadata=cfg["metadata"] | {"sae_lens_training_version": "6.10.0"})
    again = load_sae(save_sae(load_sae(folder), tmp_path / "again"))
    assert again.config["metadata"]["sae_lens_training_version"] == "6.10.0"


def test_an_sae_on_the_hub_is_read_from_its_folder_there(monkeypatch):
    calls = []

    def snapshot_download(repo, allow_patterns=None, local_files_only=False):
        calls.append((repo, allow_patterns, local_files_only))
        return str(DATA)

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    sae = load_sae("someone/world-saes", "topk")
    assert sae.k == 16 and calls == [
        ("someone/world-saes", ["topk/cfg.json", "topk/sae_weights.safetensors", "topk/sparsity.safetensors"], True)
    ]


def test_a_cached_snapshot_without_the_folder_is_not_taken(monkeypatch, tmp_path):
    """The local cache holds another folder of the repository (an earlier download): offline, that is
    said; online, the folder is downloaded."""
    partial = tmp_path / "partial"
    shutil.copytree(DATA / "standard", partial / "standard")
    calls = []

    def snapshot_download(repo, allow_patterns=None, local_files_only=False):
        calls.append(local_files_only)
        return str(partial if local_files_only else DATA)

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    with pytest.raises(SAEFormatError, match=r"has no topk/cfg\.json.*HF_HUB_OFFLINE"):
        load_sae("someone/world-saes", "topk")
    assert calls == [True]
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert load_sae("someone/world-saes", "topk").k == 16 and calls == [True, True, False]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_sae_lens_reads_a_saved_sae_as_it_was(tmp_path, name):
    """save_sae writes the bytes sae-lens's load_from_disk read when the fixtures were made (their
    SHA-256 is in the reference file), and what sae-lens computed from that folder is the original
    SAE's output, which this reader reproduces."""
    sae, ref, meta = load_sae(DATA / name), reference(name), reference_metadata(name)
    folder = save_sae(sae, tmp_path / name)
    recorded = json.loads(meta["saved_sha256"])
    now = {f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in recorded}
    assert now == recorded, "save_sae writes other bytes than sae-lens read: run tests/data/make_sae_fixtures.py"
    for key in ("features", "reconstruction", "output"):
        torch.testing.assert_close(ref[f"saved_{key}"], ref[key], atol=0, rtol=0)  # sae-lens: the same SAE
    again = load_sae(folder)
    torch.testing.assert_close(again.encode(ref["x"]), ref["saved_features"], **TOL)
    torch.testing.assert_close(again(ref["x"]), ref["saved_output"], **TOL)
    read = json.loads(meta["saved_cfg"])  # the config sae-lens read from the saved folder
    assert meta["saved_class"] == {"standard": "StandardSAE", "topk": "TopKSAE", "jumprelu": "JumpReLUSAE"}[name]
    assert read["architecture"] == name and read["metadata"]["hook_name"] == sae.hook_name
    assert read["apply_b_dec_to_input"] == sae.apply_b_dec_to_input
    assert read["reshape_activations"] == sae.reshape_activations and read.get("k") == sae.k
    assert again.config["metadata"]["model_name"] == "world" and again.hook_name == sae.hook_name
    assert (again.log_sparsity is None) == (name != "standard")


def test_the_digest_hashes_the_weights_as_stored_once(monkeypatch):
    sae = load_sae(DATA / "standard")
    hashed = []
    real = interp.sae.hashlib.sha256
    monkeypatch.setattr(interp.sae.hashlib, "sha256", lambda *a: hashed.append(1) or real(*a))
    first = sae.digest()
    assert sae.digest() == first and len(hashed) == 1  # kept
    half = SparseAutoencoder(*(getattr(sae, n).to(torch.bfloat16) for n in ("W_enc", "b_enc", "W_dec", "b_dec")))
    assert half.digest() != first  # bfloat16 bytes hash as they are
    with torch.no_grad():
        sae.W_dec[3, 4] += 1.0  # changed in place
    assert sae.digest() != first and len(hashed) == 3


def test_an_sae_of_ones_own_is_taken():
    sae, ref = load_sae(DATA / "standard"), reference("standard")
    tensors = {n: getattr(sae, n) for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
    from_dict = as_sae(tensors, hook_name="blocks.1.hook_resid_post")
    torch.testing.assert_close(from_dict.encode(ref["x"]), ref["features"], **TOL)

    class Mine(torch.nn.Module):  # its own encode, without subtracting b_dec; no decode
        def __init__(self):
            super().__init__()
            for n, t in tensors.items():
                self.register_buffer(n, t.clone())

        def encode(self, x):
            return torch.relu(x @ self.W_enc + self.b_enc)

    mine = as_sae(Mine(), hook_name="blocks.1.hook_resid_post")
    torch.testing.assert_close(mine.encode(ref["x"]), torch.relu(ref["x"] @ sae.W_enc + sae.b_enc))
    torch.testing.assert_close(mine.decode(ref["features"]), ref["reconstruction"], **TOL)

    class SaeLensLike:  # what a sae-lens SAE offers: cfg.to_dict() and state_dict()
        cfg = type("Cfg", (), {"to_dict": staticmethod(lambda: json.loads((DATA / "topk" / "cfg.json").read_text()))})()

        def state_dict(self):
            return load_file(str(DATA / "topk" / "sae_weights.safetensors"))

    torch.testing.assert_close(as_sae(SaeLensLike()).encode(reference("topk")["x"]), reference("topk")["features"])
    with pytest.raises(SAEFormatError, match=r"this one has only \['W_enc'\]"):
        as_sae(type("Half", (), {"W_enc": sae.W_enc})())
    with pytest.raises(SAEFormatError, match="expected"):
        SparseAutoencoder(sae.W_enc, sae.b_enc, sae.W_enc, sae.b_dec)
    with pytest.raises(SAEFormatError, match="its own encode"):
        save_sae(mine, "unused")


# attached to a model ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_features_are_the_encoding_of_the_captured_activation(world, name):
    sae = load_sae(DATA / name)
    model = attach_sae(world, sae)
    site = sae.hook_name
    acts = interp.capture(model, PROMPTS, sites=[site, feature_site(site)], positions="all")
    mask = acts.mask[..., None]
    assert acts[feature_site(site)].shape == (*acts.mask.shape, 256)
    # equal up to float rounding: the hook encodes [batch, pos, d] at once, this the gathered rows
    torch.testing.assert_close(acts[feature_site(site)], sae.encode(acts[site]) * mask, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(acts[site], interp.capture(world, PROMPTS, sites=[site], positions="all")[site])
    assert set(attached_saes(model)) == {site} and model.fingerprint() != world.fingerprint()
    torch.testing.assert_close(
        model.forward(PROMPTS), world.forward(PROMPTS), atol=0, rtol=0
    )  # reading changes nothing


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_splicing_with_the_error_term_leaves_the_logits_as_they_were(world, name):
    sae = load_sae(DATA / name)
    base = world.forward(PROMPTS)
    spliced = attach_sae(world, sae, splice=True)
    torch.testing.assert_close(spliced.forward(PROMPTS), base, atol=0, rtol=0)
    torch.testing.assert_close(
        spliced.logprobs(PROMPTS[:1], ["a", "the"]), world.logprobs(PROMPTS[:1], ["a", "the"]), atol=0, rtol=0
    )
    read = spliced.run(PROMPTS, {feature_site(sae.hook_name, h): (lambda a: None) for h in SAE_HOOKS})
    torch.testing.assert_close(read, base, atol=0, rtol=0)  # every point's copy flows on: still the model's values
    without = attach_sae(world, sae, splice=True, error_term=False)
    assert (
        without.forward(PROMPTS) - base
    ).abs().max() > 1.0  # the random SAE reconstructs poorly: the model runs on it
    assert (without.final_hidden(PROMPTS) - world.final_hidden(PROMPTS)).abs().max() > 1e-3
    torch.testing.assert_close(without.trainable_copy().forward(PROMPTS), without.forward(PROMPTS))
    with pytest.raises(ValueError, match="attention patterns are read from the model's own attention"):
        without.attention_pattern(PROMPTS, 1)


def test_a_bfloat16_model_is_not_rounded_by_the_splice(world):
    """x + (decode(f') - decode(f)) in float32, cast once: exact where nothing changes, in bfloat16
    too (r + (x - r) in bfloat16 is not)."""
    half = interp.load_model("world", backend=world.backend_name, dtype=torch.bfloat16)
    sae = load_sae(DATA / "standard")  # float32
    site = sae.hook_name
    base = half.forward(PROMPTS)
    spliced = attach_sae(half, sae, splice=True)
    torch.testing.assert_close(spliced.forward(PROMPTS), base, atol=0, rtol=0)
    same = attach_sae(half, sae).intervened(feature_site(site), lambda f, batch: f.clone())
    torch.testing.assert_close(same.forward(PROMPTS), base, atol=0, rtol=0)
    x = half.read(PROMPTS, [site])[site]
    keep = torch.ones(256)
    keep[:64] = 0
    patched = attach_sae(half, sae).intervened(feature_site(site), lambda f, batch: f * keep)
    out = {}
    patched.run(PROMPTS, {feature_site(site, "hook_sae_output"): lambda a: out.setdefault("o", a)})
    expected = (x.float() + (sae.decode(sae.encode(x) * keep) - sae(x))).to(torch.bfloat16)
    torch.testing.assert_close(out["o"], expected, atol=0, rtol=0)
    lowered = attach_sae(world, sae.to(torch.bfloat16), splice=True)  # an SAE narrower than the model
    torch.testing.assert_close(lowered.forward(PROMPTS), world.forward(PROMPTS), atol=0, rtol=0)


def test_patching_features_runs_through_decode_plus_error(world):
    sae = load_sae(DATA / "standard")
    model, site = attach_sae(world, sae), sae.hook_name
    base = world.forward(PROMPTS)
    same = model.intervened(feature_site(site), lambda f, batch: f.clone())  # writes back what it read
    torch.testing.assert_close(same.forward(PROMPTS), base, atol=0, rtol=0)
    keep = torch.ones(256)
    keep[:64] = 0

    def by_hand(x, batch):  # the same patch, computed at the site itself
        return sae.decode(sae.encode(x) * keep) + (x - sae(x))

    ablated = model.intervened(feature_site(site), lambda f, batch: f * keep).forward(PROMPTS)
    torch.testing.assert_close(ablated, world.intervened(site, by_hand).forward(PROMPTS), atol=1e-5, rtol=1e-5)
    assert (ablated - base).abs().max() > 1e-2
    out = {}
    model.run(PROMPTS, {feature_site(site, h): (lambda h: lambda a: out.__setitem__(h, a))(h) for h in SAE_HOOKS})
    x = world.read(PROMPTS, [site])[site]
    torch.testing.assert_close(out["hook_sae_input"], x, atol=0, rtol=0)
    torch.testing.assert_close(out["hook_sae_acts_pre"], sae.pre_activation(x))
    torch.testing.assert_close(out["hook_sae_acts_post"], sae.encode(x))
    torch.testing.assert_close(out["hook_sae_recons"], sae(x))
    torch.testing.assert_close(out["hook_sae_error"], x - sae(x))
    torch.testing.assert_close(out["hook_sae_output"], x, atol=0, rtol=0)  # not spliced, nothing written: x itself


#: a write at each hook point, (hook point, the write as a new tensor); the same written in place is
#: a hook that returns None
WRITES = {
    "hook_sae_input": lambda a: a * 0.5,
    "hook_sae_acts_pre": lambda a: a - 0.2,
    "hook_sae_acts_post": lambda a: a * (torch.arange(a.shape[-1]) >= 64),
    "hook_sae_recons": lambda a: a * 0.5,
    "hook_sae_error": lambda a: a * 0.5,
    "hook_sae_output": lambda a: a * 0.5,
}


def _none(_) -> None:
    return None


IN_PLACE = {
    "hook_sae_input": lambda a: _none(a.mul_(0.5)),
    "hook_sae_acts_pre": lambda a: _none(a.sub_(0.2)),
    "hook_sae_acts_post": lambda a: _none(a.mul_(torch.arange(a.shape[-1]) >= 64)),
    "hook_sae_recons": lambda a: _none(a.mul_(0.5)),
    "hook_sae_error": lambda a: _none(a.mul_(0.5)),
    "hook_sae_output": lambda a: _none(a.mul_(0.5)),
}


@pytest.mark.parametrize("point", SAE_HOOKS)
def test_a_write_in_place_at_an_sae_point_is_a_write(world, point):
    """As at any site, a hook that edits its activation in place and returns None writes; and the
    SAE's own values stay out of its reach (the error term is computed from the clean features)."""
    sae = load_sae(DATA / "standard")
    model, name = attach_sae(world, sae), feature_site(sae.hook_name, point)
    base = world.forward(PROMPTS)
    returned = model.run(PROMPTS, {name: WRITES[point]})
    in_place = model.run(PROMPTS, {name: IN_PLACE[point]})
    assert (returned - base).abs().max() > 1e-3
    torch.testing.assert_close(in_place, returned, atol=0, rtol=0)
    at_site = world.run(PROMPTS, {sae.hook_name: lambda a: _none(a.mul_(0.5))})  # the convention at a site
    assert (at_site - base).abs().max() > 1e-3


def test_a_hook_z_sae_fires_its_points_in_sae_lens_shapes(world):
    """The input and the reconstruction are flat ([.., head * d_head]), as sae-lens fires them; the
    error and the output have the site's shape."""
    sae = load_sae(DATA / "jumprelu")
    model, site = attach_sae(world, sae), sae.hook_name
    out = {}
    model.run(PROMPTS, {feature_site(site, h): (lambda h: lambda a: out.__setitem__(h, a))(h) for h in SAE_HOOKS})
    z = world.read(PROMPTS, [site])[site]
    b, p = z.shape[:2]
    assert z.shape == (b, p, 4, 32)
    assert out["hook_sae_input"].shape == out["hook_sae_recons"].shape == (b, p, 128)
    assert out["hook_sae_acts_pre"].shape == out["hook_sae_acts_post"].shape == (b, p, 256)
    assert out["hook_sae_error"].shape == out["hook_sae_output"].shape == (b, p, 4, 32)
    torch.testing.assert_close(out["hook_sae_input"], z.flatten(-2), atol=0, rtol=0)
    torch.testing.assert_close(out["hook_sae_recons"].unflatten(-1, (4, 32)) + out["hook_sae_error"], z)


def test_reading_features_computes_no_reconstruction(world, monkeypatch):
    sae = load_sae(DATA / "standard")
    model, site = attach_sae(world, sae), sae.hook_name
    used = attached_saes(model)[site]
    decoded = []
    real = used.reconstruct
    monkeypatch.setattr(used, "reconstruct", lambda f: decoded.append(1) or real(f))
    interp.capture(model, PROMPTS, sites=[feature_site(site)])
    assert decoded == []  # only encoded
    interp.capture(model, PROMPTS, sites=[feature_site(site, "hook_sae_error")])
    assert decoded  # the error term needs the reconstruction


def test_attribution_reaches_the_features_of_a_spliced_model(world):
    """With the error term in the graph, d(logit)/d(features) = d(logit)/d(site) @ W_dec^T."""
    sae = load_sae(DATA / "standard")
    site = sae.hook_name
    spliced = attach_sae(world, sae, splice=True)
    keep = {}

    def leaf(name):
        def fn(act):
            keep[name] = act.detach().requires_grad_(True)
            return keep[name]

        return fn

    spliced.run(PROMPTS[:1], {feature_site(site): leaf("f")})[0, -1, 5].backward()
    world.run(PROMPTS[:1], {site: leaf("x")})[0, -1, 5].backward()
    torch.testing.assert_close(keep["f"].grad, keep["x"].grad @ sae.W_dec.T, atol=1e-5, rtol=1e-4)
    held = {}  # a reading hook on a spliced model: the copy it holds is in the graph

    def hold(act):
        act.retain_grad()
        held["f"] = act

    spliced.run(PROMPTS[:1], {feature_site(site): hold})[0, -1, 5].backward()
    torch.testing.assert_close(held["f"].grad, keep["f"].grad, atol=1e-6, rtol=1e-5)


def test_the_sae_backend_is_a_backend_with_no_guessed_attributes(world):
    model = attach_sae(world, load_sae(DATA / "standard"))
    assert isinstance(model.backend, Backend) and model.backend_name == world.backend_name
    assert model.site_width(feature_site("blocks.1.hook_resid_post")) == 256
    assert model.site_width(feature_site("blocks.1.hook_resid_post", "hook_sae_error")) == 128
    assert model.site_width("blocks.1.hook_resid_post") == world.d_model
    with pytest.raises(AttributeError, match="offers the Backend interface"):
        model.backend.envoy_or_anything_else  # noqa: B018
    with pytest.raises(TypeError, match=r"load each SAE \(interp.load_sae\) and attach it there"):
        pickle.dumps(model)


def test_the_capture_memory_check_counts_feature_sites_at_their_width(world, monkeypatch):
    model, site = attach_sae(world, load_sae(DATA / "standard")), "blocks.1.hook_resid_post"
    need = []
    real = memory.check_fits
    monkeypatch.setattr(memory, "check_fits", lambda n, *a: need.append(n) or real(n, *a))
    interp.capture(model, PROMPTS, sites=[site])
    interp.capture(model, PROMPTS, sites=[feature_site(site)])
    # two copies of 3 rows, float32: 256 values a row where the residual has 128
    assert need[1] - need[0] == 2 * len(PROMPTS) * (256 - 128) * 4


def test_a_site_the_sae_cannot_read_is_refused_before_any_pass(world, tmp_path):
    sae = load_sae(DATA / "standard")
    tensors = {n: getattr(sae, n) for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
    with pytest.raises(interp.UnknownSiteError, match="no site for.*Pass site="):
        attach_sae(world, as_sae(tensors, "blocks.7.hook_resid_post"))
    if world.backend_name == "nnsight":  # a TransformerBridge has this hook of its own, and takes it
        with pytest.raises(interp.UnknownSiteError, match="nearest site is attn.hook_in"):
            attach_sae(world, as_sae(tensors, "blocks.1.ln1.hook_normalized"))
    with pytest.raises(ValueError, match="per head"):
        attach_sae(world, sae, site="blocks.1.attn.hook_z")
    with pytest.raises(ValueError, match="names no hook"):
        attach_sae(world, as_sae(tensors))
    moved = attach_sae(world, sae, site="blocks.0.hook_resid_post")  # site= overrides the config
    two = attach_sae(moved, load_sae(DATA / "topk"))
    assert set(attached_saes(two)) == {"blocks.0.hook_resid_post", "blocks.2.hook_resid_pre"}
    with pytest.raises(ValueError, match="already has an SAE"):
        attach_sae(two, sae, site="blocks.0.hook_resid_post")
    with pytest.raises(interp.UnknownSiteError, match="unknown site"):
        interp.capture(world, PROMPTS, sites=[feature_site("blocks.1.hook_resid_post")])  # the plain handle has none
    folder = _copy(tmp_path)  # an SAE on one head is read, and refused where it would be attached
    cfg = json.loads((folder / "cfg.json").read_text())
    _edit_cfg(folder, metadata=cfg["metadata"] | {"hook_head_index": 2})
    one_head = load_sae(folder)
    torch.testing.assert_close(one_head.encode(reference("standard")["x"]), reference("standard")["features"], **TOL)
    with pytest.raises(ValueError, match=r"reads one attention head \(hook_head_index=2\)"):
        attach_sae(world, one_head)
