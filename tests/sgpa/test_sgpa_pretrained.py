"""Saving and reloading converted Hugging Face models: ``save_pretrained`` then
``gpytorch_sgpa.from_pretrained``, and ``torch.save`` / ``torch.load`` of the whole module, give the
saved model's outputs exactly (posterior mean, and samples drawn under the same seed); the
model's own ``from_pretrained`` refuses to give the softmax network silently."""

import io

import pytest
import torch

import gpytorch_sgpa
from gpytorch_sgpa import SGPAttention, posterior_mean

transformers = pytest.importorskip("transformers")


def _bert(layers=2):
    config = transformers.BertConfig(
        vocab_size=60,
        hidden_size=16,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    inputs = dict(input_ids=torch.randint(1, 60, (3, 7)), attention_mask=torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 7]))
    return transformers.BertForSequenceClassification(config), inputs


def _vit():
    config = transformers.ViTConfig(
        image_size=8,
        patch_size=4,
        num_channels=1,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=3,
    )
    return transformers.ViTForImageClassification(config), dict(pixel_values=torch.rand(3, 1, 8, 8))


def _gpt2():
    config = transformers.GPT2Config(vocab_size=60, n_embd=16, n_layer=2, n_head=2, n_positions=16, bos_token_id=0, eos_token_id=1)
    return transformers.GPT2LMHeadModel(config), dict(input_ids=torch.randint(1, 60, (3, 7)))


def _text_inputs():
    return dict(input_ids=torch.randint(2, 60, (3, 7)), attention_mask=torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 7]))


def _distilbert():
    config = transformers.DistilBertConfig(
        vocab_size=60, dim=16, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=16, num_labels=3
    )
    return transformers.DistilBertForSequenceClassification(config), _text_inputs()


