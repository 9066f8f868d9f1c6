"""The Python backend: the agent's side of a Python model (its worker processes, their pipe,
BLS and decoupled streams); `worker/` is what runs inside the model's own process."""
