"""Keras 3 models built from shared blocks; one thin head a task."""
