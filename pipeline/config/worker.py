"""Settings of the Faust worker."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator


class WorkerSettings(BaseModel):
    worker_id: str = Field("callqa-worker", description="Faust app id, also the Kafka consumer group of the workers.")
    web_host: str = Field("127.0.0.1", description="Interface of the worker's web server (/metrics, /api/...).")
    web_port: int = Field(6066, description="Port of the worker's web server.")
    max_inflight_audio_mb: int = Field(
        64, description="Decoded audio (MB) submitted for inference and not yet transcribed; beyond it agents wait.",
    )
    end_grace_ms: int = Field(
        2000, description="After a call's end event, how long to wait for its last frames (they travel on another topic).",
    )
    # An end event announces each leg's frame count: a call closes once its legs have them (or a later
    # seq showed a gap to be missing). Frames still in flight when the audio partition is caught up look
    # like lost ones; this bounds the wait (wall time after the end event read; while the partition is
    # behind, its stream time past the end: other producers' later frames can come before this call's
    # last ones, clock.end_due). CALLQA_END_WAIT_MAX_S, default 30.
    end_wait_max_s: float = Field(
        30.0, ge=0, description="Longest a call waits after its end event for frames it announced (s; wall time "
                                "when caught up, the audio partition's stream time when behind); a close without "
                                "them is counted (callqa_calls_closed_incomplete_total).",
    )
    # A leg that sends nothing (one-way media, silence suppression) would hold the other legs' finals and
    # live alerts until it speaks again (finals are released in time order across legs: release.py).
    # Past this much stream time, a leg with no open segment and no frames waiting is taken as silent.
    # Keep it above the VAD's pre-roll: frames of a leg that come later than this are still stored, only
    # out of time order (final QA is computed in time order at the call's end all the same).
    # CALLQA_HELD_FINAL_MAX_MS, default 2000.
    held_final_max_ms: int = Field(
        2000, ge=0, description="Most stream time (ms) a leg that sends nothing holds the other legs' finals.",
    )
    # Gateways send no frames during hold, a recording (PCI) pause or silence suppression: a call must
    # stay open across those, so the default is a long hold, not a gap between frames (holds announced
    # by hold/resume events never close it). A call closed this way is finished, once, like one that
    # ended: frames of it that still come are dropped and counted (callqa_frames_dropped_total{reason=
    # "after_call_end"}); reopening it would publish its QA a second time.
    call_inactivity_timeout_s: float = Field(
        1200.0, description="A call with no frames or events for this long (stream time) is closed (end_reason 'timeout').",
    )
    # A checkpoint holds ~25 KB per leg (the VAD's pre-roll audio and state), written at most once per
    # commit interval per call: spacing them trades checkpoint-topic bytes against re-decoded audio.
    checkpoint_interval_ms: int = Field(
        2000, ge=0, description="Least call audio (ms) between two checkpoints of a call; they are taken between segments.",
    )
    # A checkpoint holds a live call's redacted texts and 300 ms of pre-roll audio per leg (a voice
    # sample): sealed with AES-256-GCM when a key is set (pipeline/worker/checkpoint_cipher.py).
    checkpoint_key: SecretStr = Field(
        SecretStr(""), description="32-byte key (hex or base64) sealing checkpoint records at rest; the same in every "
                                   "worker of a group; empty: records are plain Avro (secret: never printed or logged). "
                                   "With a key, plain records are refused (pipeline/worker/checkpoint_cipher.py).",
    )
    checkpoint_previous_keys: SecretStr = Field(
        SecretStr(""), description="Keys checkpoints were sealed with before checkpoint_key (comma-separated, hex or "
                                   "base64): still opened, never used to seal; for a rotation (secret).",
    )
    checkpoint_plain_accepted: bool = Field(
        False, description="With checkpoint_key set, read plain checkpoint records too: for the switch-over from "
                           "no key, until the calls open before it have ended (a plain record is refused otherwise).",
    )
    # In audio time, not in messages: a window of 10 messages, at 200 ms each, made a missing one wait 2 s
    # of later audio before its gap was filled, and every later segment with it.
    reorder_window_ms: int = Field(
        200, ge=1, description="Audio (ms) a leg holds to put reordered messages back in order before a gap is "
        "filled with silence (at least one message).",
    )
    # faust's default is 60 s: after a crash, the crashed worker's calls would wait a minute for a new owner.
    # Heartbeats come from the consumer's own thread, so a busy event loop does not lose the group.
    kafka_session_timeout_s: float = Field(
        15.0, ge=1, description="A worker silent this long (crashed, killed) loses its partitions to the others (s).",
    )
    # A member learns of a rebalance (another one died or joined) at its next heartbeat, so the interval is
    # part of every take-over after a peer's eviction (peer_watch); its expiry is judged from its last one,
    # so a fifth of the session at most keeps a few heartbeats inside every session. A heartbeat is one small
    # request to the group coordinator. CALLQA_KAFKA_HEARTBEAT_INTERVAL_S, default 0.
    kafka_heartbeat_interval_s: float = Field(
        0.0, ge=0, description="How often the worker's consumer heartbeats to its group (s); 0: 1 s, or a fifth "
        "of kafka_session_timeout_s if that is shorter.",
    )
    # A worker killed with SIGKILL (OOM, crash) holds its calls until its session expires. With this on, each
    # worker keeps a TCP connection to every other worker's liveness listener; the OS closes a dead process's
    # sockets at once, and a surviving peer then evicts it from the group (LeaveGroup on its behalf), so its
    # partitions move at the survivors' next heartbeat. A slow or paused worker keeps its sockets open and is
    # left alone; a lost host closes nothing and still waits for the session. Peers must reach each other's
    # peer_watch_host:port at the address the broker sees them connect from (pipeline/broker/peers.py).
    # CALLQA_PEER_WATCH, default on.
    peer_watch: bool = Field(
        True, description="Evict a peer worker from the group the moment its process dies (its liveness "
        "connection closes) instead of at its session expiry.",
    )
    # CALLQA_PEER_WATCH_HOST, default empty (the worker's web_host, 127.0.0.1 unless set).
    peer_watch_host: str = Field("", description="Interface of the liveness listener; empty: web_host.")
    # CALLQA_PEER_WATCH_PORT, default 0: a free port, which the worker's Kafka client id tells its peers.
    peer_watch_port: int = Field(0, ge=0, le=65535, description="Port of the liveness listener; 0: any free port.")
    # How often the group's members are listed to watch new ones (a DescribeGroups per worker); a death is
    # noticed at once whatever this is. CALLQA_PEER_WATCH_INTERVAL_S, default 1.
    peer_watch_interval_s: float = Field(
        1.0, gt=0, description="How often the worker lists its group's members to watch new ones (s).",
    )
    # Static membership (KIP-345): a worker restarted under the same instance id within the session timeout
    # gets its partitions back with no rebalance, so the other workers' calls never pause for it. Unique per
    # live worker of a group (a StatefulSet pod's name): a second live worker with the same id fences the first.
    # With it, set kafka_session_timeout_s above a restart's length; a worker that stays down then keeps its
    # partitions' calls waiting that long. CALLQA_WORKER_INSTANCE_ID, default empty (dynamic membership).
    worker_instance_id: str = Field(
        "", max_length=200, description="The worker's static group membership id (e.g. its pod name); empty: "
        "every start and stop rebalances the group.",
    )
    # A worker that joins while the broker does not list its topics yet (a broker just restarted, topics just
    # created) takes an empty assignment, and its consumer only asks again at this metadata age: faust's 5 min
    # default left the chaos test's three workers idle from 08:35:02 to 08:39:46 after a broker restart (and
    # `bench live` and `make demo` once). A refresh costs one metadata request.
    kafka_metadata_max_age_s: float = Field(
        10.0, gt=0, description="How often the worker's consumer refreshes topic metadata, so topics that appear "
        "after it joined are subscribed within this long (s).",
    )
    # A rebalance waits for every member's revocation; a store outage must not hang the whole group, so
    # the hand-over (let ending calls finish, flush, commit) gives up after this, and what it could not
    # make durable is replayed by the next owner from the last commit. Capped at 60 % of the session timeout.
    # A store that refuses writes for over a second ends the wait at once (pipeline/worker/calls.py).
    handover_timeout_s: float = Field(
        8.0, gt=0, description="Longest a revocation waits to finish ending calls and commit before handing partitions over (s).",
    )
    # faust's consumer is eager: every rebalance revokes every partition, so without this every call of
    # every worker would be dropped and re-decoded from its checkpoint, even on partitions that come back.
    keep_calls_on_rebalance: bool = Field(
        True, description="Keep the calls of revoked partitions until the new assignment; drop only those that moved.",
    )
    commit_interval_s: float = Field(
        2.0, description="How often finished calls are made durable and input offsets committed (s).",
    )
    # Exactly once for read_committed consumers of the output topics (pipeline/broker/transactions.py): what
    # a partition's calls produce commits in one Kafka transaction with the input offsets it accounts for,
    # and a replay does not publish again what a committed transaction holds (the checkpoint lists it). Off:
    # at-least-once (a replay after a crash publishes its segments again; the store deduplicates either way),
    # for brokers without transactions. A read_committed consumer sees a final at the commit after it, up to
    # commit_interval_s later; a read_uncommitted one (live views) sees it at once, as without transactions.
    exactly_once: bool = Field(
        True, description="Produce outputs in Kafka transactions committed with the input offsets (exactly once "
        "for read_committed consumers); false: at-least-once, no transactions.",
    )
    # A worker killed mid-transaction leaves it open; the partition's next owner aborts it when it starts,
    # and the broker after this long if nobody does. Until then read_committed consumers of the partitions it
    # wrote to wait: keep it above commit_interval_s plus a store flush, well under faust's default 60 s.
    transaction_timeout_s: float = Field(
        30.0, gt=0, description="Longest a transaction of a dead worker stays open before the broker aborts it (s).",
    )
    # glibc raises its mmap threshold to the largest block freed so far, so the decoder's batch buffers
    # (MBs, a new shape per batch size) end up on the heap and stay there: RSS per leg followed the batch
    # shapes seen, not the legs (callqa bench memory: 2.5-3.4 MB per leg; 1.1 with a fixed 128 KB threshold).
    malloc_mmap_threshold_bytes: int = Field(
        131072, ge=0, description="glibc's mmap threshold set at worker start (bytes); 0 leaves glibc's dynamic one. "
        "The MALLOC_MMAP_THRESHOLD_ environment variable, when set, wins.",
    )
    # Free chunks between live blocks stay resident: in an hour's soak, one trim of the long-lived worker
    # gave back 14 MB of 747 (pipeline/worker/allocator.py).
    malloc_trim_interval_s: float = Field(
        60.0, ge=0, description="How often the worker hands glibc's free pages back to the system (malloc_trim, "
        "off the event loop), s; 0: never.",
    )
    stream_buffer_maxsize: int = Field(
        1024, description="Faust per-partition buffer; when full, fetching from that partition pauses.",
    )
    frame_batch_max: int = Field(
        256, description="Most frames the audio agent takes at once (one VAD run scores every leg among them).",
    )
    frame_batch_within_ms: float = Field(
        10.0, description="Longest the audio agent waits to fill a frame batch (ms); bounds the added delay.",
    )
    max_poll_records: int = Field(500, description="Most records one Kafka fetch returns to the worker.")
    # faust fixes aiokafka's fetch_max_wait_ms at 1500 and leaves fetch_min_bytes at 1. aiokafka keeps one
    # fetch in flight per broker and leaves out partitions whose records are still being handed on, so a
    # fetch of only idle partitions (the call-events topic) held the broker's slot for 1.5 s while frames
    # queued (pipeline/broker/consumer.py). Measured with callqa bench live at 23 calls on 2 cores (run
    # 20261203T070044Z): P99 4.47 s at faust's 1 B / 1500 ms, 1.82 s at 1 B / 20 ms, 1.64 s at 16 KB / 20 ms
    # (CPU per speech s 0.99x), 7.43 s at 64 KB / 50 ms (the wait taken on every fetch; lag grew).
    fetch_min_bytes: int = Field(
        16384, ge=1, description="Least data (bytes) the broker gathers for one fetch of the worker's consumer, "
                                 "unless fetch_max_wait_ms passes first (1 is faust's).",
    )
    fetch_max_wait_ms: int = Field(
        20, ge=0, description="Longest the broker holds a fetch of the worker's consumer to gather "
                              "fetch_min_bytes (ms; the most a frame waits for it at low load; 1500 is faust's).",
    )
    model_watch_interval_s: float = Field(
        5.0, description="How often the worker looks for a newer model version to hot-reload (0: never).",
    )
    # pipeline/worker/early.py: the final's text is the same, only sooner. Auto (None): on when batches
    # decode in child processes (inference_processes, auto 2 on 2+ cores), off in-process, where at 4 calls
    # three of six runs fell behind the input (lag spikes of 400-800 frames): the early decodes held the event
    # loop's GIL. With child processes (bench live --search, 2 cores,
    # Moonshine base, bench/results/capacity/): 9 calls held at P99 <= 1.5 s against 6 without; at 9 calls in
    # one run P50 0.86 -> 0.71 s, P99 1.52 -> 1.39 s, worker CPU 1.12x (decodes of segments whose speech
    # resumed are thrown away), the lag flat.
    early_decode: bool | None = Field(
        None, description="Decode a segment once its end is known (post-roll passed), before its endpoint, while "
        "the batcher is idle; unset: on when batches decode in child processes (CALLQA_INFERENCE_PROCESSES).",
    )
    partial_interval_ms: int = Field(
        0, description="Emit partial transcripts of open segments this often (ms); 0 turns partials off.",
    )
    # Partials re-decode the open segment. Off, they queue beside the finals, wait for budget like them and
    # take any free decoding thread (to measure what giving way buys: bench live).
    partials_yield: bool = Field(
        True, description="Partials give way to finals: skipped when the in-flight budget is busy, decoded only when "
        "no final waits (never on the last free decoding thread), dropped when stale (CALLQA_PREVIEW_MAX_WAIT_MS).",
    )
    # An unhealthy worker (a part died, a call task failed: pipeline/worker/health.py) stops itself so a
    # supervisor restarts it; a graceful stop may wait on what died, so this bounds it.
    unhealthy_exit_timeout_s: float = Field(
        30.0, gt=0, description="Once unhealthy, the worker stops with exit status 1; after this long (s) it exits at once.",
    )
    # Off by default: dead letters are kept for weeks (dead_letter_retention_ms), far longer than the
    # audio topic, and a call's audio is personal data; on, the worker warns once at start.
    debug_raw_audio: bool = Field(
        False, description="Debugging only: dead letters carry the raw message bytes or the failed segment's audio.",
    )
    # --- the web API (/api/*): see pipeline/api/ -----------------------------------------------------
    api_token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token every /api/* request must send (secret, 16+ characters); empty: /api/* answers 503.",
    )
    api_auth: Literal["on", "off"] = Field(
        "on", description="off: /api/* needs no token; allowed only while web_host is a loopback address.",
    )
    # The call pages' login (/login, pipeline/api/sessions.py) sets a signed cookie; /logout revokes it,
    # keeping its nonce in the store's revoked_sessions until it expires. Changing CALLQA_API_TOKEN ends
    # every session at once. CALLQA_WEB_SESSION_HOURS, default 12.
    web_session_hours: float = Field(
        12.0, gt=0, description="How long a login to the call pages (/calls) lasts (hours).",
    )
    # Every call carries a tenant (accounts see their tenant's calls); a call's start event names it
    # (Twilio's custom parameter, AudioHook's organization, the SIPREC digest user, `callqa replay --tenant`).
    default_tenant: str = Field(
        "default", min_length=1,
        description="The tenant of a call whose start event names none (its rows are stored with this one).",
    )
    # CALLQA_WEB_LOGOUT_SYNC_S, default 5: one small read of revoked_sessions per interval, only while
    # pages are asked for.
    web_logout_sync_s: float = Field(
        5.0, ge=0, description="How stale (s) a worker's list of sessions logged out on other workers may be; "
        "0: read on every page request.",
    )
    # CALLQA_WEB_PAGE_SIZE, default 100: the /calls page shows this many calls, newest first, and links the
    # older ones (a keyset cursor, as /api/calls pages): a page costs the same at any depth.
    web_page_size: int = Field(
        100, ge=1, le=1000, description="Calls one /calls page lists (newest first); an 'older calls' link pages on.",
    )
    api_page_size: int = Field(
        100, ge=1, description="Calls /api/calls answers when the request names no ?limit=.",
    )
    api_page_max: int = Field(
        1000, ge=1, description="Most calls one /api/calls page may hold (?limit= above it is answered 400); "
        "the next page is in the Link header.",
    )
    api_query_threads: int = Field(
        2, ge=1, description="Threads of the /api/* pool, apart from the worker's own (ingestion never waits on it).",
    )
    api_query_max_waiting: int = Field(
        8, ge=0, description="/api/* requests that may wait for a pool thread; more are answered 503 at once.",
    )
    # CALLQA_API_SOURCE_MAX_CONCURRENT, default 4: below the pool's threads + waiting line (2 + 8), so one
    # client never fills it; behind a reverse proxy every request has the proxy's address (raise it, or 0).
    api_source_max_concurrent: int = Field(
        4, ge=0, description="Requests on /api/* and the call pages one source (peer address) may have in "
        "flight; one more is answered 429. 0: no limit.",
    )
    # CALLQA_API_MAX_REQUEST_BYTES, default 16 KiB: the SQL of /api/query rides in the URL and a login form is a
    # token; aiohttp's own body limit was 1 MiB, with no count of what it refused.
    api_max_request_bytes: int = Field(
        16384, ge=1024, description="Largest request target (path and query) or body the API and pages take "
        "(bytes); a larger one is answered 413.",
    )
    api_query_timeout_s: float = Field(
        30.0, gt=0, description="ClickHouse max_execution_time of one /api/query statement (seconds).",
    )
    api_query_max_rows: int = Field(
        10_000, ge=1, description="Rows /api/query returns at most; the answer says truncated when more matched.",
    )
    api_query_max_result_mb: int = Field(
        64, ge=1, description="ClickHouse max_result_bytes of one /api/query (MB); a larger result is refused.",
    )
    api_query_max_memory_mb: int = Field(
        512, ge=16, description="ClickHouse max_memory_usage of one /api/query (MB).",
    )

    @field_validator("api_auth", mode="before")
    @classmethod
    def _lower_case(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value
