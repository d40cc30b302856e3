"""`callqa bench`: the benchmarks (see README.md here); one module per benchmark, and what they share.

- ``cli``: the `callqa bench` sub-commands; ``results``: the result writer every benchmark uses (machine,
  commit, date, settings beside the figures; ``<name>.json`` the latest run, ``<name>.jsonl`` every run);
  ``variants``: ``--variant setting=value`` settings.
- ``live`` (with ``benchmark``, ``traffic``, ``sender``, ``probes``, ``latency``, ``report``): capacity under
  live call traffic. ``traffic``: the calls (Poisson arrivals, two legs taking turns, ground truth per turn);
  ``sender``: sends them in real time as a media gateway does (μ-law, 20 ms frames, start/end events);
  ``probes``: what is read off the worker while it runs; ``latency``: finals matched to the turns they
  transcribe; ``live``: one load level, the search, batch size 1 and the engine alone at the found load;
  ``benchmark``: the run from end to end; ``report``: its document, plot and tables.
- ``accuracy``: WER and digit sequences per set and condition, beside faster-whisper.
- ``asr``: the engine's speed per batch size and quantization, the window policy, the decoding options.
- ``scale_out``: workers in one consumer group: 2 against 1, the rebalance pause, re-decoding after a crash.
- ``end_to_end``: the whole pipeline on a backlog (batching, int8) and in real time.
"""
