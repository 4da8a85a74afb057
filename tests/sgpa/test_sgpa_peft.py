"""LoRA (``peft``) on a converted BERT: the converted projections are the targets, SGPA's own
parameters train beside the adapter, the global keys use the adapted ``W_qk`` (so
``merge_and_unload`` keeps the function) and the adapter saved with SGPA's parameters reloads the
function exactly."""

import copy
import importlib.util

import pytest
import torch
import torch.nn.functional as F

import gpytorch_sgpa
from gpytorch_sgpa import SGPAttention, posterior_mean
from gpytorch_sgpa.lora import get_peft_model, load_adapter, lora_target_modules, save_adapter, sgpa_parameter_names

needs_peft = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None or importlib.util.find_spec("transformers") is None,
    reason='needs peft and transformers: pip install "probseq[zoo]"',
)

# peft reads transformers' deprecated is_gradient_checkpointing alias when it wraps a model (peft's call, not ours)
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

LAYERS = ("bert.encoder.layer.0.attention.self.attention", "bert.encoder.layer.1.attention.self.attention")


def _converted():
    """A small random BERT converted to SGPA (kernel attention first), parameters moved off their initial values,
    with the thesis's posterior mean (gate ``γ = 1``), in which the global keys enter the mean, and a
    classifier scaled to logits of order one."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=60,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=3,
    )
    model = transformers.BertForSequenceClassification(config).eval()
    inputs = dict(input_ids=torch.randint(1, 60, (3, 7)), attention_mask=torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 7]))
    gpytorch_sgpa.convert(model, attention="kernel", calibration_inputs=inputs)
    gpytorch_sgpa.convert(model, num_global=4, calibration_inputs=inputs)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
        for name in LAYERS:
            model.get_submodule(name).global_mean_gate.fill_(1.0)
        model.classifier.weight.mul_(50.0)
    return model, inputs


def _randomise_lora(peft_model):
    """LoRA's ``B`` starts at zero (the adapter is the identity); give every adapter a random update."""
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                parameter.copy_(0.3 * torch.randn_like(parameter))


def _mean_logits(model, inputs):
    with torch.no_grad(), posterior_mean():
        return model(**inputs).logits


def _adapted(model):
    """``model`` with LoRA (r = 2), its LoRA weights and SGPA parameters moved off their initial values, in eval mode."""
    peft_model = get_peft_model(model, r=2, lora_alpha=4)
    _randomise_lora(peft_model)
    with torch.no_grad():
        for name in sgpa_parameter_names(peft_model):
            parameter = peft_model.get_parameter(name)
            parameter.add_(0.1 * torch.randn_like(parameter))
    return peft_model.eval()


def test_a_missing_peft_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "peft", None)
    with pytest.raises(ModuleNotFoundError, match=r'pip install "probseq\[zoo\]"'):
        get_peft_model(torch.nn.Linear(2, 2))


