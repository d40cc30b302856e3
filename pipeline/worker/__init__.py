"""The streaming worker: a thin faust shell (app.py) around a pure, Kafka-free core.

- ``reorder``      per-leg jitter buffer: duplicates dropped, gaps filled with silence, late frames counted
- ``legs``         one call leg: jitter buffer in front of the engine's leg front end (decode, 16 kHz, VAD)
- ``calls``        ``CallProcessor``: wires the stages a frame goes through (README.md has the path):
                   ``intake``, ``segmentation``, ``transcription``, ``release``, ``call_outputs``,
                   ``lifecycle``, ``registry``, ``durability``, ``tasks``
- ``ports``        the processor's ports: ``OutputPort``, ``SegmentTranscriber`` and its ``Transcription``
- ``state``        ``CallState`` (per call: events, legs, analyzer, pending tasks), segment ids, watermarks
- ``budget``       ``InflightBudget``: back-pressure on audio submitted for inference
- ``clock``        stream time per partition and the decision to close a call (end, abort, timeout)
- ``partials``     partial transcripts of open segments
- ``outputs``      contract messages and store rows built from results
- ``dead_letters`` references to what could not be processed, and one-line error descriptions
- ``offsets``      which input offsets may be committed (at-least-once without faust's ack bookkeeping)
- ``transcriber``  the shared SegmentBatcher as the worker sees it, with hot model reload
- ``metrics``      Prometheus metrics served at /metrics
- ``app``          the faust app: agents, timers, web views
"""
