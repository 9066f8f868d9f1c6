"""Inference backends: each runs one loaded model version."""
