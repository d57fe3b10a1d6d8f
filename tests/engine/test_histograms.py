"""`train.histogram_every`: weight and gradient histograms in the run's TensorBoard folder,
read back as TensorBoard reads them; off by default."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

import amptrain
from amptrain.engine.run_log import read_metrics


def histograms(run_dir):
    """{(tag, step): (buckets, 3) array of [left, right, count]}."""
    found = {}
    for path in glob.glob(os.path.join(run_dir, "tensorboard", "train", "events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "histograms":
                    found[value.tag, event.step] = tf.make_ndarray(value.tensor)
    return found


@pytest.mark.slow  # trains past a few steps: out of the 5-minute quick tier
def test_weight_and_gradient_histograms_every_n_steps(tiny, monkeypatch):
    monkeypatch.setenv("AMPTRAIN_CACHE_DIR", str(tiny / "cache"))
    run_dir = tiny / "run"
    overrides = ["train.histogram_every=6", "precision.policy=mixed_float16", "runtime.steps_per_execution=4"]
    amptrain.fit(str(tiny / "tiny.toml"), overrides, run_dir=str(run_dir))
    found = histograms(run_dir)
    assert {step for _, step in found} == {6, 12}  # a graph call is cut at step 6
    weights = {tag for tag, step in found if tag.startswith("weights/") and step == 6}
    gradients = {tag for tag, step in found if tag.startswith("gradients/") and step == 6}
    assert len(weights) > 5 and {t.replace("gradients/", "weights/") for t in gradients} == weights
    # the loss scale (2**15) is taken back out: gradients of the size of the update, not 32768 times it
    for (tag, _), buckets in found.items():
        if tag.startswith("gradients/"):
            assert np.abs(buckets[:, :2]).max() < 100, tag
    assert any(np.abs(b[:, :2]).max() > 0 for (t, _), b in found.items() if t.startswith("gradients/"))
    train = [r["step"] for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert train == [4, 8, 12]  # the records keep their steps


def test_histograms_are_off_by_default(tiny):
    from amptrain import config as config_lib
    from amptrain.engine.histograms import Histograms

    config = config_lib.load_config(str(tiny / "tiny.toml"))
    assert config.train.histogram_every == 0
    assert Histograms.from_config(config.train, job=None, trainer=None, scalars=None) is None  # the loop holds none
