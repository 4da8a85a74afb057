"""README's pseudo-video example runs, and its printed minimum MSE matches a hand derivation."""

import torch


def test_readme_pseudovideo_example(run_readme_block):
    namespace = run_readme_block("make_pseudo_video, min_mse")
    x, video = namespace["x"], namespace["video"]
    assert torch.equal(video[:, -1], x[:4])
    # from z_{T-1} = sqrt(1 - b) x + sqrt(b) eps alone (b = beta_1 = 1e-4), along each eigenvector of
    # Sigma the error left is lambda b / ((1 - b) lambda + b): the scalar Gaussian regression formula
    eigenvalues = torch.linalg.eigvalsh(namespace["covariance"]).clamp_min(0)
    b = 1e-4
    torch.testing.assert_close(namespace["previous_only"], (eigenvalues * b / ((1 - b) * eigenvalues + b)).sum())
    assert namespace["all_earlier"] < namespace["previous_only"]
    assert namespace["method"] == "markov_high" and 0.003 < namespace["gain"] < 0.005  # printed: 0.39%


def test_guide_pipeline_example(run_readme_block):
    """The guide's train / save / reload / sample / score example: what it prints is what it computed."""
    namespace = run_readme_block("PseudoVideoPipeline(model, DDPMScheduler")
    videos = namespace["videos"]
    assert videos.shape == (8, 4, 1, 8, 8) and 0 <= videos.min() and videos.max() <= 1
    assert namespace["model"].config.clip_sample is False and namespace["fid"] > 0
    assert 0.5 < namespace["classifier"].test_accuracy <= 1


def test_readme_tokenizer_example(run_readme_block):
    namespace = run_readme_block("VideoTokenizer")
    videos, tokens = namespace["videos"], namespace["tokens"]
    assert tokens.shape == (256, 2, 2, 2) and namespace["ar_videos"].shape == (8, 4, 1, 8, 8)
    # 100 steps give a coarse code, but it must beat the best token-free code, the per-pixel mean
    # video (MSE 0.108 on these digits; measured 0.064), and use many of the 64 codes
    assert namespace["mse"] < 0.8 * (videos - videos.mean(0)).pow(2).mean()
    assert namespace["out"].perplexity > 8