def _albert():
    config = transformers.AlbertConfig(
        vocab_size=60,
        embedding_size=8,
        hidden_size=16,
        num_hidden_layers=2,
        num_hidden_groups=2,  # two layers of their own (ALBERT shares one by default)
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    return transformers.AlbertForSequenceClassification(config), _text_inputs()


def _deberta_v2():
    config = transformers.DebertaV2Config(
        vocab_size=60,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        num_labels=3,
        initializer_range=0.3,  # logits of order one (the sample's noise is then visible in them)
    )
    return transformers.DebertaV2ForSequenceClassification(config), _text_inputs()


def _llama():
    config = transformers.LlamaConfig(
        vocab_size=60,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        bos_token_id=0,
        eos_token_id=1,
    )
    return transformers.LlamaForCausalLM(config), dict(input_ids=torch.randint(2, 60, (3, 7)))


FAMILIES = {
    "bert": _bert,
    "vit": _vit,
    "gpt2": _gpt2,
    "distilbert": _distilbert,
    "albert": _albert,
    "deberta_v2": _deberta_v2,
    "llama": _llama,
}
AUTO = {"vit": "AutoModelForImageClassification", "gpt2": "AutoModelForCausalLM", "llama": "AutoModelForCausalLM"}


def _converted(family):
    """A model converted the thesis's way (kernel attention, then SGPA, both calibrated on its inputs)
    whose every parameter is moved off its initial value, so that nothing reloads by chance."""
    torch.manual_seed(0)
    model, inputs = FAMILIES[family]()
    model.eval()
    gpytorch_sgpa.convert(model, attention="kernel", calibration_inputs=inputs)
    gpytorch_sgpa.convert(model, num_global=4, calibration_inputs=inputs)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model, inputs


def _outputs(model, inputs):
    """``(posterior-mean logits, logits of a sample under seed 3)``."""
    with torch.no_grad():
        with posterior_mean():
            mean = model(**inputs).logits
        torch.manual_seed(3)
        sample = model(**inputs).logits
    return mean, sample


def _quiet():
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_and_from_pretrained_give_the_saved_model(family, tmp_path):
    _quiet()
    model, inputs = _converted(family)
    mean, sample = _outputs(model, inputs)
    assert (sample - mean).abs().max() > 1e-3  # the sample is not the mean: comparing samples tests the noise path
    model.save_pretrained(tmp_path)
    reloaded = gpytorch_sgpa.from_pretrained(type(model), tmp_path)
    assert not reloaded.training and type(reloaded) is type(model)
    assert sum(isinstance(m, SGPAttention) for m in reloaded.modules()) == 2
    reloaded_mean, reloaded_sample = _outputs(reloaded, inputs)
    assert torch.equal(reloaded_mean, mean) and torch.equal(reloaded_sample, sample)
    saved = model.state_dict()
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    # saved again from the reloaded model, and reloaded through the Auto class
    reloaded.save_pretrained(tmp_path / "again")
    auto = AUTO.get(family, "AutoModelForSequenceClassification")
    again = gpytorch_sgpa.from_pretrained(getattr(transformers, auto), tmp_path / "again")
    assert torch.equal(_outputs(again, inputs)[1], sample)


@pytest.mark.parametrize("family", FAMILIES)
def test_torch_save_of_the_whole_model(family):
    """Also the attention maps: ``convert`` puts transformers' recording hooks on the new modules,
    which must pickle (transformers' own hooks, installed at the first ``output_attentions=True`` of
    any model, do not: save before asking for attention maps, for converted and plain models alike)."""
    model, inputs = _converted(family)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    mean, sample = _outputs(model, inputs)
    loaded_mean, loaded_sample = _outputs(loaded, inputs)
    assert torch.equal(loaded_mean, mean) and torch.equal(loaded_sample, sample)
    with torch.no_grad(), posterior_mean():
        attentions = loaded(**inputs, output_attentions=True).attentions
        expected = model(**inputs, output_attentions=True).attentions
    assert len(attentions) == len(expected) == (0 if family == "gpt2" else 2)  # GPT-2 under sdpa records none
    assert all(torch.equal(a, b) for a, b in zip(attentions, expected))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn_implementation", [None, "sdpa", "eager"])
def test_the_unconverted_class_refuses_the_checkpoint_naming_the_loader(family, attn_implementation, tmp_path):
    """Also when the attention implementation is chosen at load (which replaces the one the checkpoint names),
    through the model's class or its ``AutoModel*`` class, with transformers' messages silenced."""
    _quiet()
    model, inputs = _converted(family)
    model.save_pretrained(tmp_path)
    chosen = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    auto = AUTO.get(family, "AutoModelForSequenceClassification")
    refusal = r"gpytorch_sgpa\.from_pretrained"
    if family == "deberta_v2" and attn_implementation == "sdpa":  # transformers refuses sdpa for DeBERTa-v2 itself, as loudly
        refusal = "does not support an attention implementation through torch.nn.functional.scaled_dot_product_attention"
    for model_class in (type(model), getattr(transformers, auto)):
        with pytest.raises(ValueError, match=refusal):
            model_class.from_pretrained(tmp_path, **chosen)


def test_without_the_package_imported_transformers_refuses_the_checkpoint(tmp_path):
    """In a fresh process that never imports gpytorch_sgpa the checkpoint's attention implementation
    is unknown to transformers, which raises instead of loading softmax attention."""
    import subprocess
    import sys

    _quiet()
    model, _ = _converted("bert")
    model.save_pretrained(tmp_path)
    code = (
        "import sys, transformers\n"
        f"try:\n    transformers.BertForSequenceClassification.from_pretrained({str(tmp_path)!r})\n"
        "except ValueError as error:\n    sys.exit(0 if 'gpytorch_sgpa' in str(error) else 2)\n"
        "sys.exit(1)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_from_pretrained_of_an_unconverted_checkpoint_raises(tmp_path):
    _quiet()
    model, _ = _bert()
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no SGPA conversion.*BertForSequenceClassification.from_pretrained"):
        gpytorch_sgpa.from_pretrained(transformers.BertForSequenceClassification, tmp_path)


def test_conversions_that_cannot_be_replayed_raise_at_load(tmp_path):
    _quiet()
    torch.manual_seed(0)
    model, _ = _bert()
    gpytorch_sgpa.convert(model.bert.encoder, attention="kernel")  # below the transformers model
    model.save_pretrained(tmp_path / "part")
    with pytest.raises(ValueError, match="convert the whole model"):
        gpytorch_sgpa.from_pretrained(type(model), tmp_path / "part")
    model, _ = _bert(layers=1)  # one layer: a kernel object given to convert is shared by all layers
    kernel = gpytorch_sgpa.make_attention_kernel("rbf", 8, 2)
    gpytorch_sgpa.convert(model, attention="kernel", kernel=kernel)
    model.save_pretrained(tmp_path / "object")
    with pytest.raises(ValueError, match=r"\['kernel'\].*kernel='rbf'"):
        gpytorch_sgpa.from_pretrained(type(model), tmp_path / "object")


def test_a_float64_model_reloads_in_float64(tmp_path):
    _quiet()
    model, inputs = _converted("bert")
    model.double()
    model.save_pretrained(tmp_path)
    reloaded = gpytorch_sgpa.from_pretrained(type(model), tmp_path)
    assert {p.dtype for p in reloaded.parameters()} == {torch.float64}
    assert torch.equal(_outputs(reloaded, inputs)[1], _outputs(model, inputs)[1])
