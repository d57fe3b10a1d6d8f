"""Readers, vocabularies, the batch plan and the tf.data pipeline."""
