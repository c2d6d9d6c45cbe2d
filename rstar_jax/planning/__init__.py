"""Ahead-of-time scale planning (memory / FLOPs of the learner steps on a fake mesh; the sampler's
KV cache, `kv_cache`)."""
