"""`callqa bench live`: a live-traffic capacity benchmark of the whole pipeline (see README.md here).

- ``traffic``: the calls (Poisson arrivals, two legs taking turns, ground truth per turn); pure.
- ``gateway``: sends them in real time as a media gateway does (μ-law, 20 ms frames, start/end events).
- ``probes``: what is read off the worker while it runs (/metrics, per-thread CPU, RSS).
- ``latency``: finals matched to the turns they transcribe; latency from the end of speech.
- ``live``: one load level, the search over levels, batch size 1 and the engine alone at the found load.
- ``report``: JSON, plot, tables.
"""
