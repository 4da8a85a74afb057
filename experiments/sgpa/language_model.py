"""Next-word prediction with causal SGPA decoders vs maximum-likelihood attention (thesis §3.7, future work).

The thesis evaluates SGPA on classification only and names decoder-based SGPA as future work. This
runner trains word-level language models (:class:`~gpytorch_sgpa.transformer.SGPADecoder`) on the
movie-review sentences of the ``vaderSentiment==3.3.2`` sdist and scores every next-word
prediction of held-out sentences, and of NYT editorial sentences from the same archive (a domain
shift):

* ``token_nll`` (nats per predicted word; ``perplexity = exp(token_nll)``), top-1 ``accuracy``, and
  ``ece`` / ``mce`` (15 bins, thesis App. B.2.2) of the next-word distributions;
* ``shift_token_nll`` / ``shift_ece`` on the editorial sentences.

Methods: ``mle-sdp`` and ``mle-kernel`` (causal scaled dot-product / exponential-kernel attention,
cross-entropy), ``mcd`` (``mle-kernel`` predicting with dropout on), ``sgpa`` (decoupled orthogonal
SGPA, exponential kernel, trained by the ELBO per sentence of :class:`~gpytorch_sgpa.elbo.SGPAELBO`,
``--kl-weighting`` (default ``all-over-n``), ``num_data`` = number of training sentences;
``--whitened``/``--no-whitened`` its global covariance, default whitened). Predictions of ``mcd``/``sgpa`` average the
next-word probabilities of ``--num-samples`` passes.

    python -m experiments.sgpa.language_model --methods mle-sdp,mle-kernel,mcd,sgpa --seeds 3 --out DIR

writes ``DIR/results.csv`` (columns :data:`CSV_COLUMNS`) and prints mean ± 2 s.e. per method.
``torchrun --nproc-per-node N -m experiments.sgpa.language_model ...`` trains data-parallel
(:mod:`.distributed`; ``--batch-size`` is the global batch); rank 0 evaluates and writes.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from gpytorch_sgpa import metrics
from gpytorch_sgpa.attention import SGPA_SAMPLERS
from gpytorch_sgpa.data import Vocabulary, load_vader_snippets, split_indices, tokenize
from gpytorch_sgpa.elbo import IGNORE_INDEX, KL_WEIGHTINGS, SGPAELBO
from gpytorch_sgpa.transformer import SGPADecoder

from . import distributed
from .calibration import format_table, parse_seeds, summarize, write_csv
from .training import Split, train_classifier

__all__ = ["METHODS", "CSV_COLUMNS", "LMConfig", "encode_for_lm", "evaluate_lm", "run", "main"]

#: The methods the runner compares (``--methods``).
METHODS = ("mle-sdp", "mle-kernel", "mcd", "sgpa")
#: The columns of the CSV the runner writes.
CSV_COLUMNS = (
    "dataset",
    "method",
    "seed",
    "token_nll",
    "perplexity",
    "accuracy",
    "ece",
    "mce",
    "shift_token_nll",
    "shift_ece",
    "train_s_per_epoch",
    "infer_s_per_batch",
    "world_size",
)
METRIC_COLUMNS = CSV_COLUMNS[3:-1]
BOS, EOS = "<bos>", "<eos>"


@dataclass(frozen=True)
class LMConfig:
    """Sizes and optimisation settings of the language-model runner (Adam, learning rate decaying linearly to a tenth).

    :param train_size: the training movie-review sentences per seed (default 7000).
    :param test_size: the held-out movie-review sentences per seed (default 2000).
    :param shift_size: the NYT editorial sentences per seed, the domain-shift set (default 1000).
    :param vocab_size: the most frequent training words kept, besides ``<pad>``, ``<unk>``, ``<bos>`` and ``<eos>``
        (default 1000).
    :param max_len: the predicted positions per sentence (longer sentences are cut; default 32).
    :param epochs: the training epochs (default 10).
    :param batch_size: the (global) batch size in sentences (default 100).
    :param lr: the peak Adam learning rate (default ``1e-3``).
    :param d_model: the model width (default 64).
    :param num_heads: the attention heads per layer (default 4).
    :param num_layers: the decoder layers (default 2).
    :param num_global: the global inducing inputs per head of the SGPA layers (default 32).
    :param num_samples: the passes averaged by ``mcd`` and ``sgpa`` predictions (default 10).
    :param dropout: the dropout probability (default 0.1).
    :param kl_anneal_epochs: the epochs over which the KL weight ramps from 0 to 1 (default 0: no annealing).
    :param sampler: the SGPA layers' sampler, ``"diagonal"`` (the default, the thesis's), ``"full"`` or ``"decomposed"``.
    :param kl_weighting: the ELBO's KL weighting, one of :data:`~gpytorch_sgpa.elbo.KL_WEIGHTINGS` (default
        ``"all-over-n"``).
    :param whitened: whether the SGPA layers' global covariance is whitened (default ``True``).
    """

    train_size: int = 7000
    test_size: int = 2000
    shift_size: int = 1000
    vocab_size: int = 1000  # most frequent training words (+ <pad>, <unk>, <bos>, <eos>)
    max_len: int = 32
    epochs: int = 10
    batch_size: int = 100
    lr: float = 1e-3
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    num_global: int = 32
    num_samples: int = 10
    dropout: float = 0.1
    kl_anneal_epochs: int = 0
    sampler: str = "diagonal"  # SGPAttention sampler: diagonal (thesis), full or decomposed
    kl_weighting: str = "all-over-n"  # SGPAELBO's default
    whitened: bool = True  # SGPAttention's; the table in docs/project_results.md used False


QUICK_CONFIG = LMConfig(
    train_size=200,
    test_size=64,
    shift_size=64,
    vocab_size=100,
    max_len=12,
    epochs=1,
    batch_size=50,
    d_model=16,
    num_heads=2,
    num_layers=1,
    num_global=4,
    num_samples=2,
)


def encode_for_lm(sentences, vocabulary: Vocabulary, max_len: int) -> Split:
    """``<bos> w_1 … w_n <eos>`` cut to ``max_len + 1`` tokens; inputs are the first ``max_len``,
    targets the next ``max_len`` (``-100`` where padded), padding mask on the inputs.

    :param sentences: the sentences (strings) to encode.
    :param vocabulary: the vocabulary, with ``<bos>`` and ``<eos>`` among its tokens.
    :param max_len: the number of input (and target) positions per sentence.
    """
    bos, eos = vocabulary.stoi[BOS], vocabulary.stoi[EOS]
    inputs = torch.full((len(sentences), max_len), vocabulary.pad_index, dtype=torch.long)
    targets = torch.full((len(sentences), max_len), IGNORE_INDEX, dtype=torch.long)
    for row, sentence in enumerate(sentences):
        ids = ([bos] + vocabulary.encode(sentence) + [eos])[: max_len + 1]
        inputs[row, : len(ids) - 1] = torch.tensor(ids[:-1])
        targets[row, : len(ids) - 1] = torch.tensor(ids[1:])
    return Split(inputs, targets, padding_mask=targets == IGNORE_INDEX)


def _build_vocabulary(train_sentences, size: int) -> Vocabulary:
    frequent = Vocabulary.build(train_sentences, max_size=size).itos[2:]
    return Vocabulary([BOS, EOS] + frequent)


@torch.no_grad()
def evaluate_lm(model: SGPADecoder, data: Split, num_samples: int, batch_size: int, dropout: bool = False):
    r"""Per-word :math:`\\log p(\text{true word})`, confidence and correctness over all non-padded targets, and s/batch.

    Probabilities are averaged over ``num_samples`` passes (posterior samples for SGPA, dropout masks
    when ``dropout=True``); the model is otherwise in eval mode.

    :param model: the trained decoder (its forward returns ``(logits, kl)``).
    :param data: the encoded sentences (:func:`encode_for_lm`).
    :param num_samples: the passes averaged, a positive int.
    :param batch_size: the sentences per batch.
    :param dropout: whether the dropout modules stay active (MC dropout; default ``False``).
    """
    model.eval()
    if dropout:
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.train()
    log_true, confidence, correct, elapsed, batches = [], [], [], 0.0, 0
    for start in range(0, len(data), batch_size):
        index = torch.arange(start, min(start + batch_size, len(data)))
        inputs, kwargs, targets = data.batch(index)
        begin = time.perf_counter()
        probs = torch.stack([torch.softmax(model(inputs, **kwargs)[0], -1) for _ in range(num_samples)]).mean(0)
        elapsed += time.perf_counter() - begin
        batches += 1
        keep = targets != IGNORE_INDEX
        probs, targets = probs[keep], targets[keep]
        log_true.append(probs.gather(-1, targets[:, None]).squeeze(-1).log())
        top, predicted = probs.max(-1)
        confidence.append(top)
        correct.append(predicted == targets)
    model.eval()
    return torch.cat(log_true), torch.cat(confidence), torch.cat(correct), elapsed / batches


def _scores(log_true, confidence, correct) -> dict:
    ece, mce = metrics.calibration_errors_from_confidence(confidence, correct)
    nll = float(-log_true.double().mean())
    return {"token_nll": nll, "perplexity": math.exp(nll), "accuracy": float(correct.double().mean()), "ece": ece, "mce": mce}


def _decoder(method: str, vocab_size: int, config: LMConfig) -> SGPADecoder:
    families: dict[str, tuple[str, dict[str, Any]]] = {
        "mle-sdp": ("sdp", {}),
        "mle-kernel": ("kernel", {"kernel": "exponential"}),
        "sgpa": (
            "sgpa",
            {"kernel": "exponential", "num_global": config.num_global, "sampler": config.sampler, "whitened": config.whitened},
        ),
    }
    attention, kwargs = families[method]
    return SGPADecoder(
        vocab_size,
        config.d_model,
        config.num_heads,
        config.num_layers,
        config.max_len,
        attention=attention,
        attention_kwargs=kwargs,
        dropout=config.dropout,
    )


def run(methods, seeds, config: LMConfig, progress: bool = True) -> list[dict]:
    """Train and evaluate ``methods`` for every seed; one row (dict of CSV columns) per pair.

    :param methods: a non-empty subset of :data:`METHODS`.
    :param seeds: the seeds (each draws its own sentences and initialisation).
    :param config: the experiment's settings.
    :param progress: whether to show tqdm progress bars (default ``True``).
    """
    methods = list(methods)
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise ValueError(f"methods must be a non-empty subset of {METHODS}, got unknown {unknown}")
    movie, _ = load_vader_snippets("movie")
    editorial, _ = load_vader_snippets("nyt")
    movie = [s for s in movie if tokenize(s)]
    editorial = [s for s in editorial if tokenize(s)]
    rows = []
    for seed in seeds:
        train_index, test_index = split_indices(len(movie), [config.train_size, config.test_size], seed)
        (shift_index,) = split_indices(len(editorial), [config.shift_size], seed)
        train_sentences = [movie[i] for i in train_index.tolist()]
        vocabulary = _build_vocabulary(train_sentences, config.vocab_size)
        train = encode_for_lm(train_sentences, vocabulary, config.max_len)
        test = encode_for_lm([movie[i] for i in test_index.tolist()], vocabulary, config.max_len)
        shift = encode_for_lm([editorial[i] for i in shift_index.tolist()], vocabulary, config.max_len)
        trained = {}
        for method in methods:
            family = "mle-kernel" if method == "mcd" else method
            if family not in trained:
                torch.manual_seed(seed)
                model = _decoder(family, len(vocabulary), config)
                elbo = None
                if family == "sgpa":
                    steps = config.kl_anneal_epochs * math.ceil(len(train) / config.batch_size)
                    elbo = SGPAELBO(model, num_data=len(train), anneal_steps=steps, kl_weighting=config.kl_weighting)
                seconds = train_classifier(
                    model,
                    train,
                    epochs=config.epochs,
                    batch_size=config.batch_size,
                    lr=config.lr,
                    elbo=elbo,
                    seed=seed,
                    progress=progress,
                    description=f"{family} seed {seed}",
                )
                trained[family] = (model, seconds)
            model, seconds = trained[family]
            if not distributed.is_main():  # every rank trains (DDP); rank 0 evaluates
                continue
            passes = config.num_samples if method in ("mcd", "sgpa") else 1
            dropout = method == "mcd"
            *test_scores, infer = evaluate_lm(model, test, passes, config.batch_size, dropout)
            *shift_scores, _ = evaluate_lm(model, shift, passes, config.batch_size, dropout)
            row = {"dataset": "vader_lm", "method": method, "seed": seed, **_scores(*test_scores)}
            shifted = _scores(*shift_scores)
            row.update(
                shift_token_nll=shifted["token_nll"],
                shift_ece=shifted["ece"],
                train_s_per_epoch=seconds,
                infer_s_per_batch=infer,
                world_size=distributed.world()[1],
            )
            rows.append(row)
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m experiments.sgpa.language_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="mle-kernel,sgpa", help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument("--seeds", default="1", help="a count N (seeds 0..N-1) or a comma-separated list")
    parser.add_argument("--out", required=True, type=Path, help="output folder for results.csv")
    parser.add_argument("--quick", action="store_true", help="smoke test: 200 sentences, 1 epoch, a tiny network")
    parser.add_argument("--no-progress", action="store_true", help="silence the tqdm progress bars")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    defaults = LMConfig()
    for name, value in defaults.__dict__.items():
        flag, help_text = "--" + name.replace("_", "-"), f"default {value} ({getattr(QUICK_CONFIG, name)} with --quick)"
        if isinstance(value, bool):
            parser.add_argument(flag, default=None, action=argparse.BooleanOptionalAction, help=help_text)
            continue
        parser.add_argument(
            flag,
            type=type(value),
            default=None,
            help=help_text,
            choices={"sampler": SGPA_SAMPLERS, "kl_weighting": KL_WEIGHTINGS}.get(name),
        )
    return parser


def main(argv=None) -> list[dict]:
    """The command line (module docstring): train, evaluate, write ``results.csv``; returns the rows.

    :param argv: the command-line arguments; ``None`` (the default): ``sys.argv[1:]``.
    """
    args = build_parser().parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    config = QUICK_CONFIG if args.quick else LMConfig()
    config = replace(config, **{name: getattr(args, name) for name in config.__dict__ if getattr(args, name) is not None})
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    distributed.init_from_environment()
    try:
        return _run_and_write(args, methods, config)
    finally:
        distributed.shutdown()


def _run_and_write(args, methods, config) -> list[dict]:
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows = run(methods, parse_seeds(args.seeds), config, progress=not args.no_progress)
    if not distributed.is_main():
        return rows
    write_csv(rows, args.out / "results.csv", CSV_COLUMNS)
    print(format_table(summarize(rows, METRIC_COLUMNS), METRIC_COLUMNS))
    print(
        f"\n{len(rows)} rows written to {args.out / 'results.csv'} in {time.perf_counter() - start:.0f} s; config: {config}",
        file=sys.stderr,
    )
    return rows


if __name__ == "__main__":
    main()
