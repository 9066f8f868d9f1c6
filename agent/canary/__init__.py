"""Canary rollouts: the pure split-and-judge policy and the controller that applies it."""
