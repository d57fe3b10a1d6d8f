"""`runtime.profile_steps`: the range rounded to whole graph calls (the profiler faked), and a
tiny fit whose trace is read back with TensorFlow's own XPlane reader."""

import glob
import logging
import os

import pytest
import tensorflow as tf

import amptrain
from amptrain import config as config_lib
from amptrain.engine.profiling import StepProfiler
from amptrain.engine.run_log import LOGGER_NAME


@pytest.fixture
def fake_profiler(monkeypatch, caplog):
    """tf.profiler faked; the run log (which does not propagate) seen by caplog."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(caplog.handler)
    # setLevel, not the attribute: it also clears the logger's isEnabledFor cache, which an
    # earlier INFO line under the default WARNING level (another test's fit) filled with False.
    level = logger.level
    logger.setLevel(logging.INFO)
    calls = []
    monkeypatch.setattr(tf.profiler.experimental, "start", lambda logdir: calls.append(("start", logdir)))
    monkeypatch.setattr(tf.profiler.experimental, "stop", lambda: calls.append(("stop",)))
    yield calls
    logger.setLevel(level)
    logger.removeHandler(caplog.handler)


def drive(profiler, chunks):
    """Graph calls of `chunks` steps each, as the loop makes them."""
    step = 0
    for n in chunks:
        profiler.before_call(step, n)
        step += n
        profiler.after_call(step)
    profiler.stop(step)  # the loop's `finally`: a no-op once stopped


def test_the_range_is_rounded_out_to_whole_graph_calls(fake_profiler, caplog):
    profiler = StepProfiler(6, 9, "tb")
    drive(profiler, [3, 1, 3, 1, 3, 1])  # steps_per_execution 3 cut at the log interval 4
    assert fake_profiler == [("start", "tb"), ("stop",)]
    assert profiler.traced_from == 5  # the call of steps 5..7 holds step 6
    assert "profiled steps 5..11" in caplog.text and "rounded out to whole graph calls" in caplog.text


def test_an_exact_range_and_a_run_that_ends_inside_it(fake_profiler, caplog):
    drive(StepProfiler(2, 3, "tb"), [1, 1, 1, 1])
    assert "profiled steps 2..3 into tb/plugins/profile\n" in caplog.text + "\n"
    drive(StepProfiler(3, 50, "tb"), [2, 2])
    assert "profiled steps 3..4" in caplog.text and "the run ended at step 4" in caplog.text
    assert fake_profiler == [("start", "tb"), ("stop",)] * 2


def test_off_means_no_profiler(tiny):
    config = config_lib.load_config(str(tiny / "tiny.toml"))
    assert config.runtime.profile_steps == [] and StepProfiler.from_config(config.runtime, "tb") is None


def test_a_profiled_fit_writes_a_trace_that_names_the_model_ops(tiny):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    run_dir = tiny / "run"
    overrides = ["runtime.profile_steps=[6, 9]", "runtime.steps_per_execution=3", "precision.policy=float32"]
    amptrain.fit(str(tiny / "tiny.toml"), overrides, run_dir=str(run_dir))
    assert "profiled steps 5..11" in (run_dir / "train.log").read_text()
    traces = glob.glob(os.path.join(run_dir, "tensorboard", "plugins", "profile", "*", "*.xplane.pb"))
    assert len(traces) == 1
    space = xplane_pb2.XSpace()
    with open(traces[0], "rb") as f:
        space.ParseFromString(f.read())
    names = {m.name for plane in space.planes for m in plane.event_metadata.values()}
    # the model's own layers and the training step's ops, as TensorFlow names them
    assert any("attention" in name for name in names), sorted(names)[:50]
    assert any("MatMul" in name for name in names)
