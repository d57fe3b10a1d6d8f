import numpy as np
import pytest

from amptrain.config import ModelConfig
from amptrain.tasks.classification.model import build_classifier

MODEL = ModelConfig(num_layers=2, hidden_dim=16, num_heads=2, intermediate_dim=32, dropout=0.0)


def inputs(batch=2, length=8, pad_from=5):
    ids = np.arange(1, batch * length + 1, dtype=np.int32).reshape(batch, length) % 90 + 5
    mask = np.ones((batch, length), bool)
    mask[:, pad_from:] = False
    ids[~mask] = 0
    return {"token_ids": ids, "padding_mask": mask}


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_variables_and_logits_are_float32_under_every_policy(policy):
    model = build_classifier(vocabulary_size=96, max_length=16, num_classes=3, model_config=MODEL, dtype=policy)
    logits = model(inputs())
    assert str(logits.dtype) == "<dtype: 'float32'>" or "float32" in str(logits.dtype)
    assert {v.dtype for v in model.weights} == {"float32"}
    compute = {layer.compute_dtype for layer in model.layers if layer.name.startswith("block_")}
    assert compute == {policy.replace("mixed_", "")}


def test_padding_does_not_change_the_logits():
    model = build_classifier(vocabulary_size=96, max_length=16, num_classes=3, model_config=MODEL, dtype="float32")
    short = inputs(length=8, pad_from=5)
    longer = inputs(length=16, pad_from=5)
    longer["token_ids"][:, :8] = short["token_ids"]
    np.testing.assert_allclose(model(short).numpy(), model(longer).numpy(), atol=1e-5)
