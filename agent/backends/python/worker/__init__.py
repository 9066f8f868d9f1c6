"""What runs inside a Python model's worker process (`python -m agent.backends.python.worker.main`):
only numpy, `agent.pb_utils` and the pipe's wire (`agent.backends.python.ipc`) are imported."""
