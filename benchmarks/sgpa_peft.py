"""LoRA (``peft``) against full fine-tuning of a converted model: trainable parameters, peak memory, wall
time and calibration, on the movie-review sentences, paired by seed.

The set-up of ``docs/tutorials/07_huggingface_sgpa.py``: a small ``BertForSequenceClassification``
(hidden size 64, 2 layers, 4 heads; the vocabulary of the training sentences) trained ``--epochs`` epochs
with softmax attention on the binary movie-review sentences of the vaderSentiment 3.3.2 archive; then
every method gets the same ``2 x --fine-tune`` epochs:

* **softmax (full)**: the softmax network trained on (cross-entropy, every parameter), for reference;
* **softmax, LoRA**: the softmax network trained on with LoRA on BERT's ``query`` and ``value`` (the usual
  ``target_modules``; same rank, ``lora_alpha`` and ``modules_to_save``), to tell what LoRA does to a
  network without SGPA;
* **recipe, full fine-tuning**: ``convert(model, attention="kernel", calibration_inputs=batch)``,
  ``--fine-tune`` epochs of cross-entropy, ``convert(model, num_global=..., calibration_inputs=batch)``,
  ``--fine-tune`` epochs of the ELBO (``SGPAELBO`` defaults), every parameter trained;
* **recipe, LoRA**: the same stages with ``gpytorch_sgpa.lora.get_peft_model(model, r=--lora-rank,
  lora_alpha=2 x rank, modules_to_save=["classifier"])``: LoRA on every layer's ``qk_proj`` and ``v_proj``,
  SGPA's own parameters (kernel hyperparameters; global inducing inputs, variational parameters, mean
  gate) and the classifier trained, everything else frozen; the kernel stage's adapter is merged
  (``merge_and_unload``) before the SGPA conversion, which gets an adapter of its own.

Each method runs in a fresh Python process (``--worker``) on the saved pre-trained network, so that its
peak memory is its own: **peak memory** is the growth of the process's resident set during the
method's fine-tuning (conversion and both stages; not the prediction), ``VmHWM`` (peak RSS) read from
``/proc/self/status`` after resetting it to the current RSS by writing ``5`` to ``/proc/self/clear_refs``
(Linux), minus the RSS at that moment (``peft`` already imported and the network run once, in every
method's process); gradients, Adam's state, activations and whatever the allocator keeps.  **Trainable**
counts the parameters of the last stage with ``requires_grad`` (the SGPA stage; the kernel stage's count is
printed too); **grad + Adam state** is what they need in float32 (gradient and Adam's two moments, 12 bytes
a parameter, of the larger stage), computed, not measured.  **Wall time**: the method's fine-tuning in that
process.  Test metrics: accuracy, NLL, ECE (15 bins) of ``--num-samples`` posterior samples' mean probabilities; OOD
AUROC: telling the NYT editorial sentences of the same archive (a different domain, same label space;
unknown words map to the vocabulary's unknown token) from the test sentences by predictive entropy.

    OMP_NUM_THREADS=1 python benchmarks/sgpa_peft.py --seeds 0 1 2      # about 3.5 min a seed on one core
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

METHODS = ("softmax (full)", "softmax, LoRA", "recipe, full fine-tuning", "recipe, LoRA")
METRICS = ("accuracy", "nll", "ece", "ood_auroc")


def lora_recipe_stage(model, tune, rank, modules_to_save, elbo_data=None):
    """One stage of the recipe with LoRA: ``gpytorch_sgpa.lora.get_peft_model(model, r=rank, lora_alpha=2 x rank,
    modules_to_save=...)``, then ``tune(adapted)`` (cross-entropy) or, with ``elbo_data`` (the number of
    training examples), ``tune(adapted, elbo=SGPAELBO(adapted, num_data=elbo_data))``.  Returns the adapted
    model and its number of trainable parameters."""
    from gpytorch_sgpa import SGPAELBO
    from gpytorch_sgpa.lora import get_peft_model

    adapted = get_peft_model(model, r=rank, lora_alpha=2 * rank, modules_to_save=list(modules_to_save))
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    if elbo_data is None:
        tune(adapted)
    else:
        tune(adapted, elbo=SGPAELBO(adapted, num_data=elbo_data))
    return adapted, trainable


def _memory_kib() -> dict:
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status if line.startswith(("VmRSS", "VmHWM")))
    return {name: int(value.split()[0]) for name, value in fields.items()}


def reset_peak_rss() -> int:
    """Reset the process's peak RSS (``VmHWM``) to its current RSS; returns that RSS in KiB."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    return _memory_kib()["VmRSS"]


