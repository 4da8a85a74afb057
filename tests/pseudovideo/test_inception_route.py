"""The InceptionV3 route of ``pseudovideo.metrics`` with a real InceptionV3 and a weights file, as a user who has the
FID Inception checkpoint runs it: ``InceptionFeatures(weights_path=...)`` builds torch-fidelity's network from the
file, and FID through it on grey ``[0, 1]`` images equals torchmetrics' own ``FrechetInceptionDistance`` with its
default feature extractor loaded from the same file and given the images as 3-channel ``[0, 1]`` images.

The FID checkpoint cannot be downloaded here, so the file holds a seeded random initialisation of the same network:
the route (building, loading, 1 -> 3 channels, quantisation, resizing to 299 x 299, the feature layer) is what is
tested, not the published weights' numbers. torch-fidelity needs torchvision, which installs beside a matching torch
only (CI's zoo check); elsewhere the test is skipped, or fails with ``PROBSEQ_REQUIRE_TORCHVISION`` set."""

import os

import pytest
import torch

pytest.importorskip("torchmetrics")


@pytest.fixture(scope="module")
def inception_module():
    try:
        import torch_fidelity.feature_extractor_inceptionv3 as module
    except ImportError as error:  # torch-fidelity, or the torchvision it imports
        if os.environ.get("PROBSEQ_REQUIRE_TORCHVISION"):
            raise
        pytest.skip(f"torch-fidelity with torchvision is not installed here ({error})")
    return module


@pytest.fixture(scope="module")
def weights_file(inception_module, tmp_path_factory):
    """A checkpoint of torch-fidelity's FID InceptionV3, randomly initialised under a seed (the network's own
    loading is bypassed once, to build it without the download)."""
    network_class = inception_module.FeatureExtractorInceptionV3
    original = network_class.load_state_dict, inception_module.load_state_dict_from_url
    network_class.load_state_dict = lambda self, state_dict, *args, **kwargs: None
    inception_module.load_state_dict_from_url = lambda *args, **kwargs: {}
    try:
        torch.manual_seed(0)
        network = network_class("inception-v3-compat", ["64", "2048"])
    finally:
        network_class.load_state_dict, inception_module.load_state_dict_from_url = original
    path = tmp_path_factory.mktemp("inception") / "pt_inception-random.pth"
    torch.save(network.state_dict(), path)
    return path


def test_fid_through_the_inception_route_equals_torchmetrics_default_extractor(weights_file):
    from torchmetrics.image.fid import FrechetInceptionDistance

    from pseudovideo.metrics import InceptionFeatures, MetricReliabilityWarning, frechet_distance

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(1)
    real = torch.rand(12, 1, 28, 28, generator=generator)
    fake = torch.rand(12, 1, 28, 28, generator=generator).square()  # darker images: a clearly positive FID
    features = InceptionFeatures(weights_path=weights_file, feature=64)
    assert features(real[:2]).shape == (2, 64)
    with pytest.warns(MetricReliabilityWarning, match="singular"):  # 12 images for 64 features
        ours = frechet_distance(real, fake, features, batch_size=5)
    reference = FrechetInceptionDistance(feature=64, normalize=True, feature_extractor_weights_path=str(weights_file))
    reference.update(real.expand(-1, 3, -1, -1), real=True)
    reference.update(fake.expand(-1, 3, -1, -1), real=False)
    expected = float(reference.compute())
    assert expected > 0
    assert ours == pytest.approx(expected, rel=1e-5)


def test_a_missing_weights_file_is_a_named_error(inception_module, tmp_path):
    from pseudovideo.metrics import InceptionFeatures

    with pytest.raises(FileNotFoundError, match="weights"):
        InceptionFeatures(weights_path=tmp_path / "absent.pth", feature=64)
