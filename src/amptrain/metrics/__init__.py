"""Scores computed from predictions in plain Python: no TensorFlow, testable by hand."""