def load_sentences(max_len=48):
    """``(ids, attention_mask, labels, train, test, ood_ids, ood_mask)``: the tutorial's 80/20 split of the
    binary movie-review sentences, the vocabulary of the training sentences (``min_freq=2``), and the NYT
    editorial sentences encoded with it."""
    from gpytorch_sgpa.data.splits import split_indices
    from gpytorch_sgpa.data.text import Vocabulary, binary_sentiment, encode_sentences, load_vader_snippets, tokenize

    sentences, ratings = load_vader_snippets("movie")
    sentences, labels, _ = binary_sentiment(sentences, ratings)
    num_train = int(0.8 * len(labels))
    train, test = split_indices(len(labels), [num_train, len(labels) - num_train], seed=0)
    vocabulary = Vocabulary.build([sentences[i] for i in train.tolist()], min_freq=2)
    ids, padding = encode_sentences(sentences, vocabulary, max_len=max_len, truncate=True)
    nyt, _ = load_vader_snippets("nyt")
    nyt = [sentence for sentence in nyt if tokenize(sentence)]
    ood_ids, ood_padding = encode_sentences(nyt, vocabulary, max_len=max_len, truncate=True)
    return ids, (~padding).long(), labels, train, test, ood_ids, (~ood_padding).long(), len(vocabulary)


