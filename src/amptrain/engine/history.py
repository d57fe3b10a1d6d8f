"""A run's history as Keras's `model.fit` returns one (`amptrain.Trainer.fit()`), read from
the `epoch` records the fit loop writes when callbacks are given (`engine/loop.py`).

    history = History.of_run(run_dir, test_metrics)
    history.history["val_loss"], history.epoch, history.test
"""

import os

from amptrain.engine.run_log import read_metrics


class History:
    """What `Trainer.fit()` returns, as `model.fit` returns a `keras.callbacks.History`:
    `history` {"loss": [...], "val_loss": [...], "val_<metric>": [...]}, a value an epoch (an
    evaluation interval: `train.eval_every`, by default an epoch of the data), `epoch` their
    numbers from 0, `test` the best checkpoint's test metrics, `run_dir`. Read from the run's
    `metrics.jsonl`, so a resumed run's history holds the epochs before the resume too. The
    training split's own metrics are not computed while training: `loss` is the mean
    training loss of the epoch's steps."""

    def __init__(self, history, epoch, test, run_dir):
        self.history, self.epoch, self.test, self.run_dir = history, epoch, test, run_dir

    @classmethod
    def of_run(cls, run_dir, test):
        history, epochs = {}, []
        for record in read_metrics(os.path.join(run_dir, "metrics.jsonl")):
            if record.get("kind") != "epoch":
                continue
            epochs.append(record["epoch"])
            for key, value in record["logs"].items():
                history.setdefault(key, []).append(value)
        return cls(
            history,
            epochs,
            {k: v for k, v in test.items() if k not in ("kind", "step", "split", "checkpoint")},
            run_dir,
        )

    def __repr__(self):
        return f"History(epochs={len(self.epoch)}, keys={sorted(self.history)}, test={self.test})"
