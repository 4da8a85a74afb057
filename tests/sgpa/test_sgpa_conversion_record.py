"""The record of a conversion in a ``transformers`` model's configuration (``config.sgpa``): each conversion with
its keyword arguments and replaced modules, the refusing implementations, the names of keyword arguments a config
cannot hold, and what an adapter keeps and drops of its family's attention (DeBERTa-v2's ``notes``), written by
``save_pretrained``."""

import json

import pytest
import torch

import gpytorch_sgpa
from gpytorch_sgpa import adapters
from gpytorch_sgpa.conversion_record import ATTN_IMPLEMENTATION, EXPERTS_IMPLEMENTATION

transformers = pytest.importorskip("transformers")


def _config(cls, **options):
    return getattr(transformers, cls)(
        vocab_size=60, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32, num_labels=3, **options
    )


def test_each_conversion_is_recorded_with_its_arguments_and_modules():
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(_config("BertConfig"))
    implementation = model.config._attn_implementation
    gpytorch_sgpa.convert(model, attention="kernel", kernel=gpytorch_sgpa.make_attention_kernel("rbf", 8, 2))
    gpytorch_sgpa.convert(model, num_global=4)
    record = model.config.sgpa
    modules = [f"bert.encoder.layer.{i}.attention.self" for i in range(2)]
    assert record["attn_implementation"] == implementation
    assert record["conversions"] == [
        {"attention": "kernel", "kwargs": {}, "modules": modules, "unsaved_kwargs": ["kernel"]},
        {"attention": "sgpa", "kwargs": {"num_global": 4}, "modules": modules},
    ]
    assert model.config.attn_implementation == ATTN_IMPLEMENTATION
    assert model.config.experts_implementation == EXPERTS_IMPLEMENTATION


def test_a_deberta_v2_record_says_what_the_conversion_keeps(tmp_path):
    """DeBERTa-v2's relative-position terms are dropped: each entry's notes say so, in the saved config.json too."""
    torch.manual_seed(0)
    config = _config("DebertaV2Config", relative_attention=True, pos_att_type=["p2c", "c2p"], max_position_embeddings=16)
    model = transformers.DebertaV2ForSequenceClassification(config)
    gpytorch_sgpa.convert(model, attention="kernel")
    gpytorch_sgpa.convert(model, num_global=4)
    assert [entry["notes"] for entry in model.config.sgpa["conversions"]] == [[adapters.DEBERTA_V2_NOTE]] * 2
    assert "relative position" in adapters.DEBERTA_V2_NOTE and "rel_embeddings" in adapters.DEBERTA_V2_NOTE
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["sgpa"]["conversions"][1]["notes"] == [adapters.DEBERTA_V2_NOTE]
