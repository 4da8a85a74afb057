"""``convert`` on the self-attention of Hugging Face BERT, ViT, GPT-2, DistilBERT, ALBERT, DeBERTa-v2 and
Llama-style (Llama, Mistral, Qwen2) models, timm's ``Attention``, ``nn.Transformer`` and a user's own type
(``register_adapter``): kernel outputs against a computation by hand from the original weights (rotary
embeddings and grouped-query heads by transformers' own functions), masks, causality, kernel → SGPA keeping the
function, the key/value cache of ``generate``, attention maps and one ELBO step per family."""

import copy
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gpytorch_sgpa
from gpytorch_sgpa import adapters, convert, kl_divergence, posterior_mean, predict_proba, register_adapter


def _transformers():
    """The ``transformers`` module (the ``zoo`` extra); the test skips without it."""
    return pytest.importorskip("transformers")


def _bert(implementation="sdpa", cls="BertForSequenceClassification", config_cls="BertConfig", seed=0, **options):
    transformers = _transformers()
    torch.manual_seed(seed)
    options = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, **options}
    config = getattr(transformers, config_cls)(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=100, num_labels=3, **options
    )
    config._attn_implementation = implementation
    return getattr(transformers, cls)(config)


def _vit(seed=0):
    torch.manual_seed(seed)
    config = _transformers().ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=8,
        patch_size=4,
        num_channels=1,
        num_labels=3,
    )
    return _transformers().ViTForImageClassification(config)


def _gpt2(implementation="sdpa", seed=0, **options):
    torch.manual_seed(seed)
    options = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, **options}
    config = _transformers().GPT2Config(
        n_embd=32, n_layer=2, n_head=4, vocab_size=50, n_positions=32, bos_token_id=0, eos_token_id=1, pad_token_id=1, **options
    )
    config._attn_implementation = implementation
    return _transformers().GPT2LMHeadModel(config)


def _kernel_by_hand(x, weight_q, weight_k, weight_v, bias_v, num_heads, allowed):
    """``concat_h K_h v_h`` with the default kernel as initialised (RBF, lengthscale ``sqrt(e)``,
    output scale 1), ``W_qk = (W_q + W_k) / 2`` and ``v = x W_vᵀ + b_v``; ``allowed``: bool
    ``(B, L, L)`` or ``None``."""
    batch, length, d_model = x.shape
    e = d_model // num_heads
    q = (x @ (0.5 * (weight_q + weight_k)).T).view(batch, length, num_heads, e).transpose(1, 2)
    v = (x @ weight_v.T + (0 if bias_v is None else bias_v)).view(batch, length, num_heads, e).transpose(1, 2)
    gram = torch.exp(-0.5 * (q[:, :, :, None, :] - q[:, :, None, :, :]).square().sum(-1) / e)
    if allowed is not None:
        gram = gram * allowed[:, None]
    return (gram @ v).transpose(1, 2).reshape(batch, length, d_model), gram


def _capture(module):
    """The positional input and the output of every call of ``module``."""
    calls = []
    module.register_forward_hook(lambda m, args, output: calls.append((args[0].detach(), output)))
    return calls


# --------------------------------------------------------------------------- kernel attention against a hand computation
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_bert_kernel_conversion_matches_kernel_attention_by_hand(implementation):
    """Through the model's own forward (its padding mask as sdpa's bool or eager's additive float
    mask): the converted self-attention computes kernel attention from the original W_q, W_k, W_v
    and value bias, and output_attentions returns that Gram matrix."""
    model = _bert(implementation).double().eval()
    original = copy.deepcopy(model.bert.encoder.layer[1].attention.self)
    convert(model, attention="kernel")
    adapter = model.bert.encoder.layer[1].attention.self
    assert isinstance(adapter, adapters.BertSelfAttentionAdapter)
    calls = _capture(adapter)
    ids = torch.randint(2, 100, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 5:] = 0
    with torch.no_grad():
        output = model(ids, attention_mask=mask, output_attentions=True)
    ((x, (context, weights)),) = calls
    allowed = mask.bool()[:, None, :].expand(3, 6, 6)
    expected, gram = _kernel_by_hand(x, original.query.weight, original.key.weight, original.value.weight, original.value.bias, 4, allowed)
    valid = mask.bool()
    torch.testing.assert_close(context[valid], expected[valid], rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(weights, gram, rtol=1e-8, atol=1e-8)
    assert len(output.attentions) == 2 and output.attentions[1] is weights


def test_vit_and_gpt2_kernel_conversion_keep_the_output_projection():
    """ViT's o_proj and GPT-2's c_proj (a Conv1D, weights stored transposed) stay after the heads;
    GPT-2's fused c_attn is split into W_q, W_k, W_v (its causal structure in the hand computation)."""
    vit = _vit().double().eval()
    original = copy.deepcopy(vit.vit.layers[0].attention)
    convert(vit, attention="kernel")
    calls = _capture(vit.vit.layers[0].attention)
    with torch.no_grad():
        vit(torch.randn(2, 1, 8, 8, dtype=torch.float64))
    ((x, (output, _)),) = calls
    context, _ = _kernel_by_hand(x, original.q_proj.weight, original.k_proj.weight, original.v_proj.weight, original.v_proj.bias, 4, None)
    torch.testing.assert_close(output, original.o_proj(context), rtol=1e-8, atol=1e-8)

    gpt2 = _gpt2().double().eval()
    original = copy.deepcopy(gpt2.transformer.h[1].attn)
    convert(gpt2, attention="kernel")
    calls = _capture(gpt2.transformer.h[1].attn)
    with torch.no_grad():
        gpt2(torch.randint(2, 50, (2, 5)))
    ((x, (output, _)),) = calls
    weight_q, weight_k, weight_v = original.c_attn.weight.T.split(32)
    causal = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 5, 5)
    context, _ = _kernel_by_hand(x, weight_q, weight_k, weight_v, original.c_attn.bias[64:], 4, causal)
    torch.testing.assert_close(output, original.c_proj(context), rtol=1e-8, atol=1e-8)


