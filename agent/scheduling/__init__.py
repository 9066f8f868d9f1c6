"""Batching and scheduling: the pure batch former, its asyncio driver, the deadline timer,
the rate limiter and per-model statistics."""
