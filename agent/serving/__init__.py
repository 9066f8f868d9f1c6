"""The data plane shared by every transport: infer, metadata, readiness, response cache, shared
memory."""
