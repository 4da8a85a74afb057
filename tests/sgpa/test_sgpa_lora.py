"""LoRA (``peft``) on a converted BERT and a Llama-style decoder: the converted projections are the targets, SGPA's own
parameters train beside the adapter, the global keys use the adapted ``W_qk`` (so
``merge_and_unload`` keeps the function) and the adapter saved with SGPA's parameters reloads the
function exactly."""

import copy
import importlib.util
import math

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


def _llama_classifier():
    """A small Llama sequence classifier (grouped-query attention: 4 query heads, 2 key/value heads) converted to
    SGPA the thesis's way, parameters moved off their initial values, the mean gate at 1 (the global keys enter the
    mean), with a batch of right-padded sentences."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=60,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16,
        pad_token_id=0,
        num_labels=3,
    )
    model = transformers.LlamaForSequenceClassification(config).eval()
    inputs = dict(input_ids=torch.randint(1, 60, (4, 7)), attention_mask=torch.tensor([[1] * 7, [1] * 5 + [0] * 2, [1] * 7, [1] * 6 + [0]]))
    inputs["input_ids"][inputs["attention_mask"] == 0] = 0
    gpytorch_sgpa.convert(model, attention="kernel", calibration_inputs=inputs)
    gpytorch_sgpa.convert(model, num_global=4, calibration_inputs=inputs)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
        for index in range(2):
            model.model.layers[index].self_attn.attention.global_mean_gate.fill_(1.0)
        model.score.weight.mul_(20.0)
    return model, inputs


@needs_peft
def test_lora_on_a_llama_style_decoder_rotates_the_adapted_queries():
    """LoRA on the Llama decoder's qk_proj and v_proj: the rotary embeddings act on the adapted queries (the model
    with the adapter merged into W_qk computes the same logits), and disabling the adapter gives the base model's."""
    model, inputs = _llama_classifier()
    base_logits = _mean_logits(model, inputs)
    peft_model = get_peft_model(model, r=2, lora_alpha=4)
    assert lora_target_modules(model) == [f"model.layers.{i}.self_attn.attention.{p}" for i in range(2) for p in ("qk_proj", "v_proj")]
    _randomise_lora(peft_model)
    peft_model.eval()
    adapted = _mean_logits(peft_model, inputs)
    assert (adapted - base_logits).abs().max() > 1e-2
    with peft_model.disable_adapter():  # float32 logits of order 10: agreement to rounding
        torch.testing.assert_close(_mean_logits(peft_model, inputs), base_logits, rtol=1e-5, atol=1e-5)
    merged = peft_model.merge_and_unload()
    torch.testing.assert_close(_mean_logits(merged, inputs), adapted, rtol=1e-5, atol=1e-5)


@needs_peft
def test_sgpa_trainer_trains_lora_on_a_llama_style_decoder(tmp_path):
    """One SGPATrainer step on LoRA + SGPA: the LoRA factors and SGPA's parameters move, the frozen weights do not,
    and the training loss is finite."""
    import transformers

    from gpytorch_sgpa import SGPAELBO
    from gpytorch_sgpa.trainer import SGPATrainer

    model, inputs = _llama_classifier()
    peft_model = get_peft_model(model, r=2, lora_alpha=4)
    rows = [{key: value[i] for key, value in inputs.items()} | {"labels": torch.tensor(i % 3)} for i in range(4)]
    before = {name: p.detach().clone() for name, p in peft_model.named_parameters()}
    arguments = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        report_to=[],
        use_cpu=True,
        max_steps=1,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        save_strategy="no",
    )
    trainer = SGPATrainer(model=peft_model, args=arguments, train_dataset=rows, elbo=SGPAELBO(peft_model, num_data=4))
    result = trainer.train()
    assert math.isfinite(result.training_loss)
    moved = {name for name, p in peft_model.named_parameters() if not torch.equal(p.detach(), before[name])}
    trainable = {name for name, p in peft_model.named_parameters() if p.requires_grad}
    assert {name for name in trainable if "lora_B" in name or "global_inducing_inputs" in name} <= moved <= trainable


@needs_peft
def test_the_llama_lora_benchmark_compares_lora_temperature_and_sgpa_at_a_tiny_size(tmp_path, monkeypatch, capsys):
    """``benchmarks/sgpa_llama_lora.py`` at its smallest setting on a fake movie-review archive: every method gets
    accuracy, NLL and ECE, the temperature-scaled ones a fitted temperature; the table and the paired rows are printed."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # also under --import-mode=importlib (CI's zoo check)
    from vader_fixtures import fake_vader_sdist

    words = ["good", "bad", "film", "plot", "actors", "boring", "great", "the", "a", "is"]
    generator = torch.Generator().manual_seed(0)
    corpora = {
        corpus: [
            (1.5 if i % 2 else -1.5, " ".join(words[p] for p in torch.randint(0, 10, (6,), generator=generator).tolist()))
            for i in range(count)
        ]
        for corpus, count in (("movie", 100), ("nyt", 10))
    }
    fake_vader_sdist(tmp_path / "vader.tar.gz", corpora)
    monkeypatch.setenv("PROBSEQ_VADER_ARCHIVE", str(tmp_path / "vader.tar.gz"))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "benchmarks"))
    benchmark = pytest.importorskip("sgpa_llama_lora")
    tiny = "--seeds 0 --train 40 --val 20 --test 20 --hidden 16 --layers 1 --epochs 1 --fine-tune 1 --num-samples 2 --calibration 8"
    per_seed = benchmark.main([*tiny.split(), "--lora-rank", "2", "--num-global", "4"])
    rows = per_seed[0]
    assert list(rows) == list(benchmark.METHODS)
    for row in rows.values():
        assert 0 <= row["accuracy"] <= 1 and row["nll"] > 0 and 0 <= row["ece"] <= 1
    for method in ("LoRA + temperature", "SGPA + LoRA + temperature"):
        assert math.isfinite(rows[method]["temperature"]) and rows[method]["temperature"] > 0
    printed = capsys.readouterr().out
    assert "| SGPA + LoRA |" in printed and "| SGPA + LoRA minus LoRA + temperature |" in printed
    assert "| SGPA + LoRA + temperature minus LoRA + temperature |" in printed
