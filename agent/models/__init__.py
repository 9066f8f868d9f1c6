"""Loaded models: the registry (state table), the loader (build, fit to memory, warm up),
model control (load, unload, hot swap) and cache control (activate cached versions)."""
