"""`callqa bench`: the benchmarks (see README.md here); the core they share, and one module per scenario.

- The core: ``workers`` (worker processes started, pinned, restarted and checked; a consumer group on fresh
  topics; the shared broker, started when none runs), ``store_fault`` (a worker whose store refuses inserts
  while a file exists), ``stores`` (several workers' stores read as one), ``traffic`` and ``sender`` (planned
  Poisson calls sent in real time; library calls replayed), ``probes`` (the sampler: CPU, RSS, /metrics),
  ``results`` (the result writer: machine, commit, date, settings beside the figures; the run's log folder);
  ``cli``: the `callqa bench` sub-commands; ``variants``: ``--variant setting=value`` settings.
- ``live`` (with ``benchmark``, ``latency``, ``report``): capacity under live call traffic; ``memory``: RSS per
  leg; ``scale_out``: 2 workers against 1, the rebalance pause, re-decoding after a crash; ``chaos``: calls
  through kills, a broker restart and a store outage; ``end_to_end``: a backlog and real time;
  ``gateway``: legs per gateway core.
- Engine benchmarks: ``accuracy``, ``asr``, ``moonshine``, and the scripts ``inference_process``,
  ``batch_order``, ``segment_counts``.
"""
