"""Property-based tests (hypothesis): invariants on tiny random models of every supported family.

Each property draws a family (GPT-2, GPT-NeoX, Llama, BERT), prompts and batch compositions,
padding sides, sites and positions, with a fixed example budget (``EXAMPLES`` per property,
derandomized, so CI is fast and reproducible); ``COUNTS`` records how many examples ran and the
last test checks that every property ran its budget.
"""

from collections import Counter

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import WORDS

import interp
from circuits import UnknownComponentError
from interp.sites import UnknownSiteError
from interp.tokens import PositionError, SubjectNotFoundError
from jacobians import JacobianError, jacobian

FAMILIES = ["gpt2", "gpt_neox", "llama", "bert"]
EXAMPLES = 12
COUNTS: Counter = Counter()
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=7).map(" ".join)
prompt_lists = st.lists(words, min_size=1, max_size=4)
positions = st.sampled_from(["last", "all", 0, -1])


@pytest.fixture(scope="module")
def models(model_dirs):
    return {(f, b): interp.load_model(model_dirs[f], backend=b) for f in FAMILIES for b in interp.BACKENDS}


def _pad(batch: dict[str, torch.Tensor], prompts, n_each) -> None:
    for s, v in batch.items():
        assert v.shape[0] == len(prompts) * n_each, s


@SETTINGS
@given(family=st.sampled_from(FAMILIES), prompts=prompt_lists, position=positions, data=st.data())
def test_backends_agree(models, family, prompts, position, data):
    nn, tl = models[(family, "nnsight")], models[(family, "transformer_lens")]
    site = data.draw(st.sampled_from([s for s in nn.sites if s in tl.sites]))
    a = interp.capture(nn, prompts, sites=[site], positions=position, progress=False)
    b = interp.capture(tl, prompts, sites=[site], positions=position, progress=False)
    torch.testing.assert_close(a[site], b[site], atol=1e-4, rtol=1e-4)
    COUNTS["backends agree"] += 1


@SETTINGS
@given(
    family=st.sampled_from(FAMILIES),
    backend=st.sampled_from(interp.BACKENDS),
    prompts=prompt_lists,
    side=st.sampled_from(["left", "right"]),
    position=st.sampled_from(["last", 0, -1]),
    data=st.data(),
)
def test_a_prompt_alone_equals_it_in_any_padded_batch(models, family, backend, prompts, side, position, data):
    model = models[(family, backend)]
    site = data.draw(st.sampled_from(model.sites))
    batch = interp.capture(
        model, prompts, sites=[site], positions=position, padding_side=side, batch_size=len(prompts), progress=False
    )[site]
    for i, p in enumerate(prompts):
        alone = interp.capture(model, [p], sites=[site], positions=position, progress=False)[site]
        torch.testing.assert_close(batch[i], alone[0], atol=1e-5, rtol=1e-5)
    COUNTS["alone equals batched"] += 1


