"""The "loop" gRPC engine: KServe v2 gRPC served by a lean HTTP/2 server on the asyncio loop.

Why not the libraries made for it: with grpc.aio, grpc core's poller threads hand every event of
an RPC to the event loop (~11 thread wake-ups per unary call), which cost ~3.2x the HTTP path's
server CPU per request on the benchmark MLP (`bench.cpu_per_request`: 1113 µs vs 350 µs); the
servicer itself is ~13% of it. grpclib (pure-Python HTTP/2 via h2) keeps everything on the loop
but still cost 830 µs vs 247 µs, ~45% of it in h2's state machine and grpclib's stream
machinery. gRPC's use of HTTP/2 is narrow (POST, one fixed response header block, DATA with
5-byte framed messages, trailers), so this package speaks just that, with `hpack` for header
decompression and nothing else from h2:

* `frames`: frame and message framing, pure bytes;
* `headers`: a client's header blocks, HPACK-decoded and held to RFC 9113 §8's field rules, pure;
* `messages`: a call's length-prefixed messages out of its DATA, pure;
* `connection`: one connection's state (preface, settings, streams, flow control), pure;
* `server`: the asyncio protocol and listener, generic over a method table;
* `methods`: that table from the shared servicer's `rpcs()` (`agent.api.grpc.service`), and the
  start-up.
"""

from agent.api.grpc.loop.methods import start_loop_grpc_server

__all__ = ["start_loop_grpc_server"]
