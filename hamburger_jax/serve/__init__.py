"""An OpenAI-compatible HTTP server for HAMburger decoding.

    python -m hamburger_jax.serve --ckpt smollm2           # or: python serve.py --ckpt smollm2

Layers, each with one job: engines.py (the decode engine: continuous batcher or one request at a
time; a router over a merged and a verified engine), worker.py (the thread that owns the engine
and all JAX work), service.py (a request's life: prompt ids in, text pieces and usage out),
text.py (detokenizing, stop strings), protocol.py (request validation, OpenAI errors),
responses.py (OpenAI response and stream bodies), app.py (the FastAPI routes, body limit), http.py
(connection guards: read deadlines, half-closed clients) and cli.py (flags, loading, uvicorn,
shutdown).
"""
