"""``predict_proba`` of any classifier: its own method, or the softmax of its logits (tuples and Hugging Face outputs)."""

import torch
from classifier_fixtures import _DropoutNet, _hf_classifier

from gpytorch_sgpa.baselines import EnsembleClassifier, predict_proba


def test_predict_proba_restores_training_mode():
    model = _DropoutNet().train()
    probs = predict_proba(model, torch.randn(3, 4), num_samples=2)
    assert model.training
    assert torch.allclose(probs.sum(-1), torch.ones(3))


def test_baselines_take_hugging_face_outputs():
    """``SequenceClassifierOutput`` (``.logits``) in predict_proba, MC dropout and a deep ensemble, against the
    softmax of ``.logits`` computed by hand with the same dropout masks."""
    from gpytorch_sgpa.baselines import mc_dropout_predict_proba

    bert, ids, mask = _hf_classifier(0)
    other, _, _ = _hf_classifier(1)
    with torch.no_grad():
        expected = [m.eval()(input_ids=ids, attention_mask=mask).logits.softmax(-1) for m in (bert, other)]
    torch.testing.assert_close(predict_proba(bert, input_ids=ids, attention_mask=mask), expected[0])
    ensemble = EnsembleClassifier([bert, other]).predict_proba(input_ids=ids, attention_mask=mask)
    torch.testing.assert_close(ensemble, (expected[0] + expected[1]) / 2)
    torch.manual_seed(5)
    sampled = mc_dropout_predict_proba(bert, input_ids=ids, attention_mask=mask, num_samples=3)
    torch.manual_seed(5)
    bert.train()  # BERT's dropout is all its randomness: train mode draws the same masks in the same order
    with torch.no_grad():
        by_hand = sum(bert(input_ids=ids, attention_mask=mask).logits.softmax(-1) for _ in range(3)) / 3
    torch.testing.assert_close(sampled, by_hand)
    assert (sampled - expected[0]).abs().max() > 1e-3  # dropout was on
