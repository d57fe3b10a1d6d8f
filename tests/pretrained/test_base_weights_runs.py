"""LoRA runs on an int4 base end to end (slow: fits): the checkpoint holds the adapters alone
and names the base and how it was held; a run stopped and resumed ends with the adapters of
one that never stopped. (The export of such a base is test_base_weights.py's float twin.)"""

import threading

import numpy as np
import pytest
import tensorflow as tf
from pretrained.test_causal import folder
from pretrained.test_causal_runs import LORA_CONFIG, terminate_at
from pretrained.test_transformers_export_runs import data  # noqa: F401  (a fixture, shared)

import amptrain
from amptrain.engine.run_log import read_metrics
from amptrain.errors import Interrupted

pytestmark = pytest.mark.slow


def adapters_of(run):
    reader = tf.train.load_checkpoint(str(run / "checkpoints"))
    names = sorted(n for n in reader.get_variable_to_shape_map() if n.startswith("model/adapters/"))
    return reader, [reader.get_tensor(n) for n in names]


def test_an_int4_base_resumes_to_the_adapters_of_a_run_never_stopped(data, tmp_path):  # noqa: F811
    config = LORA_CONFIG.format(dir=data, pretrained=folder("llama3")).replace(f'test = "{data}/dev.txt"\n', "")
    config = config.replace("lora_rank = 4", 'lora_rank = 4\nbase_weights = "int4"')
    config = config.replace("steps = 30", "steps = 4").replace("checkpoint_every = 10", "checkpoint_every = 2")
    (tmp_path / "lora.toml").write_text(config, encoding="utf-8")
    amptrain.fit(str(tmp_path / "lora.toml"), run_dir=str(tmp_path / "whole"))
    stop = threading.Thread(target=terminate_at, args=(tmp_path / "resumed" / "checkpoints" / "ckpt-2.index",))
    stop.start()
    with pytest.raises(Interrupted):  # SIGTERM: a checkpoint at the step it lands, then out
        amptrain.fit(str(tmp_path / "lora.toml"), run_dir=str(tmp_path / "resumed"))
    stop.join()
    amptrain.fit(str(tmp_path / "lora.toml"), run_dir=str(tmp_path / "resumed"))
    assert [r for r in read_metrics(tmp_path / "resumed" / "metrics.jsonl") if r["kind"] == "run"][-1][
        "resumed_from_step"] >= 2  # fmt: skip
    reader, whole = adapters_of(tmp_path / "whole")
    _, resumed = adapters_of(tmp_path / "resumed")
    assert len(whole) == 3 * 2 * 2  # query, value, down of 2 layers; A and B
    assert all(np.array_equal(a, b) for a, b in zip(whole, resumed))
    names = reader.get_variable_to_shape_map()
    assert not [n for n in names if n.startswith("model/") and "adapters" not in n and "base_weights" not in n]
    assert reader.get_tensor("model/base_weights/.ATTRIBUTES/VARIABLE_VALUE").decode().endswith(" int4")
