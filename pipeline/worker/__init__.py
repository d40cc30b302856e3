"""The streaming worker: a thin faust shell (app.py) around a pure, Kafka-free core.

- ``reorder``  per-leg jitter buffer: duplicates dropped, gaps filled with silence, late frames counted
- ``offsets``  which input offsets may be committed (at-least-once without faust's ack bookkeeping)
- ``calls``    per-call and per-leg state: decode -> resample -> segment -> batch -> transcript
- ``metrics``  Prometheus metrics served at /metrics
- ``app``      the faust app: agents, web views, timers
"""
