"""Bad input gets an error that names the problem and the fix."""

import pytest

import interp
from interp import Prompt
from interp.architectures import UnsupportedArchitectureError


@pytest.fixture
def model(model_dirs, backend):
    return interp.load_model(model_dirs["gpt2"], backend=backend)


def test_unknown_site_suggests_nearest(model):
    with pytest.raises(interp.UnknownSiteError) as err:
        interp.capture(model, ["the city"], sites=["blocks.1.hook_resid_pst"])
    assert "blocks.1.hook_resid_post" in str(err.value) and "Nearest" in str(err.value)


def test_layer_out_of_range_is_unknown_site(model):
    with pytest.raises(interp.UnknownSiteError, match="blocks.1.hook_resid_post"):
        interp.capture(model, ["the city"], sites=["blocks.9.hook_resid_post"])


def test_position_outside_prompt(model):
    with pytest.raises(interp.PositionError, match=r"position 7 is outside prompt 0 .* 2 tokens"):
        interp.capture(model, ["the city"], sites=["blocks.0.hook_resid_post"], positions=7)


def test_empty_input(model):
    with pytest.raises(ValueError, match="empty input"):
        interp.capture(model, [], sites=["blocks.0.hook_resid_post"])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        interp.capture(model, ["the city", ""], sites=["blocks.0.hook_resid_post"])


def test_subject_not_in_prompt(model):
    with pytest.raises(interp.SubjectNotFoundError, match="'Berlin' not found in prompt 0"):
        interp.capture(
            model,
            [Prompt("Paris is in France", "Berlin")],
            sites=["blocks.0.hook_resid_post"],
            positions="subject_last",
        )


def test_subject_position_without_subject(model):
    with pytest.raises(interp.PositionError, match="has no subject"):
        interp.capture(model, ["Paris is in France"], sites=["blocks.0.hook_resid_post"], positions="subject_last")


def test_hub_name_without_local_weights(backend):
    with pytest.raises(
        interp.ModelNotFoundError, match=r"no local weights for 'gpt2-not-here'.*load_model\('\./gpt2-not-here'\)"
    ):
        interp.load_model("gpt2-not-here", backend=backend)


def test_missing_directory():
    with pytest.raises(interp.ModelNotFoundError, match="no model directory"):
        interp.load_model("./nowhere/model")


def test_unknown_backend(model_dirs):
    with pytest.raises(ValueError, match="choose one of transformer_lens, nnsight"):
        interp.load_model(model_dirs["gpt2"], backend="jax")


def test_unmapped_architecture_says_how_to_add_one():
    from tiny_models import word_tokenizer
    from transformers import GPTJConfig, GPTJForCausalLM

    hf = GPTJForCausalLM(GPTJConfig(n_layer=1, n_embd=32, n_head=4, rotary_dim=4, vocab_size=60, n_positions=32))
    with pytest.raises(UnsupportedArchitectureError, match=r"model_type='gptj'.*interp/architectures.py"):
        interp.load_model(hf, backend="nnsight", tokenizer=word_tokenizer())
