"""Small classifiers shared by the baselines' tests: a dropout network, a dropout MLP and a random BERT classifier."""

import pytest
import torch


class _DropoutNet(torch.nn.Module):
    def __init__(self, p=0.5):
        super().__init__()
        self.hidden = torch.nn.Linear(4, 16)
        self.dropout = torch.nn.Dropout(p)
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.dropout(torch.relu(self.hidden(x)))), torch.zeros(())


def _classifier(seed, dropout=0.3):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Dropout(dropout), torch.nn.Linear(16, 3))


def _hf_classifier(seed):
    """A small random BERT classifier (an MLE baseline: not converted), its token ids and padding mask."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16, num_labels=3, hidden_dropout_prob=0.3, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    ids = torch.randint(1, 50, (5, 7), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(5, 7, dtype=torch.long)
    mask[:2, 5:] = 0
    return transformers.BertForSequenceClassification(config), ids, mask
