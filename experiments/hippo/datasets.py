"""The runners' data sets: those of :func:`gpytorch_hippo.data.load_dataset` and a speech clip of a system package.

``speech`` is :func:`load_speech` standardised, on the time index: the thesis's TIMIT audio task is not
redistributable, and no Python package ships speech, so the clip comes from Debian's ``pocketsphinx-testdata``
(``apt-get install pocketsphinx-testdata``, or ``make data``).
"""

from __future__ import annotations

import glob
import os

import torch
from torch import Tensor

from gpytorch_hippo import data
from gpytorch_hippo.data import Dataset

SPEECH_DIR = "/usr/share/pocketsphinx/test/data/librivox"
#: The names :func:`load_dataset` accepts.
DATASETS = (*data.DATASETS, "speech")


def load_speech(num_samples: int = 3000, offset: int = 16000) -> Tensor:
    """``num_samples`` consecutive 16 kHz samples from ``offset`` of the first LibriVox clip in Debian's
    ``pocketsphinx-testdata`` (a speech excerpt of the TIMIT task's kind: a 3,000-sample window, as in Bui et
    al. 2017's audio experiment).

    :param num_samples: the window length in samples (default 3000).
    :param offset: the index of its first sample in the clip (default 16000, one second in).
    :return: the raw samples ``(num_samples,)`` as float64.
    """
    files = sorted(glob.glob(os.path.join(SPEECH_DIR, "*.wav")))
    if not files:
        raise FileNotFoundError(
            f"no .wav files in {SPEECH_DIR}: install the Debian package 'pocketsphinx-testdata' "
            "(apt-get install pocketsphinx-testdata, or make data)"
        )
    from scipy.io import wavfile

    rate, samples = wavfile.read(files[0])
    if rate != 16000 or samples.shape[0] < offset + num_samples:
        raise ValueError(f"{files[0]}: expected >= {offset + num_samples} samples at 16 kHz, got {samples.shape[0]} at {rate} Hz")
    return torch.as_tensor(samples[offset : offset + num_samples].astype(float))


def load_dataset(name: str) -> Dataset:
    """One of :data:`DATASETS`: ``speech`` as above, the others by :func:`gpytorch_hippo.data.load_dataset`.

    :param name: one of :data:`DATASETS`.
    """
    if name == "speech":
        y = load_speech()
        return Dataset(name, torch.arange(y.shape[0], dtype=torch.float64).unsqueeze(-1), (y - y.mean()) / y.std())
    if name not in DATASETS:
        raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {name!r}")
    return data.load_dataset(name)
