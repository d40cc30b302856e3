"""`callqa bench`: the benchmarks (not tests). Each prints its tables and writes bench/results/<name>.json
(the latest run) and a line of bench/results/<name>.jsonl (every run), or the same under --out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

bench_app = typer.Typer(no_args_is_help=True, short_help="Benchmarks (not tests): capacity, accuracy, speed, scale-out.",
                        help=__doc__)
console = Console()

OUT_HELP = "Folder for <name>.json and <name>.jsonl (default bench/results)."
Out = Annotated[Path | None, typer.Option(help=OUT_HELP)]


def _wrote(paths: list[Path]) -> None:
    for path in paths:
        console.print(f"wrote {path}")


def _done(doc: dict[str, Any], paths: list[Path]) -> None:
    """A run's tables (by the spec bench/README.md shows its result file with), then the files it wrote."""
    from pipeline.bench.tables import show

    show(doc, console, paths[0].stem if paths else None)
    _wrote(paths)


def _cores(text: str) -> tuple[int, ...]:
    """--cores as core numbers, or a usage error naming what is wrong with it."""
    from pipeline.bench.workers import parse_cores

    try:
        return parse_cores(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


@bench_app.command("live")
def bench_live(
    calls: Annotated[int, typer.Option(help="Concurrent calls (legs = 2 x calls); with --search, where it starts.")] = 6,
    search: Annotated[bool, typer.Option(
        "--search", help="Find the most concurrent calls held with P99 <= --p99-max-s and lag not growing; "
                         "then, at that load, max_batch 1 and the engine alone.")] = False,
    compare: Annotated[bool, typer.Option(
        "--compare", help="Without --search: also max_batch 1 and the engine alone at --calls.")] = False,
    warmup_s: Annotated[float, typer.Option(help="Traffic before the steady window (s).")] = 30.0,
    hold_s: Annotated[float, typer.Option(help="The steady window everything is measured over (s).")] = 120.0,
    cores: Annotated[str, typer.Option(help="CPU list the worker is pinned to (taskset), e.g. 0 or 0-1; "
                                            "default: every core.")] = "",
    workers: Annotated[int, typer.Option(help="Worker processes in the level's consumer group, the cores shared "
                                              "out among them (2 workers on 0-1: one core each).")] = 1,
    p99_max_s: Annotated[float, typer.Option(help="Highest P99 final latency a level may have (s).")] = 1.5,
    max_calls: Annotated[int, typer.Option(help="--search goes no higher.")] = 256,
    seed: Annotated[int, typer.Option(help="Traffic seed: the same seed and calls give the same calls.")] = 1,
    variant: Annotated[list[str] | None, typer.Option(
        help="Also the same traffic at the level (with --search: at the found load) with these worker settings, "
             "e.g. --variant max_batch=8 --variant endpoint_silence_ms=400,beam_size=1 (repeatable; several "
             "settings comma-separated): CPU per speech second and P99 beside the base's.")] = None,
    desk: Annotated[bool, typer.Option(
        "--desk", help="Also a `callqa desk` on each level's topics and a client of its live stream: when each spoken "
                       "word (ends by faster-whisper's word timestamps) first reached it, partial or final; "
                       "with partials on (CALLQA_PARTIAL_INTERVAL_MS or --variant partial_interval_ms=...).")] = False,
    out: Annotated[Path | None, typer.Option(help="Folder for live.json, live.jsonl and live.png "
                                                  "(default bench/results).")] = None,
) -> None:
    """Capacity: live call traffic through the broker and workers.

    Poisson call arrivals sent in real time as a gateway sends them; final latency from the end of speech, throughput, the workers' CPU and memory; --search finds the most calls held under the P99 bound."""
    from pipeline.bench.benchmark import BenchOptions, run_benchmark, variant_config
    from pipeline.bench.live import LevelConfig
    from pipeline.bench.results import RESULTS
    from pipeline.bench.variants import BadVariant

    if calls < 1 or workers < 1 or hold_s <= 0 or warmup_s < 0:
        raise typer.BadParameter("--calls and --workers must be >= 1, --hold-s > 0 and --warmup-s >= 0")
    pinned = _cores(cores)
    level = LevelConfig(calls=calls, cores=pinned, warmup_s=warmup_s, hold_s=hold_s, seed=seed, p99_max_s=p99_max_s,
                        workers=workers, desk=desk)
    options = BenchOptions(level, search=search, compare=compare, max_calls=max_calls, out=out or RESULTS,
                           variants=tuple(variant or ()))
    try:
        for spec in options.variants:
            variant_config(level, spec)  # one line why, before anything starts
    except BadVariant as exc:
        raise typer.BadParameter(str(exc)) from exc
    _done(*run_benchmark(options, console))


@bench_app.command("memory")
def bench_memory(
    step_calls: Annotated[int, typer.Option(help="Calls added to the worker at each step (2 legs each).")] = 6,
    steps: Annotated[int, typer.Option(help="Steps of calls added (legs: 0, N, 2N, ...).")] = 3,
    step_s: Annotated[float, typer.Option(help="Each step's length (s); its last --window-s is its figure.")] = 80.0,
    window_s: Annotated[float, typer.Option(help="The end of each step the RSS is taken over (s).")] = 30.0,
    idle_s: Annotated[float, typer.Option(help="The worker idle before the first calls (s).")] = 30.0,
    cores: Annotated[str, typer.Option(help="CPU list the worker is pinned to (taskset); default: every core.")] = "",
    seed: Annotated[int, typer.Option(help="Seed of the calls.")] = 1,
    out: Out = None,
) -> None:
    """Memory per live leg: legs added to one running worker.

    One worker, idle, then --step-calls calls added every --step-s seconds (none ending): its RSS (/proc) and its own count of live legs at 0, N, 2N legs; MB per leg added (goal <= 2)."""
    from pipeline.bench.memory import MemoryOptions, run_memory
    from pipeline.bench.results import RESULTS

    if step_calls < 1 or steps < 1 or window_s <= 0 or step_s <= window_s or idle_s < window_s:
        raise typer.BadParameter("--step-calls and --steps >= 1, --step-s > --window-s > 0, --idle-s >= --window-s")
    pinned = _cores(cores)
    options = MemoryOptions(step_calls=step_calls, steps=steps, idle_s=idle_s, step_s=step_s, window_s=window_s,
                            cores=pinned, seed=seed, out=out or RESULTS)
    _done(*run_memory(options, console))


@bench_app.command("accuracy")
def bench_accuracy(
    sets: Annotated[str, typer.Option(help="Comma-separated: eval, asterisk, library-numbers, library-legs.")] =
        "eval,asterisk,library-numbers",
    conditions: Annotated[str, typer.Option(help="Comma-separated: 16k, 8k, 8k-mulaw, 8k-alaw.")] =
        "16k,8k,8k-mulaw,8k-alaw",
    reference: Annotated[bool, typer.Option(help="Also faster-whisper on the same weights and audio.")] = True,
    threads: Annotated[int, typer.Option(help="Intra-op threads (ours) and cpu_threads (faster-whisper).")] = 2,
    variant: Annotated[list[str] | None, typer.Option(
        help="Also ours with these settings, e.g. --variant context_tokens=64 --variant beam_size=5 "
             "(repeatable; several settings comma-separated).")] = None,
    reference_beams: Annotated[str, typer.Option(help="Comma-separated beam sizes of faster-whisper runs.")] = "1",
    models: Annotated[str, typer.Option(help="Comma-separated other models, a column each (\"\" for none).")] =
        "moonshine-tiny,moonshine-base",
    ours: Annotated[bool, typer.Option(help="The model setting's column (--no-ours: only --models and the reference).")] = True,
    out: Out = None,
) -> None:
    """WER and digits per set and condition, beside faster-whisper.

    Ours (and its --variant settings) and faster-whisper on the same weights and audio, per evaluation set and telephony condition: corpus WER and digit sequences exact."""
    from pipeline.bench.accuracy import AccuracyOptions, run_accuracy
    from pipeline.bench.results import RESULTS
    from pipeline.bench.variants import BadVariant

    try:
        beams = tuple(int(b) for b in _split(reference_beams))
    except ValueError as exc:
        raise typer.BadParameter(f"--reference-beams {reference_beams!r}: use beam sizes such as 1,5") from exc
    options = AccuracyOptions(sets=_split(sets), conditions=_split(conditions), reference=reference, threads=threads,
                              variants=tuple(variant or ()), reference_beams=beams, models=_split(models), ours=ours,
                              out=out or RESULTS)
    try:
        doc, paths = run_accuracy(options, console)
    except BadVariant as exc:
        raise typer.BadParameter(str(exc)) from exc
    _done(doc, paths)


@bench_app.command("moonshine")
def bench_moonshine(
    threads: Annotated[int, typer.Option(help="Intra-op threads.")] = 1,
    out: Out = None,
) -> None:
    """What Moonshine costs per speech-second, batch 1 and batched, built graphs beside the shipped ones.

    Moonshine tiny-en (fp32, int8) and base-en (fp32, weight casts folded), and each as its package ships it, on the 20 evaluation utterances in 8 kHz mu-law."""
    from pipeline.bench.moonshine import MoonshineBenchOptions, run_moonshine
    from pipeline.bench.results import RESULTS

    _done(*run_moonshine(MoonshineBenchOptions(threads=threads, out=out or RESULTS), console))


@bench_app.command("redaction")
def bench_redaction(
    rounds: Annotated[int, typer.Option(min=1, help="How many times the library's turns are redacted.")] = 20,
    core: Annotated[int | None, typer.Option(help="Pin the run to this CPU core.")] = None,
    out: Out = None,
) -> None:
    """What redacting a final costs per segment on one core: the call library's turns, each timed alone."""
    from pipeline.bench.redaction import RedactionBenchOptions, run_redaction
    from pipeline.bench.results import RESULTS

    _done(*run_redaction(RedactionBenchOptions(rounds=rounds, core=core, out=out or RESULTS), console))


@bench_app.command("recordings")
def bench_recordings(out: Out = None) -> None:
    """The call library's PII calls as redacted recordings: where the cuts land, leaks heard again, WER, size."""
    from pipeline.bench.recordings import RecordingsOptions, run_recordings
    from pipeline.bench.results import RESULTS

    _done(*run_recordings(RecordingsOptions(out=out or RESULTS), console))


@bench_app.command("consumer")
def bench_consumer(
    audio_s: Annotated[float, typer.Option(help="The backlog's leg audio per message span (s): 6000 s are 300,000 "
                                                "messages of 20 ms, 30,000 of 200 ms.")] = 6000.0,
    live_calls: Annotated[int, typer.Option(help="Calls of the live runs, sent in real time (0: backlog only).")] = 28,
    live_s: Annotated[float, typer.Option(help="Length of the live runs' calls (s).")] = 20.0,
    repeat: Annotated[int, typer.Option(help="Runs per path, span and traffic (the median is kept).")] = 3,
    out: Annotated[Path | None, typer.Option(help="Folder for consumer.json and consumer.jsonl "
                                                  "(default bench/results/consumer).")] = None,
) -> None:
    """faust's per-message path against a batch consumer in the same faust app.

    The same audio messages, at 20 and 200 ms per message, as a backlog and sent live, read by a faust app's agent (the worker's take_events) and by a confluent-kafka batch loop in a task's thread, each run a process of its own: CPU per 1,000 messages and per audio second, messages/s, batch/agent."""
    from pipeline.bench.consumer import ConsumerBenchOptions, run_consumer
    from pipeline.bench.results import RESULTS

    if audio_s <= 0 or live_calls < 0 or live_s <= 0 or repeat < 1:
        raise typer.BadParameter("--audio-s and --live-s must be > 0, --live-calls >= 0 and --repeat >= 1")
    options = ConsumerBenchOptions(audio_s=audio_s, live_calls=live_calls, live_s=live_s, repeat=repeat,
                                   out=out or RESULTS / "consumer")
    _done(*run_consumer(options, console))


@bench_app.command("live-desk")
def bench_live_desk(
    calls: Annotated[str, typer.Option(help="Calls in progress of each level, comma-separated.")] = "100,200",
    window_s: Annotated[float, typer.Option(help="Measured window per level (s).")] = 30.0,
    browser: Annotated[bool, typer.Option(help="Keep Chromium's wall open on all calls and measure its script time.")] = True,
    pages: Annotated[int, typer.Option(help="Call pages open in Chromium beside the wall, timing each turn into "
                                            "their DOM.")] = 20,
    out: Out = None,
) -> None:
    """The live desk under N calls in progress: release-to-browser latency, Chromium's wall, the desk's CPU per call.

    A `callqa desk` follows topics a generator fills as workers would (a summary and a partial per call a second, a final every 4 s); goal: final release to browser (the call pages' DOM) P99 <= 300 ms at 100 calls, the wall responsive at 200."""
    from pipeline.bench.live_desk import LiveDeskOptions, run_live_desk
    from pipeline.bench.results import RESULTS

    levels = tuple(int(c) for c in _split(calls))
    if not levels or min(levels) < 1 or window_s <= 0 or pages < 0:
        raise typer.BadParameter("--calls must list counts >= 1, --window-s be > 0 and --pages >= 0")
    _done(*run_live_desk(LiveDeskOptions(calls=levels, window_s=window_s, browser=browser, pages=pages,
                                         out=out or RESULTS), console))


@bench_app.command("search")
def bench_search(
    calls: Annotated[int, typer.Option(help="Generated calls in the store (6-20 turns each).")] = 100_000,
    repeat: Annotated[int, typer.Option(help="Times each query is timed.")] = 15,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the filled store (its folder is printed).")] = False,
    out: Out = None,
) -> None:
    """Search and the call list on a store of generated calls: P50/P95 through the API's checked path.

    Phrase searches with and without filters, pages of the call list, and the same searches with the skip indexes off (a scan); goal P95 <= 300 ms at 100,000 calls."""
    from pipeline.bench.results import RESULTS
    from pipeline.bench.search import SearchBenchOptions, run_search_bench

    if calls < 1 or repeat < 1:
        raise typer.BadParameter("--calls and --repeat must be at least 1")
    _done(*run_search_bench(SearchBenchOptions(calls=calls, repeat=repeat, keep=keep, out=out or RESULTS), console))


@bench_app.command("asr")
def bench_asr(
    repeat: Annotated[int, typer.Option(help="Times the 20 evaluation utterances are repeated.")] = 2,
    threads: Annotated[int, typer.Option(help="Intra-op threads (ours) and cpu_threads (faster-whisper).")] = 2,
    load: Annotated[float, typer.Option(help="The batcher run's offered audio seconds per second.")] = 8.0,
    windows: Annotated[bool, typer.Option("--windows", help="Measure the encoder window policy instead "
                                                            "(result asr-windows).")] = False,
    decoding_options: Annotated[bool, typer.Option(
        "--options", help="Measure the decoding options (context, beam 5, base) against the default instead "
                          "(result asr-options).")] = False,
    out: Out = None,
) -> None:
    """Engine speed, batch 1-16, int8/fp32, beside faster-whisper.

    Audio seconds per wall and CPU second and WER on the same segments, the batcher's latency under Poisson arrivals, peak RSS; --windows the window policy, --options the decoding options instead."""
    from pipeline.bench.asr import AsrOptions, run_options, run_speed, run_windows
    from pipeline.bench.results import RESULTS

    if repeat < 1 or threads < 0 or load <= 0:
        raise typer.BadParameter("--repeat must be >= 1, --threads >= 0 and --load > 0")
    if windows and decoding_options:
        raise typer.BadParameter("--windows and --options are two runs: give one")
    options = AsrOptions(repeat=repeat, threads=threads, load=load, out=out or RESULTS)
    run = run_windows if windows else run_options if decoding_options else run_speed
    _done(*run(options, console))


@bench_app.command("scale-out")
def bench_scale_out(
    calls: Annotated[int, typer.Option(help="Backlog calls of the throughput runs (0: 24, or 4 with --quick).")] = 0,
    quick: Annotated[bool, typer.Option("--quick", help="Small smoke sizes (minutes; figures not meaningful).")] = False,
    live_calls: Annotated[int, typer.Option(
        help="Real-time calls under the rebalance, one per partition (more than half the partitions, so the "
             "joining worker gets some).")] = 12,
    join_after_s: Annotated[float, typer.Option(help="Live load on worker A before B joins (s).")] = 20.0,
    long_call_s: Annotated[float, typer.Option(help="Length of the call killed near its end (s).")] = 600.0,
    live_tail_s: Annotated[float, typer.Option(help="Its last seconds, sent in real time (s).")] = 120.0,
    kill_before_end_s: Annotated[float, typer.Option(help="kill -9 this long before its end (s).")] = 20.0,
    skip_throughput: Annotated[bool, typer.Option("--skip-throughput", help="Leave out part 1.")] = False,
    skip_rebalance: Annotated[bool, typer.Option("--skip-rebalance", help="Leave out part 2.")] = False,
    skip_crash: Annotated[bool, typer.Option("--skip-crash", help="Leave out part 3.")] = False,
    out: Out = None,
) -> None:
    """2 workers vs 1, the rebalance pause, re-decoding after kill -9.

    Workers in one consumer group on the real broker: throughput of 2 pinned workers against 1, the pause in finals when a worker joins a live load, the audio decoded again after a crash near a long call's end."""
    from pipeline.bench.results import RESULTS
    from pipeline.bench.scale_out import ScaleOutOptions, run_scale_out

    options = ScaleOutOptions(calls=calls, quick=quick, live_calls=live_calls, join_after_s=join_after_s,
                              long_call_s=long_call_s, live_tail_s=live_tail_s, kill_before_end_s=kill_before_end_s,
                              throughput=not skip_throughput, rebalance=not skip_rebalance, crash=not skip_crash,
                              out=out or RESULTS)
    _done(*run_scale_out(options))


@bench_app.command("chaos")
def bench_chaos(
    duration_s: Annotated[float, typer.Option(help="Live traffic: calls start over this long (s).")] = 240.0,
    calls: Annotated[int, typer.Option(help="Library calls (about a minute each, replayed in real time).")] = 16,
    workers: Annotated[int, typer.Option(help="Workers of the consumer group.")] = 3,
    fault_every_s: Annotated[float, typer.Option(help="A worker is killed (-9) or stopped (SIGTERM) this often (s).")]
    = 30.0,
    outage_s: Annotated[float, typer.Option(help="How long the store refuses writes, once (s).")] = 20.0,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the stores and broker data (logs are always kept).")]
    = False,
    out: Out = None,
) -> None:
    """Workers killed, stopped, a broker restart, a store outage.

    Live library calls to 3 workers on a broker of the run's own; every 30 s a worker is killed (-9) or SIGTERM'd and restarted, the broker restarted once, the store refusing writes for 20 s once. Every call's finals and QA against `callqa analyze`, exactly once; PII in topics, tables, logs; re-decoded audio, the longest stall of live finals, the checkpoint topic's size."""
    from pipeline.bench.chaos import BenchChaosOptions, run_bench_chaos
    from pipeline.bench.results import RESULTS

    if duration_s <= 0 or calls < 1 or workers < 2 or fault_every_s <= 0 or outage_s <= 0:
        raise typer.BadParameter("--duration-s, --fault-every-s, --outage-s > 0, --calls >= 1, --workers >= 2")
    options = BenchChaosOptions(duration_s, calls, workers, fault_every_s, outage_s, keep, out or RESULTS)
    _done(*run_bench_chaos(options, console.print))


@bench_app.command("soak")
def bench_soak(
    minutes: Annotated[float, typer.Option(help="Live traffic after the warm-up (min).")] = 60.0,
    calls: Annotated[int, typer.Option(help="Concurrent calls (0: 70 % of what the latest bench live --search "
                                            "with the workers' model held).")] = 0,
    workers: Annotated[int, typer.Option(help="Workers of the consumer group: the first runs throughout, the "
                                              "others are restarted in turn.")] = 2,
    restart_every_s: Annotated[float, typer.Option(help="A worker is stopped (SIGTERM) and started again this "
                                                        "often (s).")] = 300.0,
    interval_s: Annotated[float, typer.Option(help="One row of the time series this often (s).")] = 60.0,
    warmup_s: Annotated[float, typer.Option(help="Traffic before the measured time (s).")] = 60.0,
    cores: Annotated[str, typer.Option(help="CPU list shared out among the workers (taskset), e.g. 0-1; "
                                            "default: not pinned.")] = "",
    seed: Annotated[int, typer.Option(help="Traffic seed.")] = 1,
    static: Annotated[bool, typer.Option(help="Static group membership (a restart moves no partition); "
                                              "--no-static: every restart rebalances the group.")] = True,
    standby: Annotated[bool, typer.Option(help="A static member's restart starts its successor first, which "
                                               "takes over when the old one exits; --no-standby: stop, then "
                                               "start.")] = True,
    out: Out = None,
) -> None:
    """Long live load with rolling restarts: does memory, latency or any topic grow?

    Live traffic (70 % of the found capacity by default) for --minutes through 2 workers, one restarted every 5 minutes; every minute each worker's RSS, open files and threads, the finals' P99, the lag, the checkpoint topic and the topics' bytes on disk. Met when the long-lived worker's RSS grows <= 5 %, the P99 of the last ten minutes is within 20 % of the first ten's, a restart's next minute has a P99 within 1.5x the P99 between restarts, and every turn got its final."""
    from pipeline.bench.results import RESULTS
    from pipeline.bench.soak import SoakConfig, default_calls, run_soak
    from pipeline.config import Settings

    if minutes <= 0 or calls < 0 or workers < 1 or restart_every_s <= 0 or interval_s <= 0 or warmup_s < 0:
        raise typer.BadParameter("--minutes, --restart-every-s, --interval-s > 0; --calls, --warmup-s >= 0; "
                                 "--workers >= 1")
    pinned = _cores(cores)
    if calls == 0:
        calls, why = default_calls(Settings().model, out or RESULTS)
        console.print(f"--calls {calls}: {why}")
    config = SoakConfig(minutes=minutes, calls=calls, cores=pinned, workers=workers, restart_every_s=restart_every_s,
                        interval_s=interval_s, warmup_s=warmup_s, seed=seed, static_membership=static,
                        standby=standby)
    _done(*run_soak(config, console, out or RESULTS))


@bench_app.command("end-to-end")
def bench_end_to_end(
    calls: Annotated[int, typer.Option(help="Calls of the capacity (backlog) runs.")] = 24,
    realtime_calls: Annotated[int, typer.Option(
        help="Concurrent real-time calls of the latency run (keep it under the capacity).")] = 6,
    out: Out = None,
) -> None:
    """The sample calls as a backlog (batch 16, 1, int8), then live.

    Call-audio seconds the worker finishes per wall second at max_batch 16, max_batch 1 and int8, then end-to-end latency percentiles with calls replayed in real time."""
    from pipeline.bench.end_to_end import EndToEndOptions, run_end_to_end
    from pipeline.bench.results import RESULTS

    if calls < 1 or realtime_calls < 1:
        raise typer.BadParameter("--calls and --realtime-calls must be >= 1")
    _done(*run_end_to_end(EndToEndOptions(calls=calls, realtime_calls=realtime_calls, out=out or RESULTS),
                              console))


@bench_app.command("gateway")
def bench_gateway(
    legs: Annotated[str, typer.Option(help="Comma-separated levels of concurrent live legs (2 per Twilio call).")]
    = "200,500,800",
    warmup_s: Annotated[float, typer.Option(help="Load before the measured window (s).")] = 10.0,
    window_s: Annotated[float, typer.Option(help="The measured window (s).")] = 30.0,
    gateway_cpus: Annotated[str, typer.Option(help="CPU list the gateway is pinned to (taskset).")] = "0",
    simulator_cpus: Annotated[str, typer.Option(help="CPU list the simulator processes are pinned to.")] = "1",
    simulators: Annotated[int, typer.Option(help="Simulator processes sharing the calls.")] = 2,
    protocol: Annotated[str, typer.Option(help="twilio (Media Streams calls, results gateway.json) or siprec "
                                               "(SIPREC sessions of 2 RTP streams, results gateway-siprec.json).")]
    = "twilio",
    out: Out = None,
) -> None:
    """Live legs per gateway core: CPU, RSS and added latency.

    N concurrent Twilio legs (or N/2 SIPREC sessions, --protocol siprec) in real time through a `callqa gateway` pinned to one core, the simulators on another: the gateway's CPU and RSS per leg (/proc), P50/P99 frame received -> Kafka acknowledged (/metrics), how late the simulators ran."""
    from pipeline.bench.gateway import GatewayBenchOptions, run_gateway_bench
    from pipeline.bench.results import RESULTS

    try:
        levels = tuple(int(x) for x in _split(legs))
    except ValueError as exc:
        raise typer.BadParameter("--legs is a comma-separated list of numbers") from exc
    if not levels or min(levels) < 2 or window_s <= 0 or simulators < 1 or protocol not in ("twilio", "siprec"):
        raise typer.BadParameter("--legs >= 2 each, --window-s > 0, --simulators >= 1, --protocol twilio or siprec")
    options = GatewayBenchOptions(levels, warmup_s, window_s, gateway_cpus, simulator_cpus, simulators, out or RESULTS,
                                  protocol)  # type: ignore[arg-type]
    _done(*run_gateway_bench(options, console))


@bench_app.command("readme")
def bench_readme(
    results: Annotated[Path | None, typer.Option(help="Folder of result documents (default bench/results).")] = None,
    out: Annotated[Path | None, typer.Option(help="The file written (default: README.md beside the results folder, bench/README.md).")] = None,
) -> None:
    """bench/README.md from bench/results/: every benchmark's latest run as tables.

    One section per result document (the top-level <name>.json files, then the studies' in subfolders): the command, when, the commit, the machine, the figures. Generated: run it again after a benchmark instead of editing the file."""
    from pipeline.bench.results import RESULTS
    from pipeline.bench.tables import render

    folder = results or RESULTS
    if not folder.is_dir():
        raise typer.BadParameter(f"{folder} is not a folder of results")
    target = out or folder.parent / "README.md"
    target.write_text(render(folder, target))
    _wrote([target])


@bench_app.command("check")
def bench_check(
    only: Annotated[str, typer.Option(help="Comma-separated checks to run (default: all, in order): "
                                           "library-numbers, asterisk, library-legs, library-offline, beam-reference, "
                                           "long-call, chaos, library-live.")] = "",
    out: Out = None,
) -> None:
    """The long accuracy and churn measurements the test suite runs a slice of, each against its limits.

    Writes check.json (met / not met per check, its figures, limits and misses) and exits 1 when a check is not met. About 40 minutes on 2 cores; `make bench-check` runs it."""
    from pipeline.bench.checks import CHECKS, CheckOptions, run_checks, unknown_checks
    from pipeline.bench.results import RESULTS

    names = _split(only) or tuple(CHECKS)
    if problem := unknown_checks(names):
        raise typer.BadParameter(problem)
    doc, paths = run_checks(CheckOptions(names=names, out=out or RESULTS), console)
    _done(doc, paths)
    if not doc["met"]:
        raise typer.Exit(1)
