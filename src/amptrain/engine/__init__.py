"""The training engine: knows no task; runs a model, a loss, datasets and an evaluation."""
