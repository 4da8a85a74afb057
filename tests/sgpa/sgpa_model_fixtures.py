"""Small float64 SGPA models shared by the Transformer, decoder and ELBO tests."""

import torch

from gpytorch_sgpa import SGPADecoder, SGPATransformer

VOCAB, LENGTH, BATCH = 9, 6, 3  # the decoder's vocabulary, sequence length and batch


def _transformer(attention="sgpa", seed=0, **kwargs):
    torch.manual_seed(seed)
    kwargs.setdefault("attention_kwargs", {"num_global": 4} if attention.startswith("sgpa") and attention != "sgpa-standard" else None)
    return SGPATransformer(
        vocab_size=11, num_classes=3, d_model=8, num_heads=2, num_layers=2, max_len=6, attention=attention, **kwargs
    ).double()


def _tokens(seed=1, batch=3, length=6):
    torch.manual_seed(seed)
    tokens = torch.randint(0, 11, (batch, length))
    mask = torch.zeros(batch, length, dtype=torch.bool)
    mask[0, 4:] = True
    mask[1, 1] = True
    return tokens, mask


def _decoder(attention, kwargs, seed=0, num_layers=2):
    torch.manual_seed(seed)
    model = SGPADecoder(
        VOCAB, d_model=8, num_heads=2, num_layers=num_layers, max_len=LENGTH, attention=attention, attention_kwargs=kwargs
    ).double()
    with torch.no_grad():  # moderate variational parameters keep the conditionals well conditioned
        for name, p in model.named_parameters():
            if "global_chol" in name or "global_values" in name:
                p.mul_(0.3)
    return model.eval()
