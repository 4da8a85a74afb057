"""A fake ``vaderSentiment-3.3.2`` sdist: the nested archive layout the loader reads, tiny corpora."""

import io
import tarfile

_FILES = {"movie": "movieReviewSnippets", "nyt": "nytEditorialSnippets"}


def fake_vader_sdist(path, corpora):
    """Write ``path``; ``corpora`` maps ``"movie"``/``"nyt"`` to ``[(rating, sentence), ...]``."""
    inner_buffer = io.BytesIO()
    with tarfile.open(fileobj=inner_buffer, mode="w:gz") as inner:
        for corpus, rows in corpora.items():
            content = "\r\n".join(f"{i + 1}\t{r}\t{s}" for i, (r, s) in enumerate(rows)).encode()
            info = tarfile.TarInfo(f"hutto_ICWSM_2014/{_FILES[corpus]}_GroundTruth.txt")
            info.size = len(content)
            inner.addfile(info, io.BytesIO(content))
    data = inner_buffer.getvalue()
    with tarfile.open(path, "w:gz") as outer:
        info = tarfile.TarInfo("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz")
        info.size = len(data)
        outer.addfile(info, io.BytesIO(data))


def fake_vader_corpora(path):
    """``fake_vader_sdist`` with small movie and NYT corpora of random sentences over a ten-word vocabulary."""
    import torch

    words = ["good", "bad", "film", "plot", "actors", "boring", "great", "the", "a", "is"]
    generator = torch.Generator().manual_seed(0)
    corpora = {}
    for corpus, count in (("movie", 120), ("nyt", 40)):
        lengths = torch.randint(3, 9, (count,), generator=generator).tolist()
        corpora[corpus] = [
            (0.5, " ".join(words[p] for p in torch.randint(0, len(words), (n,), generator=generator).tolist())) for n in lengths
        ]
    fake_vader_sdist(path, corpora)
