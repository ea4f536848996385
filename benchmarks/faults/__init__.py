"""The parts of `python -m benchmarks.fault_injection --target server`: a raw HTTP/1.1 client that
can misbehave (raw_http.py) and the hostile-input probes replayed against serve.py
(server_probes.py)."""
