"""Transports only: HTTP (aiohttp) and gRPC servers, their codecs, the /metrics endpoint.

A transport decodes, calls the data plane and encodes; no model logic lives here."""
