"""Root fixtures shared by every test package.

chdb (the embedded ClickHouse engine) allows one data path per process, so the whole pytest session
shares one path; tests isolate themselves with a database of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from clickhouse_connect.driver.client import Client
from hypothesis import HealthCheck, settings
from xdist.scheduler import LoadFileScheduling

from pipeline.store.client import connect
from pipeline.store.migrations import migrate

# pytest-xdist's workers start with COLUMNS=80 in their environment, which no terminal set: the CLI's
# tables would fit 80 columns in every test run in parallel, and not when run alone.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)


# Workers and engines the tests start decode in-process (CALLQA_INFERENCE_PROCESSES=0): the default (auto)
# gives every worker on 2+ cores two child processes that each hold the model, ~1 GB more for each of the
# up to a dozen workers the suite runs at once. The default path has tests of its own, which say so
# (tests/asr/test_inference_process.py; tests/worker/test_pipeline.py starts a worker on the default).
os.environ.setdefault("CALLQA_INFERENCE_PROCESSES", "0")


# Workers, engines and commands the tests start run Whisper tiny.en, not the default model (Moonshine base,
# 1.1-1.6x the CPU): most tests are of the pipeline, not of the model, and their figures (WER ceilings, texts)
# were measured on tiny.en. The default model has tests of its own, which start it by name
# (tests/worker/test_default_model.py: a library call through a worker equals its offline analysis, under a
# WER ceiling; tests/asr/test_moonshine.py), and `callqa bench check` measures it whole.
os.environ.setdefault("CALLQA_MODEL", "tiny.en")


# The property-based fuzzers (tests/*/test_fuzz.py): the same examples on every run (a CI failure reproduces
# here; no example database), CALLQA_FUZZ_EXAMPLES of them per property (200; raise it for a longer hunt).
settings.register_profile("callqa", max_examples=int(os.environ.get("CALLQA_FUZZ_EXAMPLES", "200")),
                          derandomize=True, database=None, deadline=timedelta(seconds=2),
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("callqa")


# Fixtures that load faster-whisper: a test comparing with it costs a second decode of its audio.
REFERENCE_FIXTURES = {"faster_whisper_int8", "faster_whisper_fp32"}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks from what a test uses, as each test is collected:
    - broker: it uses the broker, directly or through another fixture, whether or not its module says so
      (`make test-fast` deselects by this mark, so it never needs Kafka);
    - slow: it compares with the reference implementation, which decodes the same audio again."""
    fixtures = getattr(item, "fixturenames", ())
    if "broker" in fixtures:
        item.add_marker(pytest.mark.broker)
    if REFERENCE_FIXTURES.intersection(fixtures):
        item.add_marker(pytest.mark.slow)


# Files longest first (their seconds measured in a whole run, tests/file_seconds.json; a file not in it counts
# as FILE_SECONDS_UNKNOWN): with --dist loadfile each process takes the next file when it is free, and xdist's
# own order (most tests first, turned off in the Makefile) left the slow worker files, a test or two each, to
# the end, where one or two processes ran them alone for minutes. Within a file the order is kept.
FILE_SECONDS = json.loads(Path(__file__).with_name("file_seconds.json").read_text())
FILE_SECONDS_UNKNOWN = 10.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -FILE_SECONDS.get(item.nodeid.split("::")[0], FILE_SECONDS_UNKNOWN))


# How `make test` shares 2 cores between test files that run worker processes in real time.
#
# xdist's file scheduler hands each process the next file in the queue, longest first, so the files that start
# worker processes and replay calls in real time (all of them long) started together: chaos (three workers
# restarted under faults), scale-out (three workers), the PCI calls and a crash test ran side by side, each
# worker started in 40-120 s instead of 10 s, and those tests' own bounds (a take-over within its session,
# calls finished within minutes of their end) failed one CI run in a few. ``WorkerLanes`` hands out files in
# the same order but holds the files of ``WORKER_FILES`` to ``WORKER_SLOTS`` at a time (a three-worker file
# takes both); the other processes meanwhile take the rest of the suite.

