"""Precision: policy selection and loss scaling."""
