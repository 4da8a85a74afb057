"""A small Llama-style classifier fine-tuned with LoRA: SGPA (``SGPATrainer`` + LoRA) against LoRA alone and LoRA +
temperature scaling, on the movie-review sentences, 3 seeds side by side.

The data of ``benchmarks/sgpa_peft.py``: the binary movie-review sentences of the vaderSentiment 3.3.2 archive, its
80/20 split and vocabulary; ``--train`` training sentences, the last ``--val`` sentences of the training split as
validation set (temperature scaling's), ``--test`` test sentences.  Per seed a ``LlamaForSequenceClassification``
built from a config (``--hidden`` wide, ``--layers`` layers, 4 query heads sharing 2 key/value heads, rotary
embeddings; the prediction is read at the last token) is trained ``--epochs`` epochs with softmax attention
(cross-entropy, every parameter: the "pre-trained" network), then each method fine-tunes it:

* **LoRA**: ``peft`` LoRA on ``q_proj`` and ``v_proj`` (rank ``--lora-rank``, ``lora_alpha`` twice the rank, the
  ``score`` head trained), ``2 x --fine-tune`` epochs of cross-entropy;
* **LoRA + temperature**: the same fine-tuned network, its logits divided by the temperature fitted on the validation
  set (``gpytorch_sgpa.baselines.TemperatureScaling``);
* **SGPA + LoRA**: ``convert(model, attention="kernel", calibration_inputs=batch)``, ``gpytorch_sgpa.lora.get_peft_model``
  (LoRA on ``qk_proj`` and ``v_proj``, SGPA's own parameters and ``score`` trained) ``--fine-tune`` epochs of
  cross-entropy; the adapter merged, ``convert(model, num_global=--num-global, calibration_inputs=batch)``, a fresh
  adapter, ``--fine-tune`` epochs with ``SGPATrainer`` on ``SGPAELBO(model, num_data, beta="auto")``.  Predictions:
  the mean of ``--num-samples`` posterior samples' class probabilities;
* **SGPA + LoRA + temperature**: those averaged probabilities' logarithms divided by a temperature fitted on the
  validation set (whether the two combine).

Every method sees the same ``2 x --fine-tune`` epochs of the same rows (Adam, constant rate ``--lr``, batch 64).
Metrics on the test sentences: accuracy, NLL, ECE (15 bins).  The table gives mean ± standard deviation over seeds,
then SGPA minus the baselines paired by seed (SGPA better in k of n seeds).

    OMP_NUM_THREADS=1 python benchmarks/sgpa_llama_lora.py --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sgpa_peft import fit, load_sentences, probabilities  # noqa: E402  (the same data, loop and predictions)

METHODS = ("LoRA", "LoRA + temperature", "SGPA + LoRA", "SGPA + LoRA + temperature")
#: (SGPA, baseline) compared seed by seed
PAIRS = (("SGPA + LoRA", "LoRA"), ("SGPA + LoRA", "LoRA + temperature"), ("SGPA + LoRA + temperature", "LoRA + temperature"))
METRICS = ("accuracy", "nll", "ece")


def build_model(vocabulary_size: int, args, seed: int):
    """A ``LlamaForSequenceClassification`` from a small config (grouped-query attention, rotary embeddings)."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=vocabulary_size,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.max_len,
        pad_token_id=0,  # the vocabulary's <pad>: the classifier reads the last token before it
        num_labels=2,
    )
    return transformers.LlamaForSequenceClassification(config)


def _scores(probs, labels) -> dict:
    from gpytorch_sgpa.metrics import accuracy, calibration_errors, negative_log_likelihood

    return {
        "accuracy": accuracy(probs, labels),
        "nll": negative_log_likelihood(probs.clamp_min(1e-12), labels),
        "ece": calibration_errors(probs, labels)[0],
    }


