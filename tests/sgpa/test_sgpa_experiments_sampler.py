"""--sampler reaches every decoupled SGPA layer of the calibration runner, and its draws differ
from the diagonal sampler's only in the cross-position correlations (same predictive mean)."""

from dataclasses import replace

import torch

from experiments.sgpa.calibration import QUICK_CONFIG, build_network, build_parser, load_task
from gpytorch_sgpa.attention import SGPAttention


def test_sampler_flag_reaches_the_layers():
    args = build_parser().parse_args(["--out", "x", "--sampler", "decomposed"])
    config = replace(QUICK_CONFIG, sampler=args.sampler)
    task = load_task("digits", config, seed=0)
    for family in ("sgpa", "sgpa-dsvgp"):
        network = build_network(task, family, config)
        layers = [m for m in network.modules() if isinstance(m, SGPAttention)]
        assert layers and all(layer.sampler == "decomposed" for layer in layers)
    baseline = build_network(task, "sgpa", QUICK_CONFIG)
    assert all(m.sampler == "diagonal" for m in baseline.modules() if isinstance(m, SGPAttention))


def test_decomposed_and_diagonal_share_the_posterior_mean():
    config = replace(QUICK_CONFIG, sampler="decomposed")
    task = load_task("digits", config, seed=0)
    torch.manual_seed(0)
    decomposed = build_network(task, "sgpa", config)
    diagonal = build_network(task, "sgpa", QUICK_CONFIG)
    diagonal.load_state_dict(decomposed.state_dict())
    layer_a = next(m for m in decomposed.modules() if isinstance(m, SGPAttention))
    layer_b = next(m for m in diagonal.modules() if isinstance(m, SGPAttention))
    x = torch.randn(4, 5, layer_a.d_model)
    with torch.no_grad():
        post_a = layer_a.posterior(x)
        post_b = layer_b.posterior(x)
    torch.testing.assert_close(post_a.mean, post_b.mean)
    torch.testing.assert_close(post_a.variance, post_b.variance)