def fit(model, data, rows, epochs, generator, lr, batch_size=64, elbo=None):
    """Adam on cross-entropy, or on the negative ELBO, over the trainable parameters (``requires_grad``)."""
    from gpytorch_sgpa import kl_divergence

    ids, mask, labels = data
    parameters = model.parameters() if elbo is None else elbo.parameters()
    optimizer = torch.optim.Adam([p for p in parameters if p.requires_grad], lr=lr)
    model.train()
    for _ in range(epochs):
        for batch in rows[torch.randperm(len(rows), generator=generator)].split(batch_size):
            logits = model(input_ids=ids[batch], attention_mask=mask[batch]).logits
            if elbo is None:
                loss = F.cross_entropy(logits, labels[batch])
            else:
                loss = -elbo(logits, kl_divergence(model), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


@torch.no_grad()
def probabilities(model, ids, mask, num_samples, sgpa):
    from gpytorch_sgpa import predict_proba

    chunks = []
    for chunk_ids, chunk_mask in zip(ids.split(500), mask.split(500)):
        if sgpa:
            chunks.append(predict_proba(model, input_ids=chunk_ids, attention_mask=chunk_mask, num_samples=num_samples))
        else:
            chunks.append(model(input_ids=chunk_ids, attention_mask=chunk_mask).logits.softmax(-1))
    return torch.cat(chunks)


def run_method(method, workdir, args) -> dict:
    """One method on the pre-trained network saved in ``workdir`` (in a fresh process: ``--worker``)."""
    import gpytorch_sgpa
    from gpytorch_sgpa.metrics import accuracy, calibration_errors, negative_log_likelihood, ood_detection_scores

    torch.set_num_threads(args.threads)
    saved = torch.load(os.path.join(workdir, "pretrained.pt"), weights_only=False)
    model, (ids, mask, labels, train, test, ood_ids, ood_mask) = saved["model"], saved["data"]
    data = (ids, mask, labels)
    train = train[: args.train]
    torch.manual_seed(args.seed + 1)
    generator = torch.Generator().manual_seed(args.seed + 1)
    calibration = dict(input_ids=ids[train[: args.calibration]], attention_mask=mask[train[: args.calibration]])
    tune = lambda model, epochs, elbo=None: fit(model, data, train, epochs, generator, args.lr, elbo=elbo)
    result = {"method": method}
    import peft  # imported, and the model run once, before the peak is reset: the same for every method

    with torch.no_grad():
        model.eval()(**calibration)
    rss = reset_peak_rss()
    start = time.perf_counter()
    if method == "softmax (full)":
        model = tune(model, 2 * args.fine_tune)
        result["trainable"] = result["trainable_kernel_stage"] = sum(p.numel() for p in model.parameters())
    elif method == "softmax, LoRA":
        config = peft.LoraConfig(
            target_modules=["query", "value"], r=args.lora_rank, lora_alpha=2 * args.lora_rank, modules_to_save=["classifier"]
        )
        model = peft.get_peft_model(model, config)
        result["trainable"] = result["trainable_kernel_stage"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
        model = tune(model, 2 * args.fine_tune)
    elif method == "recipe, full fine-tuning":
        model = tune(gpytorch_sgpa.convert(model, attention="kernel", calibration_inputs=calibration), args.fine_tune)
        result["trainable_kernel_stage"] = sum(p.numel() for p in model.parameters())
        model = gpytorch_sgpa.convert(model, num_global=args.num_global, calibration_inputs=calibration)
        model = tune(model, args.fine_tune, elbo=gpytorch_sgpa.SGPAELBO(model, num_data=len(train)))
        result["trainable"] = sum(p.numel() for p in model.parameters())
    elif method == "recipe, LoRA":
        kernel = gpytorch_sgpa.convert(model, attention="kernel", calibration_inputs=calibration)
        kernel, result["trainable_kernel_stage"] = lora_recipe_stage(
            kernel, lambda m: tune(m, args.fine_tune), args.lora_rank, ["classifier"]
        )
        sgpa = gpytorch_sgpa.convert(kernel.merge_and_unload(), num_global=args.num_global, calibration_inputs=calibration)
        model, result["trainable"] = lora_recipe_stage(
            sgpa, lambda m, elbo: tune(m, args.fine_tune, elbo=elbo), args.lora_rank, ["classifier"], elbo_data=len(train)
        )
    else:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    result["seconds"] = time.perf_counter() - start
    result["peak_mib"] = (_memory_kib()["VmHWM"] - rss) / 1024
    result["total_parameters"] = sum(p.numel() for p in model.parameters())
    sgpa = method.startswith("recipe")
    probs = probabilities(model, ids[test], mask[test], args.num_samples, sgpa)
    probs_ood = probabilities(model, ood_ids, ood_mask, args.num_samples, sgpa)
    result.update(
        accuracy=accuracy(probs, labels[test]),
        nll=negative_log_likelihood(probs.clamp_min(1e-12), labels[test]),
        ece=calibration_errors(probs, labels[test])[0],
        ood_auroc=ood_detection_scores(probs, probs_ood)[0],
    )
    return result


def pretrain(seed, args, workdir) -> None:
    """The softmax BERT of seed ``seed`` trained ``--epochs`` epochs, saved with the data in ``workdir``."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    ids, mask, labels, train, test, ood_ids, ood_mask, vocabulary_size = load_sentences()
    test = test[: args.test]
    ood = torch.randperm(len(ood_ids), generator=torch.Generator().manual_seed(0))[: args.test]
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=vocabulary_size,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=2,
        pad_token_id=0,
    )
    model = transformers.BertForSequenceClassification(config)
    model = fit(model, (ids, mask, labels), train[: args.train], args.epochs, torch.Generator().manual_seed(seed), args.lr)
    torch.save(
        {"model": model, "data": (ids, mask, labels, train, test, ood_ids[ood], ood_mask[ood])}, os.path.join(workdir, "pretrained.pt")
    )


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train", type=int, default=8454, help="training sentences (at most the 8,454 of the split)")
    parser.add_argument("--test", type=int, default=2000, help="test sentences and OOD sentences")
    parser.add_argument("--epochs", type=int, default=3, help="softmax training epochs before conversion")
    parser.add_argument("--fine-tune", type=int, default=2, help="epochs per recipe stage")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--num-global", type=int, default=16)
    parser.add_argument("--num-samples", type=int, default=10)
    parser.add_argument("--calibration", type=int, default=256, help="sentences in the calibration batch")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the per-seed results to this file")
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "WORKDIR"), help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _spread(values, digits=3):
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def main(argv=None) -> dict:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(run_method(args.worker[0], args.worker[1], args)))
        return {}
    environment = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    passed = [arg for arg in (argv if argv is not None else sys.argv[1:])]
    per_seed = {}
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as workdir:
            start = time.perf_counter()
            pretrain(seed, args, workdir)
            print(f"seed {seed}: softmax pre-training {time.perf_counter() - start:.0f} s", flush=True)
            per_seed[seed] = {}
            for method in args.methods:
                worker = [sys.executable, os.path.abspath(__file__), *passed, "--worker", method, workdir, "--seed", str(seed)]
                done = subprocess.run(worker, env=environment, capture_output=True, text=True)
                if done.returncode:
                    raise RuntimeError(f"{method}, seed {seed} failed:\n{done.stderr[-4000:]}")
                per_seed[seed][method] = json.loads(done.stdout.strip().splitlines()[-1])
                row = per_seed[seed][method]
                print(
                    f"  {method}: {row['seconds']:.0f} s, peak +{row['peak_mib']:.0f} MiB, accuracy {row['accuracy']:.3f}, "
                    f"NLL {row['nll']:.3f}, ECE {row['ece']:.3f}, OOD AUROC {row['ood_auroc']:.3f}",
                    flush=True,
                )
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"args": vars(args), "torch": torch.__version__, "results": per_seed}, file, indent=1)
    seeds = args.seeds
    print(
        f"\n{min(args.train, 8454)} training sentences, {len(seeds)} seeds, {args.epochs} + {2 * args.fine_tune} epochs, "
        f"LoRA rank {args.lora_rank}, torch {torch.__version__}\n"
    )
    print(
        "| method | trainable (kernel stage / SGPA stage) | grad + Adam state (MiB) | peak RSS growth (MiB) | wall time (s) "
        "| accuracy | NLL | ECE | OOD AUROC (NYT) |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    for method in args.methods:
        rows = [per_seed[s][method] for s in seeds]
        trainable = f"{rows[0]['trainable_kernel_stage']:,} / {rows[0]['trainable']:,} of {rows[0]['total_parameters']:,}"
        state = 3 * 4 * max(rows[0]["trainable_kernel_stage"], rows[0]["trainable"]) / 2**20  # float32 gradient, Adam's m and v
        print(
            f"| {method} | {trainable} | {state:.1f} | {_spread([r['peak_mib'] for r in rows], 1)} | "
            f"{_spread([r['seconds'] for r in rows], 0)} | " + " | ".join(_spread([r[m] for r in rows]) for m in METRICS) + " |"
        )
    pairs = [
        (f"{kind}: LoRA minus full", lora, full)
        for kind, lora, full in (("softmax", "softmax, LoRA", "softmax (full)"), ("recipe", "recipe, LoRA", "recipe, full fine-tuning"))
        if lora in args.methods and full in args.methods
    ]
    if pairs:
        print("\npaired: LoRA minus full fine-tuning per seed (LoRA better in k of n seeds)\n")
        print("| | peak RSS growth (MiB) | wall time (s) | accuracy | NLL | ECE | OOD AUROC |\n| --- | --- | --- | --- | --- | --- | --- |")
    for name, lora, full in pairs:
        cells = []
        for metric, higher in (
            ("peak_mib", False),
            ("seconds", False),
            ("accuracy", True),
            ("nll", False),
            ("ece", False),
            ("ood_auroc", True),
        ):
            differences = [per_seed[s][lora][metric] - per_seed[s][full][metric] for s in seeds]
            wins = sum((d > 0) if higher else (d < 0) for d in differences)
            cells.append(
                f"{_spread(differences, 1 if metric == 'peak_mib' else 0 if metric == 'seconds' else 3)} ({wins}/{len(differences)})"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    return per_seed


if __name__ == "__main__":
    main()