# Files that run worker processes with calls in real time, and the slots each takes: two for those running
# three workers at once. Short worker files (one worker, a few seconds of audio) are not held back.
WORKER_FILES = {
    "tests/worker/test_chaos.py": 2,
    "tests/worker/test_scale_out.py": 2,
    "tests/worker/test_crash_recovery.py": 1,
    "tests/worker/test_pipeline.py": 1,
    "tests/worker/test_pci_calls.py": 1,
    "tests/worker/test_call_library.py": 1,
    "tests/worker/test_postcall_pass.py": 1,
    "tests/worker/test_static_membership.py": 1,
    "tests/worker/test_long_gap.py": 1,
    "tests/worker/test_store_outage.py": 1,
    "tests/postcall/test_gone_audio.py": 1,
    "tests/gateway/test_end_to_end.py": 1,
    "tests/bench/test_live_smoke.py": 1,
}
WORKER_SLOTS = 2


class WorkerLanes(LoadFileScheduling):
    """xdist's file scheduling, with at most ``WORKER_SLOTS`` slots of ``WORKER_FILES`` files unfinished at once
    (a file counts from the moment a process is given it, queued behind another file or running)."""

    def _slots_taken(self) -> int:
        return sum(WORKER_FILES.get(scope, 0) for work in self.assigned_work.values()
                   for scope, tests in work.items() if not all(tests.values()))

    def _assign_work_unit(self, node: Any) -> None:
        self.assigned_work.setdefault(node, {})  # xdist's rescheduling reads it even before a first file
        free = WORKER_SLOTS - self._slots_taken()
        # A file needing more slots than there are runs once all are free, alone among worker files.
        scope = next((s for s in self.workqueue if min(WORKER_FILES.get(s, 0), WORKER_SLOTS) <= free), None)
        if scope is None:  # only held-back files are left: this process waits for a slot to free
            return
        self.workqueue.move_to_end(scope, last=False)  # xdist's own assignment takes the queue's first
        super()._assign_work_unit(node)

    def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        for other in self.nodes:  # a finished worker file frees slots another, idle process may be waiting for
            idle = self._pending_of(self.assigned_work.get(other, {})) == 0
            if other is not node and not other.shutting_down and idle:
                self._reschedule(other)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    return WorkerLanes(config, log) if config.getvalue("dist") == "loadfile" else None


# CALLQA_TEST_CPU=FILE: one JSON line per test with the CPU it cost, its own process's and that of the
# processes it started and reaped (workers, CLI runs), beside its wall time. pytest's --durations ranks by
# wall time, which on 2 cores hides what to cut: a real-time replay waits, a worker start burns CPU.
CPU_LOG = os.environ.get("CALLQA_TEST_CPU", "")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not CPU_LOG:
        yield
        return
    before = os.times()
    yield
    after = os.times()
    own = after.user + after.system - before.user - before.system
    children = (after.children_user + after.children_system - before.children_user - before.children_system)
    with open(CPU_LOG, "a") as log:
        log.write(json.dumps({"test": item.nodeid, "wall_s": round(after.elapsed - before.elapsed, 2),
                              "cpu_s": round(own, 2), "children_cpu_s": round(children, 2)}) + "\n")


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Absolute path of the one chdb data folder of this test session."""
    return str(Path(tmp_path_factory.mktemp("chdb")).resolve())


@pytest.fixture
def unique_name() -> Iterator[str]:
    """A fresh identifier for topics, databases or consumer groups of one test."""
    yield f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def store(chdb_path: str, unique_name: str) -> Iterator[Client]:
    """A database of its own in the session's chdb folder, migrated to the current schema; dropped after."""
    client = connect(f"chdb://{chdb_path}", unique_name)
    migrate(client, unique_name)
    yield client
    client.command(f"DROP DATABASE IF EXISTS {unique_name}")


STARTED_BY = "started-by-pytest"  # in the broker's folder: the PID of the pytest run that started it


@pytest.fixture(scope="session")
def broker() -> Iterator[str]:
    """The real local Kafka broker: the one `make test` started, or one this run starts and stops. Under
    xdist each worker has a session of its own: the one that started the broker leaves stopping it to the
    controller (its parent), which does so once every worker is done (``pytest_sessionfinish``); stopped
    by the first worker to finish, it was gone under the others' running tests."""
    from pipeline.broker.local import LocalKafka
    from pipeline.config import Settings

    kafka = LocalKafka(Settings())
    result = kafka.start()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and not result.already_running:
        (kafka.root / STARTED_BY).write_text(f"{os.getppid()}\n")
    yield kafka.settings.bootstrap
    if not worker and not result.already_running:
        kafka.stop()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller stops the broker one of its workers started (see ``broker``)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from pipeline.broker.local import LocalKafka
    from pipeline.config import Settings

    kafka = LocalKafka(Settings())
    marker = kafka.root / STARTED_BY
    with contextlib.suppress(FileNotFoundError, ValueError):
        if int(marker.read_text()) == os.getpid():
            marker.unlink()
            kafka.stop()


