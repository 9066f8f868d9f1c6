"""KServe v2 over HTTP/1.1 (aiohttp, with the infer lane in front of it)."""