def test_roberta_converts_like_bert():
    model = _bert(cls="RobertaForSequenceClassification", config_cls="RobertaConfig")
    convert(model, attention="kernel")
    layers = [m for m in model.modules() if isinstance(m, adapters.BertSelfAttentionAdapter)]
    assert len(layers) == 2
    assert model(torch.randint(2, 100, (2, 5))).logits.shape == (2, 3)


def test_kernel_then_sgpa_posterior_mean_equals_the_kernel_model():
    """The thesis's path on a Hugging Face model: kernel attention, then DSVGP from it; with the
    noise at zero the DSVGP sample is K_qk v, the kernel model's output."""
    model = _bert().double().eval()
    convert(model, attention="kernel")
    ids = torch.randint(2, 100, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
    convert(model, attention="sgpa-dsvgp", num_global=4)
    layers = [m for m in model.modules() if isinstance(m, gpytorch_sgpa.SGPAttention)]
    assert len(layers) == 2 and layers[0].v_proj.bias is not None
    with torch.no_grad():
        sampled = model(ids, attention_mask=mask).logits
        with posterior_mean():
            collapsed = model(ids, attention_mask=mask).logits
    assert (sampled - expected).abs().max() > 1e-4
    torch.testing.assert_close(collapsed, expected, rtol=1e-8, atol=1e-8)


# --------------------------------------------------------------------------- masks and causality
def test_padded_tokens_do_not_reach_the_other_positions():
    """Same noise draws (same seed), different contents of the padded tokens: the SGPA model's
    hidden states at the other positions do not change, those at the padded ones do."""
    model = convert(_bert(cls="BertModel").double(), num_global=4).eval()
    ids = torch.randint(2, 100, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    changed = ids.clone()
    changed[1, 4:] = torch.randint(2, 100, (3,))
    with torch.no_grad():
        torch.manual_seed(1)
        first = model(ids, attention_mask=mask).last_hidden_state
        torch.manual_seed(1)
        second = model(changed, attention_mask=mask).last_hidden_state
    valid = mask.bool()
    torch.testing.assert_close(second[valid], first[valid], rtol=1e-9, atol=1e-9)
    assert (second[~valid] - first[~valid]).abs().max() > 1e-3


@pytest.mark.parametrize("sampling", [False, True])
def test_gpt2_output_at_t_does_not_depend_on_later_tokens(sampling):
    model = convert(_gpt2().double(), num_global=4).eval()
    ids = torch.randint(2, 50, (2, 8))
    later = ids.clone()
    later[:, 5:] = torch.randint(2, 50, (2, 3))
    with torch.no_grad():
        if sampling:
            torch.manual_seed(1)
            first = model(ids).logits
            torch.manual_seed(1)
            second = model(later).logits
        else:
            with posterior_mean():
                first, second = model(ids).logits, model(later).logits
    torch.testing.assert_close(second[:, :5], first[:, :5], rtol=1e-9, atol=1e-9)
    assert (second[:, 5:] - first[:, 5:]).abs().max() > 1e-4


def test_masks_that_are_not_padding_raise():
    model = convert(_bert(cls="BertModel"), attention="kernel")
    adapter = model.encoder.layer[0].attention.self
    x = torch.randn(2, 5, 32)
    band = torch.ones(5, 5, dtype=torch.bool).triu(-1).tril(1).expand(2, 1, 5, 5)  # a sliding window
    with pytest.raises(ValueError, match="padding mask"):
        adapter(x, attention_mask=band)
    causal = torch.ones(5, 5, dtype=torch.bool).tril().expand(2, 1, 5, 5)  # causal mask, non-causal layer
    with pytest.raises(ValueError, match="causal=True"):
        adapter(x, attention_mask=causal)
    with pytest.raises(ValueError, match="additive biases"):
        adapter(x, attention_mask=torch.full((2, 1, 5, 5), -0.5))
    with pytest.raises(ValueError, match="encoder_hidden_states"):
        adapter(x, encoder_hidden_states=x)


# --------------------------------------------------------------------------- generation with the key/value cache
@pytest.mark.parametrize(
    "attention, kwargs", [("kernel", {}), ("sgpa", {"num_global": 4}), ("sgpa", {"num_global": 4, "sampler": "diagonal"})]
)
def test_gpt2_generate_with_cache_equals_without(attention, kwargs, monkeypatch):
    """Inside posterior_mean, greedy generation with the cache (new positions from the cached
    projections) gives the tokens and scores of generation without it (whole prefix every step):
    for a left-padded batch (the model passes a padding mask at every step) and an unpadded one
    (no mask: the adapter builds the causal structure of the new positions itself)."""
    model = convert(_gpt2().double(), attention=attention, **kwargs).eval()
    rows = []
    original = adapters._cached_rows
    monkeypatch.setattr(adapters, "_cached_rows", lambda *args: rows.append(1) or original(*args))
    prompt = torch.randint(2, 50, (2, 4))
    padded = torch.ones(2, 4, dtype=torch.long)
    padded[1, :2] = 0
    prompt[1, :2] = 1
    for mask in (padded, torch.ones(2, 4, dtype=torch.long)):
        results = {}
        with torch.no_grad(), posterior_mean():
            for use_cache in (True, False):
                results[use_cache] = model.generate(
                    prompt,
                    attention_mask=mask,
                    max_new_tokens=6,
                    do_sample=False,
                    use_cache=use_cache,
                    output_scores=True,
                    return_dict_in_generate=True,
                )
        assert torch.equal(results[True].sequences, results[False].sequences)
        for cached, uncached in zip(results[True].scores, results[False].scores):
            torch.testing.assert_close(cached, uncached, rtol=1e-9, atol=1e-9)
    assert len(rows) == 2 * 2 * 5  # two prompts, two layers, five steps after the prompt: the cached path ran
    with torch.no_grad(), posterior_mean():  # beam search reorders the cache between steps
        beams = [model.generate(prompt, max_new_tokens=4, num_beams=3, do_sample=False, use_cache=use_cache) for use_cache in (True, False)]
    assert torch.equal(beams[0], beams[1])


def test_gpt2_left_padding_equals_the_unpadded_sequence():
    """A left-padded sequence (with its position ids) gives the logits of the same tokens alone:
    the padded keys are out of the causal layers' conditioning set."""
    model = convert(_gpt2().double(), num_global=4).eval()
    ids = torch.randint(2, 50, (1, 5))
    padded = torch.cat([torch.ones(1, 2, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad(), posterior_mean():
        alone = model(ids).logits
        together = model(padded, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(together[:, 2:], alone, rtol=1e-9, atol=1e-9)


def test_gpt2_generate_samples_with_the_cache():
    model = convert(_gpt2(), num_global=4).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        tokens = model.generate(torch.randint(2, 50, (2, 3)), max_new_tokens=4, do_sample=True, use_cache=True)
    assert tokens.shape == (2, 7)


def test_standard_sgpa_refuses_the_cache_with_a_clear_error():
    model = convert(_gpt2(), attention="sgpa-standard", max_len=16).eval()
    with torch.no_grad(), pytest.raises(ValueError, match="use_cache=False"):
        model.generate(torch.randint(2, 50, (1, 3)), max_new_tokens=2, do_sample=False, use_cache=True)
    with torch.no_grad():
        assert model.generate(torch.randint(2, 50, (1, 3)), max_new_tokens=2, do_sample=False, use_cache=False).shape == (1, 5)


def test_decoders_with_cross_attention_keep_it_and_cache_their_self_attention():
    """GPT-2 and BERT built with cross-attention (attention dropout on, the models in evaluation
    mode): only the self-attention converts, causal, and starts in evaluation mode; the cross-
    attention modules stay; two chunks through the encoder-decoder cache give the logits of one
    uncached pass inside posterior_mean."""
    gpt2 = _gpt2(add_cross_attention=True, attn_pdrop=0.5).double().eval()
    bert = _bert(cls="BertLMHeadModel", is_decoder=True, add_cross_attention=True, attention_probs_dropout_prob=0.5).double().eval()
    cross = [gpt2.transformer.h[0].crossattention, bert.bert.encoder.layer[0].crossattention]
    convert(gpt2, num_global=4)
    convert(bert, num_global=4)
    assert cross == [gpt2.transformer.h[0].crossattention, bert.bert.encoder.layer[0].crossattention]
    assert type(cross[0]).__name__ == "GPT2Attention" and type(cross[1].self).__name__ == "BertCrossAttention"
    encoded = torch.randn(2, 5, 32, dtype=torch.float64)
    ids = torch.randint(2, 50, (2, 6))
    for model in (gpt2, bert):
        layers = [m for m in model.modules() if isinstance(m, adapters.SelfAttentionAdapter)]
        assert len(layers) == 2 and all(layer.causal and not layer.training for layer in layers)
        with torch.no_grad(), posterior_mean():
            whole = model(ids, encoder_hidden_states=encoded, use_cache=False).logits
            first = model(ids[:, :4], encoder_hidden_states=encoded, use_cache=True)
            assert type(first.cache).__name__ == "EncoderDecoderCache"
            second = model(ids[:, 4:], encoder_hidden_states=encoded, cache=first.cache, use_cache=True)
        torch.testing.assert_close(first.logits, whole[:, :4], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(second.logits, whole[:, 4:], rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- attention maps
def test_output_attentions_are_the_weights_of_the_posterior_mean():
    """DSVGP's posterior mean is W v with W = K_qk: the returned weights times the values give the
    context of the adapter inside posterior_mean; hooks installed before the conversion (a model
    that already returned attentions) are moved to the new modules."""
    model = _bert(cls="BertModel").double().eval()
    ids = torch.randint(2, 100, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 5 + [0]])
    with torch.no_grad():
        model(ids, attention_mask=mask, output_attentions=True)  # installs the recording hooks
    convert(model, attention="sgpa-dsvgp", num_global=4)
    adapter = model.encoder.layer[0].attention.self
    calls = _capture(adapter)
    with torch.no_grad(), posterior_mean():
        output = model(ids, attention_mask=mask, output_attentions=True)
    ((x, (context, weights)),) = calls
    assert len(output.attentions) == 2 and output.attentions[0] is weights
    layer = adapter.attention
    values = layer.split_heads(layer.v_proj(x))
    torch.testing.assert_close(context, layer.merge_heads(weights @ values), rtol=1e-8, atol=1e-8)
    assert torch.all(weights[1, :, :, 5] == 0)  # the padded key
    with torch.no_grad():
        assert model(ids, attention_mask=mask).attentions is None


# --------------------------------------------------------------------------- nn.Transformer
def test_transformer_encoder_decoder_converts_self_attention_and_keeps_cross_attention():
    torch.manual_seed(0)
    model = nn.Transformer(
        d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=2, dim_feedforward=32, dropout=0.0, batch_first=True
    )
    cross = [layer.multihead_attn for layer in model.decoder.layers]
    convert(model.eval(), num_global=4)
    for layer, original in zip(model.decoder.layers, cross):
        assert layer.multihead_attn is original and type(original) is nn.MultiheadAttention
        assert isinstance(layer.self_attn, gpytorch_sgpa.MultiheadSGPAttention) and layer.self_attn.causal
        assert not layer.self_attn.training  # the evaluation mode of the replaced module
    assert not model.encoder.layers[0].self_attn.causal
    src, tgt = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    later = tgt.clone()
    later[:, 3] = torch.randn(2, 16)
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    model.eval()
    with torch.no_grad(), posterior_mean():
        first = model(src, tgt, tgt_mask=mask)
        second = model(src, later, tgt_mask=mask)
    torch.testing.assert_close(second[:, :3], first[:, :3], rtol=1e-5, atol=1e-6)
    assert (second[:, 3] - first[:, 3]).abs().max() > 1e-3


# --------------------------------------------------------------------------- a user's own type, timm's layout
class TimmLikeAttention(nn.Module):
    """A stand-in with the attribute layout of timm's ``Attention`` (fused qkv, per-head q/k norms,
    output norm, projection), softmax attention in its own forward."""

    def __init__(self, dim=16, num_heads=2):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.norm = nn.Identity()
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x, attn_mask=None, is_causal=False):
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).reshape(batch, length, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return self.proj(out.transpose(1, 2).reshape(batch, length, dim))


class TinyViT(nn.Module):
    def __init__(self, attention_type=TimmLikeAttention):
        super().__init__()
        self.embed = nn.Linear(4, 16)
        self.blocks = nn.ModuleList([attention_type() for _ in range(2)])
        self.head = nn.Linear(16, 3)

    def forward(self, x, attn_mask=None):
        h = self.embed(x)
        for block in self.blocks:
            h = h + block(h, attn_mask=attn_mask)
        return self.head(h.mean(1))


def test_register_adapter_for_a_user_type(monkeypatch):
    """The timm adapter registered for a user's class: the kernel output is W_qk/W_v kernel attention
    followed by the module's own proj; a padding mask in timm's convention (bool, True = attend)."""
    monkeypatch.setattr(adapters, "_BY_TYPE", dict(adapters._BY_TYPE))
    torch.manual_seed(0)
    model = TinyViT().double()
    with pytest.raises(ValueError, match="no nn.MultiheadAttention"):
        convert(model)
    register_adapter(TimmLikeAttention, adapters.from_timm_attention)
    original = copy.deepcopy(model.blocks[0])
    convert(model, attention="kernel")
    assert all(isinstance(block, adapters.TimmAttentionAdapter) for block in model.blocks)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    keep = torch.ones(2, 5, dtype=torch.bool)
    keep[1, 3:] = False
    with torch.no_grad():
        output = model.blocks[0](x, attn_mask=keep[:, None, None, :])  # broadcast over the queries, as sdpa
        weight_q, weight_k, weight_v = original.qkv.weight.split(16)
        context, _ = _kernel_by_hand(x, weight_q, weight_k, weight_v, original.qkv.bias[32:], 2, keep[:, None, :].expand(2, 5, 5))
    valid = keep
    torch.testing.assert_close(output[valid], original.proj(context)[valid], rtol=1e-8, atol=1e-8)


def test_the_most_specific_registered_type_wins(monkeypatch):
    monkeypatch.setattr(adapters, "_BY_TYPE", dict(adapters._BY_TYPE))

    class Special(nn.MultiheadAttention):
        pass

    chosen = []
    register_adapter(Special, lambda module, attention, **kwargs: chosen.append(module) or nn.Identity())
    model = nn.ModuleDict({"plain": nn.MultiheadAttention(8, 2), "special": Special(8, 2)})
    convert(model, attention="kernel")
    assert isinstance(model["special"], nn.Identity) and len(chosen) == 1
    assert isinstance(model["plain"], gpytorch_sgpa.MultiheadSGPAttention)
    with pytest.raises(TypeError, match="nn.Module"):
        register_adapter(int, adapters.from_timm_attention)


def _vision_transformer_class(package: str):
    """``VisionTransformer`` of timm or torchvision; both import torchvision, whose wheels may not match
    the installed torch: then skipped with the reason, except in CI's check with a matching pair
    (``PROBSEQ_REQUIRE_TORCHVISION`` set), where it fails."""
    try:
        if package == "timm":
            from timm.models.vision_transformer import VisionTransformer
        else:
            from torchvision.models import VisionTransformer
    except Exception as error:
        if os.environ.get("PROBSEQ_REQUIRE_TORCHVISION"):
            raise
        pytest.skip(f"{package} does not import here: {type(error).__name__}: {error}")
    return VisionTransformer


def test_torchvision_vision_transformer_converts():
    """torchvision's ViT (its blocks call ``nn.MultiheadAttention`` with ``need_weights=False``):
    kernel attention by hand from the trained in-projection, then one ELBO step."""
    VisionTransformer = _vision_transformer_class("torchvision")
    torch.manual_seed(0)
    model = (
        VisionTransformer(image_size=8, patch_size=4, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32, num_classes=3).double().eval()
    )
    original = copy.deepcopy(model.encoder.layers[0].self_attention)
    convert(model, attention="kernel")
    calls = _capture(model.encoder.layers[0].self_attention)
    with torch.no_grad():
        model(torch.randn(2, 3, 8, 8, dtype=torch.float64))
    ((x, (output, weights)),) = calls
    weight_q, weight_k, weight_v = original.in_proj_weight.split(16)
    context, _ = _kernel_by_hand(x, weight_q, weight_k, weight_v, original.in_proj_bias[32:], 2, None)
    torch.testing.assert_close(output, original.out_proj(context), rtol=1e-8, atol=1e-8)
    assert weights is None
    images = torch.randn(4, 3, 8, 8, dtype=torch.float64)
    with torch.no_grad():  # torchvision starts its head at zero (no gradient reaches the encoder); a trained one is not
        model.heads.head.weight.normal_(std=0.1)
    _elbo_step(model, lambda: model(images), torch.tensor([0, 1, 2, 0]), (images,))


def test_timm_vision_transformer_converts():
    VisionTransformer = _vision_transformer_class("timm")
    torch.manual_seed(0)
    model = VisionTransformer(
        img_size=8, patch_size=4, in_chans=1, num_classes=3, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0
    ).double()
    original = copy.deepcopy(model.blocks[0].attn)
    convert(model, attention="kernel")
    calls = _capture(model.blocks[0].attn)
    with torch.no_grad():
        model(torch.randn(2, 1, 8, 8, dtype=torch.float64))
    ((x, output),) = calls
    weight_q, weight_k, weight_v = original.qkv.weight.split(16)
    bias_v = None if original.qkv.bias is None else original.qkv.bias[32:]
    context, _ = _kernel_by_hand(x, weight_q, weight_k, weight_v, bias_v, 2, None)
    torch.testing.assert_close(output, original.proj(original.norm(context)), rtol=1e-8, atol=1e-8)
    images = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    _elbo_step(model, lambda: model(images), torch.tensor([0, 1, 2, 0]), (images,))


# --------------------------------------------------------------------------- one ELBO step per family
def _elbo_step(model, forward, labels, inputs, kwargs=None):
    """Convert to SGPA, one step of ``cross-entropy + KL / N``: finite loss, the global inducing
    inputs of every layer moved; ``predict_proba`` gives distributions."""
    convert(model, num_global=4, variational_init_std=0.1)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    logits = forward()
    logits = logits if isinstance(logits, torch.Tensor) else logits.logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)) + kl_divergence(model) / 1000
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    global_names = [name for name, p in model.named_parameters() if "global_inducing_inputs" in name]
    assert global_names and all(not torch.equal(dict(model.named_parameters())[name], before[name]) for name in global_names)
    probabilities = predict_proba(model, *inputs, num_samples=3, **(kwargs or {}))
    torch.testing.assert_close(probabilities.sum(-1), torch.ones_like(probabilities[..., 0]), rtol=0, atol=1e-5)


def test_elbo_step_bert():
    model = _bert()
    ids, mask = torch.randint(2, 100, (4, 6)), torch.ones(4, 6, dtype=torch.long)
    mask[0, 4:] = 0
    _elbo_step(model, lambda: model(ids, attention_mask=mask), torch.tensor([0, 1, 2, 0]), (ids,), {"attention_mask": mask})


def test_elbo_step_vit():
    model = _vit()
    images = torch.randn(4, 1, 8, 8)
    _elbo_step(model, lambda: model(images), torch.tensor([0, 1, 2, 0]), (images,))


def test_elbo_step_gpt2():
    model = _gpt2()
    ids = torch.randint(2, 50, (3, 6))
    _elbo_step(model, lambda: model(ids).logits[:, :-1], ids[:, 1:], (ids,))


def test_elbo_step_transformer_and_user_type(monkeypatch):
    torch.manual_seed(0)
    transformer = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32, batch_first=True)
    src, tgt = torch.randn(3, 5, 16), torch.randn(3, 4, 16)
    mask = nn.Transformer.generate_square_subsequent_mask(4)
    _elbo_step(
        transformer, lambda: transformer(src, tgt, tgt_mask=mask)[..., :3], torch.tensor([[0, 1, 2, 0]] * 3), (src, tgt), {"tgt_mask": mask}
    )
    monkeypatch.setattr(adapters, "_BY_TYPE", dict(adapters._BY_TYPE))
    register_adapter(TimmLikeAttention, adapters.from_timm_attention)
    model = TinyViT()
    x = torch.randn(4, 5, 4)
    _elbo_step(model, lambda: model(x), torch.tensor([0, 1, 2, 0]), (x,))


def test_readme_hugging_face_example(run_readme_block):
    """The README's Hugging Face example runs: no softmax self-attention is left, the loss is
    cross-entropy plus KL / N recomputed here, and the class probabilities are distributions."""
    _transformers()
    torch.manual_seed(0)
    namespace = run_readme_block("BertForSequenceClassification")
    bert = namespace["bert"]
    assert not [m for m in bert.modules() if type(m).__name__ == "BertSelfAttention"]
    layers = [m for m in bert.modules() if isinstance(m, gpytorch_sgpa.SGPAttention)]
    assert len(layers) == 2 and all(layer.global_inducing_inputs.grad is not None for layer in layers)
    expected = F.cross_entropy(namespace["logits"], namespace["labels"]) + namespace["kl"] / 10_000
    torch.testing.assert_close(namespace["loss"], expected, rtol=1e-6, atol=1e-6)
    probabilities = namespace["probabilities"]
    assert probabilities.shape == (8, 3)
    torch.testing.assert_close(probabilities.sum(-1), torch.ones(8), rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_gpt2_several_new_tokens_at_once_with_the_cache(implementation):
    """A prompt in two chunks through the cache (the second chunk's queries at offset positions)
    gives the logits of one uncached pass, inside posterior_mean."""
    model = convert(_gpt2(implementation).double(), num_global=4).eval()
    ids = torch.randint(2, 50, (2, 7))
    with torch.no_grad(), posterior_mean():
        whole = model(ids, use_cache=False).logits
        first = model(ids[:, :3], use_cache=True)
        second = model(ids[:, 3:], cache=first.cache, use_cache=True)
    torch.testing.assert_close(first.logits, whole[:, :3], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(second.logits, whole[:, 3:], rtol=1e-9, atol=1e-9)
    # the same through one adapter called without a mask (the causal structure of the new positions
    # at offset 3 is then the adapter's own)
    adapter = model.transformer.h[0].attn
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    cache = _transformers().DynamicCache(config=model.config)
    with torch.no_grad(), posterior_mean():
        whole, _ = adapter(x)
        adapter(x[:, :3], cache=cache)
        rest, _ = adapter(x[:, 3:], cache=cache)
    torch.testing.assert_close(rest, whole[:, 3:], rtol=1e-9, atol=1e-9)


def test_bfloat16_model_keeps_its_dtype_and_follows_the_float32_one():
    """Weights and activations in bfloat16 (the GP algebra in float32): the hidden states (mean
    magnitude about 0.8) keep the dtype and, inside posterior_mean, stay within bfloat16 rounding of
    those of the same model in float32, for both mask formats."""
    model = convert(_bert(cls="BertModel"), num_global=4).eval()
    ids = torch.randint(2, 100, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    with torch.no_grad(), posterior_mean():
        reference = model(ids, attention_mask=mask).last_hidden_state
        low = copy.deepcopy(model).to(torch.bfloat16)
        for implementation in ("sdpa", "eager"):
            low.config._attn_implementation = implementation
            hidden = low(ids, attention_mask=mask).last_hidden_state
            assert hidden.dtype == torch.bfloat16
            torch.testing.assert_close(hidden.float(), reference, rtol=0.05, atol=0.05)


def test_an_unsupported_family_lists_the_supported_ones_and_register_adapter():
    """A transformers model without an adapter (GPT-NeoX): the error names the supported families (each module class
    with its model type), the new ones included, and register_adapter."""
    transformers = _transformers()
    config = transformers.GPTNeoXConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    with pytest.raises(ValueError) as error:
        convert(transformers.GPTNeoXForCausalLM(config))
    message = str(error.value)
    for name in ("bert.BertSelfAttention", "gpt2.GPT2Attention", "distilbert.DistilBertSelfAttention", "albert.AlbertAttention"):
        assert name in message
    for family in ("Llama", "Mistral", "Qwen2"):
        assert f"{family.lower()}.{family}Attention" in message
    assert "deberta_v2.DisentangledSelfAttention" in message and "register_adapter" in message


# --------------------------------------------------------------------------- DistilBERT, ALBERT, DeBERTa-v2, Llama-style decoders
def _encoder(family, seed=0):
    """A small random DistilBERT, ALBERT (two unshared layers) or DeBERTa-v2 (relative attention with both
    disentangled terms) classifier, dropout off."""
    transformers = _transformers()
    torch.manual_seed(seed)
    if family == "distilbert":
        config = transformers.DistilBertConfig(
            vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64, dropout=0.0, attention_dropout=0.0, num_labels=3
        )
        return transformers.DistilBertForSequenceClassification(config)
    common = dict(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    if family == "albert":
        return transformers.AlbertForSequenceClassification(transformers.AlbertConfig(embedding_size=16, num_hidden_groups=2, **common))
    config = transformers.DebertaV2Config(relative_attention=True, pos_att_type=["p2c", "c2p"], max_position_embeddings=32, **common)
    return transformers.DebertaV2ForSequenceClassification(config)


def _attention_of(model, family, index):
    """The self-attention module of layer ``index`` (the one convert replaces)."""
    if family == "distilbert":
        return model.distilbert.transformer.layer[index].attention
    if family == "albert":
        return model.albert.encoder.albert_layer_groups[index].albert_layers[0].attention
    return model.deberta.encoder.layer[index].attention.self


def _decoder(family="Llama", implementation="sdpa", seed=0):
    """A small random Llama, Mistral or Qwen2 causal LM with grouped-query attention (4 query heads sharing
    2 key/value heads; Qwen2's projections have biases)."""
    transformers = _transformers()
    torch.manual_seed(seed)
    config = getattr(transformers, f"{family}Config")(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=1,
    )
    config._attn_implementation = implementation
    return getattr(transformers, f"{family}ForCausalLM")(config)


def _capture_call(module):
    """The keyword arguments (the positional input as ``hidden_states``) and the output of every call of ``module``."""
    calls = []

    def hook(m, args, kwargs, output):
        kwargs = dict(kwargs)
        if args:
            kwargs["hidden_states"] = args[0]
        calls.append((kwargs, output))

    module.register_forward_hook(hook, with_kwargs=True)
    return calls


@pytest.mark.parametrize("family", ["distilbert", "albert", "deberta_v2"])
def test_encoder_families_kernel_conversion_matches_kernel_attention_by_hand(family):
    """Through the model's own forward with a padding mask: the converted self-attention computes kernel attention
    from the original W_q, W_k, W_v and value bias, followed by the family's own output path (DistilBERT's out_lin,
    ALBERT's dense + residual LayerNorm; DeBERTa-v2's output module stays outside), and DeBERTa-v2's conversion
    record says that the relative-position terms are dropped."""
    model = _encoder(family).double().eval()
    original = copy.deepcopy(_attention_of(model, family, 1))
    convert(model, attention="kernel")
    adapter = _attention_of(model, family, 1)
    assert isinstance(adapter, adapters.SelfAttentionAdapter)
    calls = _capture_call(adapter)
    ids = torch.randint(2, 100, (3, 6))
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1, 4:] = 0
    with torch.no_grad():
        model(ids, attention_mask=mask)
    ((call, (output, _)),) = calls
    x = call["hidden_states"]
    names = {
        "distilbert": ("q_lin", "k_lin", "v_lin"),
        "albert": ("query", "key", "value"),
        "deberta_v2": ("query_proj", "key_proj", "value_proj"),
    }
    query, key, value = (getattr(original, name) for name in names[family])
    allowed = mask.bool()[:, None, :].expand(3, 6, 6)
    context, _ = _kernel_by_hand(x, query.weight, key.weight, value.weight, value.bias, 4, allowed)
    expected = {
        "distilbert": lambda: original.out_lin(context),
        "albert": lambda: original.LayerNorm(x + original.dense(context)),
        "deberta_v2": lambda: context,
    }[family]()
    valid = mask.bool()
    torch.testing.assert_close(output[valid], expected[valid], rtol=1e-8, atol=1e-8)
    notes = [entry.get("notes") for entry in model.config.sgpa["conversions"]]
    assert notes == ([[adapters.DEBERTA_V2_NOTE]] if family == "deberta_v2" else [None])


@pytest.mark.parametrize("family, implementation", [("Llama", "sdpa"), ("Llama", "eager"), ("Mistral", "sdpa"), ("Qwen2", "sdpa")])
def test_llama_style_kernel_conversion_matches_rotary_kernel_attention_by_hand(family, implementation):
    """A left-padded batch through the model's own forward: the converted attention is causal kernel attention on
    the shared projection (W_q + W_k)/2, W_k's two key heads repeated to the four query heads, rotated by the
    model's rotary embeddings (transformers' own apply_rotary_pos_emb and repeat_kv as the reference), with the
    repeated value heads, then o_proj."""
    transformers = _transformers()
    modeling = __import__(f"transformers.models.{family.lower()}.modeling_{family.lower()}", fromlist=["repeat_kv"])
    model = _decoder(family, implementation).double().eval()
    original = copy.deepcopy(model.model.layers[1].self_attn)
    convert(model, attention="kernel")
    adapter = model.model.layers[1].self_attn
    assert isinstance(adapter, adapters.RotaryAttentionAdapter) and adapter.causal
    calls = _capture_call(adapter)
    ids = torch.randint(2, 50, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    with torch.no_grad():
        model(ids, attention_mask=mask)
    ((call, (output, _)),) = calls
    x, (cos, sin) = call["hidden_states"], call["position_embeddings"]
    heads = lambda t, h: t.view(2, 6, h, 8).transpose(1, 2)  # noqa: E731
    q = heads(F.linear(x, original.q_proj.weight), 4)
    k = modeling.repeat_kv(heads(F.linear(x, original.k_proj.weight), 2), 2)
    v = modeling.repeat_kv(heads(original.v_proj(x), 2), 2)
    shared, _ = modeling.apply_rotary_pos_emb(0.5 * (q + k), 0.5 * (q + k), cos, sin)
    gram = torch.exp(-0.5 * (shared[:, :, :, None] - shared[:, :, None]).square().sum(-1) / 8)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril() & mask.bool()[:, None, None, :]
    context = (gram * allowed).matmul(v).transpose(1, 2).reshape(2, 6, 32)
    valid = mask.bool()
    torch.testing.assert_close(output[valid], original.o_proj(context)[valid], rtol=1e-8, atol=1e-8)
    assert transformers is not None


@pytest.mark.parametrize("family", ["Llama", "Mistral", "Qwen2"])
def test_llama_style_kernel_then_sgpa_keeps_the_function_and_caches(family):
    """The thesis's path: kernel attention, then orthogonal SGPA from it; inside posterior_mean the SGPA model
    computes the kernel model's logits (to 1e-10 in float64), a sample differs; a prompt in two chunks through the
    cache gives the logits of one uncached pass."""
    model = _decoder(family).double().eval()
    convert(model, attention="kernel")
    ids = torch.randint(2, 50, (2, 7))
    with torch.no_grad():
        expected = model(ids).logits
    convert(model, num_global=4)
    with torch.no_grad():
        sampled = model(ids).logits
        with posterior_mean():
            collapsed = model(ids, use_cache=False).logits
            first = model(ids[:, :3], use_cache=True)
            second = model(ids[:, 3:], cache=first.cache, use_cache=True)
    assert (sampled - expected).abs().max() > 1e-4
    torch.testing.assert_close(collapsed, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(first.logits, expected[:, :3], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(second.logits, expected[:, 3:], rtol=1e-9, atol=1e-9)


def test_llama_generate_with_cache_equals_without():
    """Greedy generation of a left-padded batch inside posterior_mean: the cached path (new positions from the
    cached rotated queries) gives the tokens and scores of generation without the cache."""
    model = convert(_decoder().double(), num_global=4).eval()
    prompt = torch.randint(2, 50, (2, 4))
    mask = torch.ones(2, 4, dtype=torch.long)
    mask[1, :2] = 0
    results = {}
    with torch.no_grad(), posterior_mean():
        for use_cache in (True, False):
            results[use_cache] = model.generate(
                prompt,
                attention_mask=mask,
                max_new_tokens=5,
                do_sample=False,
                use_cache=use_cache,
                output_scores=True,
                return_dict_in_generate=True,
            )
    assert torch.equal(results[True].sequences, results[False].sequences)
    for cached, uncached in zip(results[True].scores, results[False].scores):
        torch.testing.assert_close(cached, uncached, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("family", ["distilbert", "albert", "deberta_v2"])
def test_elbo_step_encoder_families(family):
    model = _encoder(family)
    ids, mask = torch.randint(2, 100, (4, 6)), torch.ones(4, 6, dtype=torch.long)
    mask[0, 4:] = 0
    _elbo_step(model, lambda: model(ids, attention_mask=mask), torch.tensor([0, 1, 2, 0]), (ids,), {"attention_mask": mask})


@pytest.mark.parametrize("family", ["Llama", "Qwen2"])
def test_elbo_step_llama_style(family):
    model = _decoder(family)
    ids = torch.randint(2, 50, (3, 6))
    _elbo_step(model, lambda: model(ids).logits[:, :-1], ids[:, 1:], (ids,))


@pytest.mark.parametrize("family", ["distilbert", "albert", "deberta_v2"])
def test_encoder_families_kernel_then_sgpa_keep_the_function(family):
    """Kernel attention, then orthogonal SGPA from it: inside posterior_mean the padded batch's logits are the kernel
    model's (to 1e-10 in float64); a sample differs."""
    model = _encoder(family).double().eval()
    convert(model, attention="kernel")
    ids = torch.randint(2, 100, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        convert(model, num_global=4)
        sampled = model(ids, attention_mask=mask).logits
        with posterior_mean():
            collapsed = model(ids, attention_mask=mask).logits
    assert (sampled - expected).abs().max() > 1e-6
    torch.testing.assert_close(collapsed, expected, rtol=1e-10, atol=1e-10)


def test_llama_style_configurations_it_cannot_convert_raise_with_the_reason():
    """A head size other than hidden_size / num_attention_heads raises at conversion; a sliding window shorter than
    the sequence (a banded mask) raises at the forward pass, while a sequence inside the window runs."""
    transformers = _transformers()
    common = dict(vocab_size=50, intermediate_size=64, num_hidden_layers=1, num_key_value_heads=2, max_position_embeddings=64)
    wide = transformers.LlamaForCausalLM(transformers.LlamaConfig(hidden_size=32, num_attention_heads=4, head_dim=16, **common))
    with pytest.raises(ValueError, match="head_dim"):
        convert(wide, attention="kernel")
    config = transformers.MistralConfig(hidden_size=32, num_attention_heads=4, sliding_window=4, **common)
    config._attn_implementation = "eager"
    model = convert(transformers.MistralForCausalLM(config), attention="kernel").eval()
    with torch.no_grad():
        assert model(torch.randint(2, 50, (1, 4))).logits.shape == (1, 4, 50)
        with pytest.raises(ValueError, match="not a causal padding mask"):
            model(torch.randint(2, 50, (1, 7)))
