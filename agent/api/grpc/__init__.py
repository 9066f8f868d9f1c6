"""KServe v2 over gRPC: the servicer both engines run, its codecs, and the engines."""