@SETTINGS
@given(family=st.sampled_from(FAMILIES), backend=st.sampled_from(interp.BACKENDS), prompts=prompt_lists, data=st.data())
def test_patching_a_run_with_its_own_activations_and_identity_hooks_change_nothing(
    models, family, backend, prompts, data
):
    model = models[(family, backend)]
    sites = data.draw(st.lists(st.sampled_from(model.sites), min_size=1, max_size=3, unique=True))
    batch = model.batch(model.encode(prompts))
    with torch.no_grad():
        base = model.run(batch)
        own = model.read(batch, sites)
        patched = model.run(batch, {s: (lambda act, s=s: own[s].clone()) for s in sites})
        identity = model.run(batch, {s: (lambda act: act) for s in sites})
    torch.testing.assert_close(patched, base, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(identity, base, atol=1e-6, rtol=1e-6)
    COUNTS["self-patching and identity hooks"] += 1


@pytest.fixture(scope="module")
def models64(model_dirs):
    return {f: interp.load_model(model_dirs[f], dtype=torch.float64) for f in FD_STEP}


#: finite-difference step and tolerance (absolute, relative) per family: GPT-2 computes in
#: float64 throughout; NeoX has float32 parts (5e-7 of noise); Llama's RMSNorm computes in float32 even for float64
#: weights, which limits the difference quotient to about 1e-4 (a wrong Jacobian is off by order 1)
FD_STEP = {"gpt2": (1e-5, 1e-7, 1e-6), "gpt_neox": (1e-4, 1e-5, 1e-4), "llama": (1e-3, 1e-3, 1e-2)}


@SETTINGS
@given(family=st.sampled_from(["gpt2", "gpt_neox", "llama"]), prompt=words, seed=st.integers(0, 2**16))
def test_jacobians_match_finite_differences(models64, family, prompt, seed):
    """``J v`` from :func:`jacobians.jacobian` equals the central difference of the forward pass
    along a random direction ``v`` at the last position (float64 weights; see :data:`FD_STEP`)."""
    model = models64[family]
    wrt, of = "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"
    J = jacobian(model, [prompt], wrt=wrt, of=of)[0]
    v = torch.randn(J.shape[1], generator=torch.Generator().manual_seed(seed), dtype=J.dtype)
    batch = model.batch(model.encode([prompt]))
    last = int(batch.attention_mask[0].sum()) - 1
    eps, atol, rtol = FD_STEP[family]

    def moved(step):
        def hook(act):
            act = act.clone()
            act[0, last] += step * v
            return act

        out = {}
        with torch.no_grad():
            model.run(batch, {wrt: hook, of: lambda act: out.__setitem__("y", act[0, last].clone())})
        return out["y"]

    fd = (moved(eps) - moved(-eps)) / (2 * eps)
    torch.testing.assert_close(J @ v, fd, atol=atol, rtol=rtol)
    COUNTS["jacobian vs finite differences"] += 1


OUR_ERRORS = (
    UnknownSiteError,
    PositionError,
    SubjectNotFoundError,
    UnknownComponentError,
    JacobianError,
    ValueError,
    TypeError,
)
junk_site = st.text(alphabet="abcdefghijklmnopqrstuvwxyz._0123456789", min_size=0, max_size=24)
junk_input = st.one_of(
    st.just([]),
    st.just(""),
    st.integers(),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.just([[]]),
    st.just({"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.ones(3, 2)}),
    st.just(torch.rand(2, 2)),
    st.just([interp.Prompt("the city", subject="Rome")]),
)


@SETTINGS
@given(
    family=st.sampled_from(FAMILIES),
    backend=st.sampled_from(interp.BACKENDS),
    site=junk_site,
    bad=junk_input,
    position=st.one_of(positions, st.integers(-40, 40), st.just("subject_last"), st.just("middle")),
)
def test_malformed_input_raises_our_error_with_a_message(models, family, backend, site, bad, position):
    model = models[(family, backend)]
    for call in (
        lambda: interp.capture(model, ["the city"], sites=[site], progress=False),
        lambda: interp.capture(model, bad, sites=model.sites[:1], progress=False),
        lambda: interp.capture(model, ["the city is"], sites=model.sites[:1], positions=position, progress=False),
    ):
        try:
            call()
        except OUR_ERRORS as err:
            assert type(err) not in (KeyError, IndexError) and str(err).strip(), repr(err)
        except Exception as err:  # anything else is a bug: a bare error from deep inside
            pytest.fail(f"{type(err).__name__} escaped: {err!r}")
    COUNTS["malformed input"] += 1


def test_every_property_ran_its_example_budget():
    """Runs last in this module: how many examples each property ran."""
    print("hypothesis examples per property:", dict(COUNTS))
    assert len(COUNTS) == 5 and all(n >= EXAMPLES // 2 for n in COUNTS.values()), COUNTS
