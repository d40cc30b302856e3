"""The streaming worker: a thin faust shell (app.py) around a pure, Kafka-free core.

- ``reorder``      per-leg jitter buffer: duplicates dropped, gaps filled with silence, late frames counted
- ``legs``         one call leg: jitter buffer in front of the engine's leg front end (decode, 16 kHz, VAD)
- ``calls``        call state and lifecycle, segments to the shared batcher, outputs, durability
- ``offsets``      which input offsets may be committed (at-least-once without faust's ack bookkeeping)
- ``transcriber``  the shared SegmentBatcher as the worker sees it, with hot model reload
- ``metrics``      Prometheus metrics served at /metrics
- ``app``          the faust app: agents, timers, web views
- ``process``      a worker child process and its read-only API (demo, tests, benchmarks)
"""