@pytest.fixture
def kafka_settings(broker: str, unique_name: str):  # type: ignore[no-untyped-def]
    """Settings whose topics are fresh for this test (so tests never see each other's messages), deleted
    after it."""
    from pipeline.broker.topics import ensure_topics
    from pipeline.config import Settings

    prefix = f"test.{unique_name}"
    settings = Settings(
        bootstrap_servers=broker,
        topic_audio=f"{prefix}.audio", topic_call_events=f"{prefix}.events",
        topic_transcripts=f"{prefix}.transcripts", topic_latency=f"{prefix}.latency",
        topic_qa=f"{prefix}.qa", topic_dead_letters=f"{prefix}.dlq", topic_checkpoints=f"{prefix}.checkpoints",
        topic_postcall=f"{prefix}.postcall", topic_live_calls=f"{prefix}.live", worker_id=f"{prefix}.worker",
    )
    ensure_topics(settings)
    yield settings
    drop_topics(broker, prefix)


def drop_topics(bootstrap: str, prefix: str) -> None:
    """Delete the test's topics (``pipeline.broker.topics.drop_topics``: its own and its workers'). A suite run creates
    ~6,500 partitions; kept, they filled the local broker's 512 MB heap by the third `make test` of one
    checkout (OutOfMemoryError, then the broker exited mid-run)."""
    from confluent_kafka.admin import AdminClient

    from pipeline.broker import topics

    with contextlib.suppress(Exception):  # a leftover topic costs memory, not correctness
        topics.drop_topics(AdminClient({"bootstrap.servers": bootstrap}), prefix)


def _high_watermark(consumer, partition, timeout_s: float = 30.0) -> int:  # type: ignore[no-untyped-def]
    """The partition's high watermark. A topic created a moment ago can answer NOT_LEADER until the
    broker's metadata settles (seen on a loaded 2-core CI machine), so retriable errors are retried."""
    import time

    from confluent_kafka import KafkaError, KafkaException

    settling = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TIMED_OUT}
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return int(consumer.get_watermark_offsets(partition, timeout=10)[1])
        except KafkaException as exc:
            error = exc.args[0]
            if not (error.retriable() or error.code() in settling) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _read_topic(bootstrap: str, topic: str, expected: int | None = None, idle_s: float = 3.0,
                timeout_s: float = 60.0) -> list:  # type: ignore[type-arg]
    """Every message of ``topic`` from the beginning, in a fresh consumer group: until ``expected``
    messages arrived, or (``expected`` None) until every message the topic held when called was read and
    then nothing new came for ``idle_s``. Idle time alone is not enough: on a busy broker a new group's
    first fetch can take longer than ``idle_s``, and an empty answer would pass for an empty topic."""
    import time

    from confluent_kafka import Consumer, KafkaError, TopicPartition

    # read_committed (as a downstream consumer of the worker's transactional outputs): an aborted record is
    # never read, and the last offsets of a partition are commit markers no poll returns, so the end of a
    # partition is where it reports EOF (at most the end of what is committed).
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "enable.partition.eof": True})
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    # What the topic holds now: the high watermark of each partition.
    ends = {p: _high_watermark(consumer, TopicPartition(topic, p)) for p in partitions}
    read_to = dict.fromkeys(partitions, 0)
    consumer.subscribe([topic])
    out: list = []  # type: ignore[type-arg]
    began = last = time.monotonic()
    try:
        while time.monotonic() - began < timeout_s:
            if expected is not None and len(out) >= expected:
                break
            held_read = all(read_to[p] >= end for p, end in ends.items())
            if expected is None and held_read and time.monotonic() - last >= idle_s:
                break
            msg = consumer.poll(0.3)
            if msg is not None and msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                # Past the commit markers too, once a partition's transactions up to ``ends`` are committed.
                if msg.offset() >= ends.get(msg.partition(), 0):
                    read_to[msg.partition()] = max(read_to.get(msg.partition(), 0), msg.offset())
            elif msg is not None and not msg.error():
                out.append(msg)
                read_to[msg.partition()] = msg.offset() + 1
                last = time.monotonic()
    finally:
        consumer.close()
    return out


@pytest.fixture
def read_topic():  # type: ignore[no-untyped-def]
    """``read_topic(bootstrap, topic, expected=None, idle_s=3.0)``: the messages of a topic, from its start."""
    return _read_topic
