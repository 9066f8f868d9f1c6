"""edge-agent: serve Triton-style model repositories over KServe v2 on small devices."""

__version__ = "0.1.0"