def _lora(model, args):
    import peft

    config = peft.LoraConfig(
        target_modules=["q_proj", "v_proj"], r=args.lora_rank, lora_alpha=2 * args.lora_rank, modules_to_save=["score"]
    )
    return peft.get_peft_model(model, config)


def sgpa_trainer_stage(model, data, rows, args, seed: int):
    """``--fine-tune`` epochs of ``SGPATrainer`` on the negative ELBO (``beta="auto"``) of a LoRA-adapted model."""
    import transformers

    from gpytorch_sgpa import SGPAELBO
    from gpytorch_sgpa.trainer import SGPATrainer

    ids, mask, labels = data
    dataset = [{"input_ids": ids[i], "attention_mask": mask[i], "labels": labels[i]} for i in rows.tolist()]
    with tempfile.TemporaryDirectory() as output:
        arguments = transformers.TrainingArguments(
            output_dir=output,
            num_train_epochs=args.fine_tune,
            per_device_train_batch_size=64,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            weight_decay=0.0,
            seed=seed,
            save_strategy="no",
            logging_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        elbo = SGPAELBO(model, num_data=len(rows), beta="auto")
        trainer = SGPATrainer(model=model, args=arguments, train_dataset=dataset, elbo=elbo)
        trainer.remove_callback(transformers.PrinterCallback)  # quiet: the table is the output
        trainer.train()
    return model.eval()


def run_seed(seed: int, args, sentences) -> dict:
    """The three methods on the network pre-trained with seed ``seed``: ``{method: metrics and seconds}``."""
    import gpytorch_sgpa
    from gpytorch_sgpa.baselines import TemperatureScaling
    from gpytorch_sgpa.lora import get_peft_model

    ids, mask, labels, train, test, _, _, vocabulary_size = sentences
    data = (ids, mask, labels)
    rows, val, test = train[: args.train], train[-args.val :], test[: args.test]
    generator = torch.Generator().manual_seed(seed)
    pretrained = fit(build_model(vocabulary_size, args, seed), data, rows, args.epochs, generator, args.lr)
    calibration = dict(input_ids=ids[rows[: args.calibration]], attention_mask=mask[rows[: args.calibration]])
    results = {}

    torch.manual_seed(seed + 1)
    start = time.perf_counter()
    lora = fit(_lora(copy.deepcopy(pretrained), args), data, rows, 2 * args.fine_tune, torch.Generator().manual_seed(seed + 1), args.lr)
    seconds = time.perf_counter() - start
    results["LoRA"] = {**_scores(probabilities(lora, ids[test], mask[test], 1, False), labels[test]), "seconds": seconds}
    with torch.no_grad():
        val_logits = lora(input_ids=ids[val], attention_mask=mask[val]).logits.double()
        test_logits = lora(input_ids=ids[test], attention_mask=mask[test]).logits.double()
    start = time.perf_counter()
    scaling = TemperatureScaling().fit(val_logits, labels[val])
    results["LoRA + temperature"] = {
        **_scores(scaling.predict_proba(test_logits).float(), labels[test]),
        "seconds": seconds + time.perf_counter() - start,
        "temperature": scaling.temperature,
    }

    torch.manual_seed(seed + 1)
    start = time.perf_counter()
    kernel = get_peft_model(
        gpytorch_sgpa.convert(copy.deepcopy(pretrained), attention="kernel", calibration_inputs=calibration),
        r=args.lora_rank,
        lora_alpha=2 * args.lora_rank,
        modules_to_save=["score"],
    )
    kernel = fit(kernel, data, rows, args.fine_tune, torch.Generator().manual_seed(seed + 1), args.lr)
    sgpa = gpytorch_sgpa.convert(kernel.merge_and_unload(), num_global=args.num_global, calibration_inputs=calibration)
    sgpa = sgpa_trainer_stage(
        get_peft_model(sgpa, r=args.lora_rank, lora_alpha=2 * args.lora_rank, modules_to_save=["score"]), data, rows, args, seed
    )
    seconds = time.perf_counter() - start
    probs = probabilities(sgpa, ids[test], mask[test], args.num_samples, True)
    results["SGPA + LoRA"] = {**_scores(probs, labels[test]), "seconds": seconds}
    val_probs = probabilities(sgpa, ids[val], mask[val], args.num_samples, True)
    start = time.perf_counter()
    scaling = TemperatureScaling().fit(val_probs.double().clamp_min(1e-12).log(), labels[val])
    results["SGPA + LoRA + temperature"] = {
        **_scores(scaling.predict_proba(probs.double().clamp_min(1e-12).log()).float(), labels[test]),
        "seconds": seconds + time.perf_counter() - start,
        "temperature": scaling.temperature,
    }
    return results


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--train", type=int, default=7000, help="training sentences (of the 8,454 of the split)")
    parser.add_argument("--val", type=int, default=1000, help="validation sentences (the end of the training split)")
    parser.add_argument("--test", type=int, default=2000, help="test sentences")
    parser.add_argument("--max-len", type=int, default=32, help="tokens per sentence (longer ones are truncated)")
    parser.add_argument("--hidden", type=int, default=64, help="the model width (4 query heads, 2 key/value heads)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3, help="softmax pre-training epochs")
    parser.add_argument("--fine-tune", type=int, default=2, help="epochs per SGPA stage (LoRA alone: twice as many)")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--num-global", type=int, default=16)
    parser.add_argument("--num-samples", type=int, default=10)
    parser.add_argument("--calibration", type=int, default=256, help="sentences in the calibration batch")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


def _spread(values, digits=3):
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def main(argv=None) -> dict:
    """Run every seed, print the table; returns ``{seed: {method: metrics}}``."""
    import transformers

    args = parse(argv)
    if args.train + args.val > 8454:
        raise ValueError(f"--train + --val must be at most the 8,454 sentences of the training split, got {args.train + args.val}")
    torch.set_num_threads(args.threads)
    transformers.utils.logging.set_verbosity_error()
    sentences = load_sentences(max_len=args.max_len)
    per_seed = {}
    for seed in args.seeds:
        per_seed[seed] = run_seed(seed, args, sentences)
        for method, row in per_seed[seed].items():
            scores = f"accuracy {row['accuracy']:.3f}, NLL {row['nll']:.3f}, ECE {row['ece']:.3f}"
            print(f"seed {seed}, {method}: {scores}, {row['seconds']:.0f} s", flush=True)
    seeds = args.seeds
    print(
        f"\nLlama-style classifier (hidden {args.hidden}, {args.layers} layers, 4 heads / 2 key-value heads), "
        f"{args.train} training sentences, {args.epochs} + {2 * args.fine_tune} epochs, LoRA rank {args.lora_rank}, "
        f"{len(seeds)} seeds, torch {torch.__version__}\n"
    )
    print("| method | accuracy | NLL | ECE | fine-tuning time (s) |\n| --- | --- | --- | --- | --- |")
    for method in METHODS:
        rows = [per_seed[s][method] for s in seeds]
        cells = [_spread([r[m] for r in rows]) for m in METRICS]
        print(f"| {method} | " + " | ".join(cells) + f" | {_spread([r['seconds'] for r in rows], 0)} |")
    print("\n| paired (SGPA better in k of n seeds) | accuracy | NLL | ECE |\n| --- | --- | --- | --- |")
    for method, baseline in PAIRS:
        cells = []
        for metric, higher in (("accuracy", True), ("nll", False), ("ece", False)):
            differences = [per_seed[s][method][metric] - per_seed[s][baseline][metric] for s in seeds]
            wins = sum((d > 0) if higher else (d < 0) for d in differences)
            cells.append(f"{_spread(differences)} ({wins}/{len(differences)})")
        print(f"| {method} minus {baseline} | " + " | ".join(cells) + " |")
    return per_seed


if __name__ == "__main__":
    main()
