"""`callqa bench`: the benchmarks (see README.md here); the core they share, and one module per scenario.

- The core: ``workers`` (worker processes started, pinned, restarted and checked; a consumer group on fresh
  topics; the shared broker, started when none runs), ``store_fault`` (a worker whose store refuses inserts
  while a file exists), ``stores`` (several workers' stores read as one), ``traffic`` and ``sender`` (planned
  Poisson calls sent in real time; library calls replayed), ``offered`` (the engine-level traffic: segments
  offered to a SegmentBatcher), ``topics`` (what the broker holds: the live finals tapped, a topic read to its
  end, the checkpoint topic's live keys), ``probes`` (the sampler: CPU, RSS, /metrics), ``results`` (the result writer:
  machine, commit, date, settings beside the figures; the run's log folder), ``tables`` (each result's tables,
  declared once: on the console after a run and in bench/README.md); ``cli``: the `callqa bench`
  sub-commands; ``variants``: ``--variant setting=value`` settings.
- ``live`` (with ``benchmark``, ``latency``, ``report``): capacity under live call traffic; ``memory``: RSS per
  leg; ``soak``: long load with rolling restarts; ``scale_out``: 2 workers against 1, the rebalance pause,
  re-decoding after a crash; ``chaos``: calls through kills, a broker restart and a store outage;
  ``end_to_end``: a backlog and real time; ``gateway``: legs per gateway core; ``consumer``: faust's agent
  against a batch consumer; ``search``: search and the call list at scale; ``recordings``: the redacted
  recordings; ``checks``: the long guards against their limits (`make bench-check`).
- Engine benchmarks: ``accuracy``, ``asr``, ``moonshine``, and the scripts ``inference_process``,
  ``batch_order``, ``segment_counts``.
"""
