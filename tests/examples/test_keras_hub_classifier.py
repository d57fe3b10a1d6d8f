"""examples/keras_hub_classifier: keras-hub's BertTextClassifier through amptrain.Trainer, in
process: the preprocessor's features, then a tiny backbone that trains and scores (its test
metrics equal to a fresh `evaluate`; tests/test_trainer_api.py checks them against the
model's own outputs); slow: a couple of steps from the MiniLM folder when it is there."""

import os
import sys

import numpy as np
import pytest
from conftest import ROOT

from amptrain.engine.run_log import read_metrics

EXAMPLE = os.path.join(ROOT, "examples", "keras_hub_classifier")
MINILM = os.path.join(ROOT, "pretrained", "all-MiniLM-L6-v2")
ROWS = 32
FAST = [
    ("train.steps", 2),
    ("train.batch_size", 16),
    ("train.log_every", 1),
    ("train.checkpoint_every", 2),
    ("train.eval_every", 2),
    ("runtime.jit_compile", False),
]
TINIER = {"num_layers": 1, "num_heads": 2, "hidden_dim": 16, "intermediate_dim": 32}


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, EXAMPLE)
    import keras_hub_classifier

    yield keras_hub_classifier
    sys.path.remove(EXAMPLE)


@pytest.fixture(scope="module")
def spam(example):
    return example.load_spam(limit=ROWS)


def test_the_mails_arrive_as_the_backbones_three_inputs(spam):
    vocabulary, data = spam
    features, labels = data["train"]
    assert sorted(features) == ["padding_mask", "segment_ids", "token_ids"]
    ids = features["token_ids"]
    assert ids.shape == (ROWS, 128) and ids.dtype == np.int32 and labels.shape == (ROWS,)
    assert (ids[:, 0] == vocabulary.index("[CLS]")).all()
    np.testing.assert_array_equal(features["padding_mask"], (ids != 0).astype(np.int32))  # 0 is [PAD]
    assert (features["segment_ids"] == 0).all()
    ends = features["padding_mask"].sum(axis=1) - 1
    assert (ids[np.arange(ROWS), ends] == vocabulary.index("[SEP]")).all()


def test_a_tiny_bert_text_classifier_trains_and_scores(example, spam, tmp_path):
    import keras_hub

    vocabulary, data = spam
    settings = [*FAST, ("precision.policy", "mixed_bfloat16")]
    run = example.trainer(vocabulary, data, str(tmp_path / "run"), settings, backbone_config=TINIER)
    history = run.fit()
    test = history.test
    assert sorted(history.history) == ["loss", "val_accuracy", "val_loss"]
    assert set(test) == {"loss", "accuracy", "examples"} and test["examples"] == ROWS
    assert np.isfinite(test["loss"]) and 0.0 <= test["accuracy"] <= 1.0
    assert run.evaluate("test") == pytest.approx(test)  # the best checkpoint, read back from the run folder

    model = example.classifier_builder(vocabulary, backbone_config=TINIER)("mixed_bfloat16")
    assert isinstance(model, keras_hub.models.BertTextClassifier)
    assert model.backbone.compute_dtype == "bfloat16"
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert next(r for r in records if r["kind"] == "run")["policy"] == "mixed_bfloat16"
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(np.isfinite(r["loss"]) for r in train)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir(MINILM), reason=f"no MiniLM folder at {MINILM} (make pretrained)")
def test_minilm_from_its_folder_trains_and_scores(example, tmp_path):
    vocabulary, data = example.load_spam(limit=ROWS, pretrained=MINILM)
    assert len(vocabulary) == 30522 and vocabulary[0] == "[PAD]"
    run = example.trainer(vocabulary, data, str(tmp_path / "run"), FAST, pretrained=MINILM)
    assert run.model("float32").backbone.num_layers == 6  # the checkpoint's, not the tiny config
    test = run.fit().test
    assert test["examples"] == ROWS and np.isfinite(test["loss"])
    assert run.evaluate("test") == pytest.approx(test)
