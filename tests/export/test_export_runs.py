"""End to end, one tiny float32 run a task: `amptrain export`, the SavedModel loaded in a
fresh Python process that imports no amptrain (TensorFlow and TensorFlow Text only), and
its outputs equal to `amptrain predict`'s; the ONNX model against the SavedModel; the
export read back by `predict EXPORT_DIR`. Slow: each trains a run and starts a process."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import shared_run, write_tiny

import amptrain
from amptrain.errors import UserError

pytestmark = pytest.mark.slow
FLOAT32 = ["precision.policy=float32", "runtime.jit_compile=false"]

# Loads the export with TensorFlow alone and prints the outputs of a signature as JSON.
FRESH_PROCESS = r"""
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the tokenizer's ops)
model = tf.saved_model.load(sys.argv[1])
outputs = model.signatures["serving_default"](text=tf.constant(json.loads(sys.stdin.read())))
assert not [m for m in sys.modules if m.split(".")[0] == "amptrain"], "the export imported amptrain"
print(json.dumps({k: v.numpy().tolist() for k, v in outputs.items()}, default=lambda b: b.decode()))
"""


def serve_in_fresh_process(version_dir, texts):
    """The `serving_default` outputs of `texts`, from a new Python process."""
    done = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(version_dir)],
        input=json.dumps(texts),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().split("\n")[-1])


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, spam_rows):
    folder = write_tiny(tmp_path_factory.mktemp("classify"), spam_rows)
    run = shared_run(
        "export-classifier", folder / "run", lambda to: amptrain.fit(str(folder / "tiny.toml"), FLOAT32, run_dir=to)
    )
    # "a\0...": a NUL read as a space, not as the end of the text
    texts = [row[0] for row in spam_rows[200:216]] + ["WIN a FREE cruise, click now", "", "ok"]
    return run, [*texts, "a\0WIN a FREE cruise, click now", "\0"]


def test_the_classifier_export_stands_alone_and_equals_predict(classifier):
    run, texts = classifier
    result = amptrain.export(str(run))
    assert result["path"] == str(run / "export" / "1") and result["checkpoint"].startswith("ckpt-")
    served = serve_in_fresh_process(run / "export" / "1", texts)
    records = amptrain.predict(str(run), texts)
    labels = json.loads((run / "labels.json").read_text())
    assert served["label"] == [r["label"] for r in records]
    expected = np.array([[r["probabilities"][name] for name in labels] for r in records])
    assert np.abs(np.array(served["probabilities"]) - expected).max() <= 1e-5
    # `predict EXPORT_DIR`: the same records from the export, its probabilities (rounded to six
    # places) within the served ones' 1e-5: the export batches and pads the texts otherwise, so
    # a probability on a rounding boundary can print one unit apart (0.791811 against 0.791812).
    from_export = amptrain.predict(str(run / "export"), texts)
    assert [{**r, "probabilities": None} for r in from_export] == [{**r, "probabilities": None} for r in records]
    got = np.array([[r["probabilities"][name] for name in labels] for r in from_export])
    assert np.abs(got - expected).max() <= 1e-5


def test_saved_model_cli_lists_both_signatures(classifier):
    run, _ = classifier
    if not (run / "export" / "1").exists():
        amptrain.export(str(run))
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    shown = subprocess.run(
        [cli, "show", "--dir", str(run / "export" / "1"), "--all"], capture_output=True, text=True, timeout=300
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    out = shown.stdout
    for expected in (
        "signature_def['serving_default']",
        "signature_def['serve_token_ids']",
        "name: serving_default_text:0",
    ):
        assert expected in out
    assert "dtype: DT_STRING" in out and "dtype: DT_FLOAT" in out and "shape: (-1, 2)" in out


def test_the_onnx_classifier_and_half_precision_exports(classifier):
    run, texts = classifier
    onnx = amptrain.export(str(run), fmt="onnx")
    assert onnx["path"] == str(run / "export-onnx" / "1")  # not where TF Serving watches the SavedModels
    compare_onnx(run / "export" / "1", os.path.join(onnx["path"], "model.onnx"), {"token_ids": random_ids((6, 21))})
    with pytest.raises(UserError, match="an ONNX export takes token ids"):
        amptrain.predict(onnx["path"], texts)
    half = amptrain.export(str(run), version=3, precision="bfloat16")
    assert half["precision"] == "bfloat16"
    halved = amptrain.predict(half["path"], texts)
    full = amptrain.predict(str(run / "export" / "1"), texts)
    for a, b in zip(halved, full):  # bfloat16 keeps 8 bits of mantissa: about 2 decimals
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=0.03)


def random_ids(shape, high=200, seed=0):
    ids = np.random.default_rng(seed).integers(5, high, shape).astype(np.int32)
    ids[1, shape[1] // 2 :] = 0  # a padded row
    return ids


def compare_onnx(saved_dir, onnx_path, feeds):
    """The ONNX model's outputs equal the SavedModel's token-ids signature within 1e-4."""
    import tensorflow as tf

    from amptrain.serving.onnx import onnx_session

    signature = tf.saved_model.load(str(saved_dir)).signatures["serve_token_ids"]
    expected = {k: v.numpy() for k, v in signature(**{k: tf.constant(v) for k, v in feeds.items()}).items()}
    session = onnx_session(onnx_path)
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    assert got.keys() == expected.keys() == {"logits", "probabilities"}
    for name in got:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def tagger(tiny_ner):
    # No dev split, so the best checkpoint is the last; `O` weighs little, so that the tiny
    # model tags entities in its training sentences.
    overrides = FLOAT32 + ["data.dev=", "train.steps=60", "train.learning_rate=1e-2", "train.outside_weight=0.05"]
    shared_run(
        "export-tagger", tiny_ner / "run", lambda to: amptrain.fit(str(tiny_ner / "tiny.toml"), overrides, run_dir=to)
    )
    sentences = (tiny_ner / "train.conll").read_text(encoding="utf-8").split("\n\n")
    texts = [" ".join(line.split("\t")[0] for line in s.split("\n") if line) for s in sentences if s.strip()]
    texts += ["@john_doe went to New York with #Obama: https://t.co/xyz!!", "", "  ", "Café MÜNCHEN İstanbul 😀 ¿Qué?"]
    texts += ["I\0met John in New York", "\0\0"]  # a NUL read as a space, offsets kept
    return tiny_ner / "run", texts


def test_the_tagger_export_stands_alone_and_equals_predict(tagger):
    run, texts = tagger
    amptrain.export(str(run))
    served = serve_in_fresh_process(run / "export" / "1", texts)
    records = amptrain.predict(str(run), texts)
    assert sum(len(r["entities"]) for r in records) > 0  # the spans are tested, not only `O`
    for i, record in enumerate(records):
        words, entities = served["num_words"][i], served["num_entities"][i]
        assert served["words"][i][:words] == record["tokens"]
        assert served["tags"][i][:words] == record["tags"]
        assert set(served["words"][i][words:]) <= {""} and set(served["word_starts"][i][words:]) <= {-1}
        spans = zip(
            *(served[k][i][:entities] for k in ("entity_types", "entity_texts", "entity_starts", "entity_ends"))
        )
        assert [dict(zip(("type", "text", "start", "end"), s)) for s in spans] == record["entities"]
    assert amptrain.predict(str(run / "export"), texts) == records


def test_the_onnx_tagger_equals_the_saved_model(tagger):
    run, _ = tagger
    if not (run / "export" / "1").exists():
        amptrain.export(str(run))
    onnx = amptrain.export(str(run), fmt="onnx")
    rng = np.random.default_rng(1)
    feeds = {
        "token_ids": random_ids((4, 19), high=300),
        "shape_ids": rng.integers(0, 56, (4, 19)).astype(np.int32),
        "char_ids": rng.integers(0, 104, (4, 19, 20)).astype(np.int32),
    }
    compare_onnx(run / "export" / "1", os.path.join(onnx["path"], "model.onnx"), feeds)


@pytest.fixture(scope="module")
def translator(tiny_translation):
    config, overrides = str(tiny_translation / "tiny.toml"), FLOAT32 + ["train.steps=16"]
    shared_run("export-translator", tiny_translation / "run", lambda to: amptrain.fit(config, overrides, run_dir=to))
    lines = (tiny_translation / "train.tsv").read_text(encoding="utf-8").split("\n")
    texts = [line.split("\t")[0] for line in lines[:12]] + ["", "  ", "¿Qué? (sí)", "a\0house", "\0"]
    return tiny_translation / "run", texts


def test_the_translator_export_stands_alone_and_equals_predict(translator):
    run, texts = translator
    result = amptrain.export(str(run))
    served = serve_in_fresh_process(run / "export" / "1", texts)
    records = amptrain.predict(str(run), texts)
    assert served["translation"] == [r["translation"] for r in records]
    assert amptrain.predict(result["path"], texts) == records
    with pytest.raises(UserError, match="exports as a SavedModel only"):
        amptrain.export(str(run), fmt="onnx")
    greedy = amptrain.export(str(run), version=3, overrides=["decode.beam_size=1"])
    metadata = json.loads((run / "export" / "3" / "assets.extra" / "amptrain-export.json").read_text())
    assert greedy["task"] == "translation" and metadata["decode"]["beam_size"] == 1