@needs_peft
def test_lora_trains_the_adapter_and_the_sgpa_parameters_only():
    model, inputs = _converted()
    targets = lora_target_modules(model)
    assert targets == [f"{layer}.{projection}" for layer in LAYERS for projection in ("qk_proj", "v_proj")]
    assert gpytorch_sgpa.lora_target_modules is lora_target_modules
    own = sgpa_parameter_names(model)
    assert set(own) == {
        f"{layer}.{name}"
        for layer in LAYERS
        for name in (
            "global_inducing_inputs",
            "global_values",
            "global_chol_lower",
            "global_chol_log_diag",
            "global_mean_gate",
            "kernel.raw_outputscale",
            "kernel.base_kernel.raw_lengthscale",
        )
    }
    peft_model = get_peft_model(model, r=2, lora_alpha=4)
    prefix = "base_model.model."
    trainable = {name for name, p in peft_model.named_parameters() if p.requires_grad}
    lora = {name for name in trainable if ".lora_" in name}
    assert len(lora) == 2 * len(targets)  # lora_A and lora_B of each target
    assert trainable == lora | {prefix + name for name in own}
    before = {name: p.detach().clone() for name, p in peft_model.named_parameters()}
    optimizer = torch.optim.Adam([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    peft_model.train()
    for _ in range(2):  # B = 0 at the start: lora_A gets gradients from the second step on
        optimizer.zero_grad()
        logits = peft_model(**inputs).logits
        loss = F.cross_entropy(logits, torch.tensor([0, 1, 2])) + gpytorch_sgpa.kl_divergence(peft_model) / 100
        loss.backward()
        optimizer.step()
    moved = {name for name, p in peft_model.named_parameters() if not torch.equal(p.detach(), before[name])}
    assert moved == trainable  # every adapter and SGPA parameter trains, nothing else


@needs_peft
def test_global_keys_follow_the_lora_update():
    model, _ = _converted()
    peft_model = get_peft_model(model, r=2, lora_alpha=4)
    _randomise_lora(peft_model)
    for name in LAYERS:
        layer = peft_model.get_submodule("base_model.model." + name)
        lora = layer.qk_proj
        adapted = lora.base_layer.weight + 2.0 * lora.lora_B["default"].weight @ lora.lora_A["default"].weight
        heads, e = layer.num_heads, layer.head_dim
        expected = torch.einsum("hmd,hed->hme", layer.global_inducing_inputs, adapted.view(heads, e, -1))
        keys = layer.global_keys()
        torch.testing.assert_close(keys, expected, rtol=1e-5, atol=1e-6)
        frozen = torch.einsum("hmd,hed->hme", layer.global_inducing_inputs, lora.base_layer.weight.view(heads, e, -1))
        assert (keys - frozen).abs().max() > 1e-2  # the update is not negligible


@needs_peft
def test_merge_and_unload_and_disabling_the_adapter_keep_the_function():
    model, inputs = _converted()
    base_logits = _mean_logits(model, inputs)
    peft_model = get_peft_model(model, r=2, lora_alpha=4)
    _randomise_lora(peft_model)
    peft_model.eval()
    adapted = _mean_logits(peft_model, inputs)
    assert (adapted - base_logits).abs().max() > 1e-2
    with peft_model.disable_adapter():  # the cached global factors of the adapted keys must not be reused
        torch.testing.assert_close(_mean_logits(peft_model, inputs), base_logits, rtol=0, atol=1e-6)
    merged = peft_model.merge_and_unload()
    assert all(type(merged.get_submodule(name).qk_proj) is torch.nn.Linear for name in LAYERS)
    torch.testing.assert_close(_mean_logits(merged, inputs), adapted, rtol=0, atol=1e-6)


@needs_peft
def test_save_and_load_adapter_restore_the_function(tmp_path):
    import peft

    model, inputs = _converted()
    fresh = copy.deepcopy(model)
    untouched = copy.deepcopy(model)
    peft_model = _adapted(model)
    expected = _mean_logits(peft_model, inputs)
    torch.manual_seed(3)
    expected_sample = peft_model(**inputs).logits.detach()
    save_adapter(peft_model, tmp_path)
    reloaded = load_adapter(fresh, tmp_path)
    assert isinstance(reloaded.get_submodule("base_model.model." + LAYERS[0]), SGPAttention)
    assert not any(p.requires_grad for p in reloaded.parameters())
    assert torch.equal(_mean_logits(reloaded, inputs), expected)
    torch.manual_seed(3)
    assert torch.equal(reloaded(**inputs).logits.detach(), expected_sample)
    adapter_only = peft.PeftModel.from_pretrained(untouched, tmp_path).eval()  # peft's own loader: no SGPA parameters
    assert (_mean_logits(adapter_only, inputs) - expected).abs().max() > 1e-3


@needs_peft
def test_sgpa_trainer_saves_sgpa_parameters_beside_the_adapter(tmp_path):
    """Trainer.save_model of a peft model writes the adapter only; SGPATrainer adds SGPA's parameters, so that
    load_adapter restores the function (the check fails without them: load_adapter refuses the folder)."""
    import transformers

    from gpytorch_sgpa import SGPAELBO
    from gpytorch_sgpa.trainer import SGPATrainer

    model, inputs = _converted()
    fresh = copy.deepcopy(model)
    peft_model = _adapted(model)
    expected = _mean_logits(peft_model, inputs)
    arguments = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), report_to=[], use_cpu=True)
    trainer = SGPATrainer(model=peft_model, args=arguments, elbo=SGPAELBO(peft_model, num_data=10))
    trainer.save_model(str(tmp_path / "saved"))
    reloaded = load_adapter(fresh, tmp_path / "saved")
    assert torch.equal(_mean_logits(reloaded, inputs), expected)
