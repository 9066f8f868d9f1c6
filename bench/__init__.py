"""Benchmarks for edge-agent: raw ONNX Runtime vs. the agent under perf_analyzer.

Run `python -m bench` (or `make bench`); `python -m bench --help` lists the options.
"""
