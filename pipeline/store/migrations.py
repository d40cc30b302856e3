"""Versioned, idempotent schema migrations of the callqa ClickHouse database.

Each migration is a numbered list of DDL statements. ClickHouse has no transactional DDL, so every
statement must be safe to run again (``IF NOT EXISTS``, ``ADD COLUMN IF NOT EXISTS``): a migration is
recorded in ``schema_migrations`` only after all its statements ran, and a crash half-way simply
re-runs it. Two workers migrating at once is harmless for the same reason.

Reader-facing dedup. The pipeline is at-least-once: after a crash, Kafka replays and the same rows
are inserted again with the same keys. Every table is a ``ReplacingMergeTree`` whose ORDER BY is the
row's identity and whose version column decides which copy survives. Background merges collapse
copies eventually, never on time, so readers must either
- read the ``<table>_deduped`` views (``SELECT * FROM t FINAL``), or
- aggregate with ``argMax(col, <version>) ... GROUP BY <key>`` themselves.
``FINAL`` also collapses copies that landed in different monthly partitions (a replay that crossed a
month boundary); do not set ``do_not_merge_across_partitions_select_final`` when reading.

Keys and versions, and why:
- calls: key call_id; version updated_at (latest state of the call wins); partition by month of
  started_at, which never changes for a call, so time-range queries prune whole months.
- segments: key (call_id, segment_id), so a call's transcript is one contiguous range; version
  prefers a final over a partial and then the latest produced_at (a replayed partial produced after
  its final must not win). No partition: a segment carries no time that is stable across replays.
- latency: key (call_id, segment_id); version keeps the FIRST measurement, because a replay measures
  the crash, not the pipeline; partition by month of measured_at (a part's min/max measured_at lets
  "last N minutes" queries skip old parts).
- call_qa: key call_id; version computed_at (a re-score replaces the old one); monthly partitions.
- qa_events: key (call_id, rule, leg, kind, offset_ms); version detected_at; monthly partitions.

A migration that adds columns must also replace the ``_deduped`` views of those tables: a ClickHouse view
keeps the column list its ``SELECT *`` had when it was created.

Revisions (migration 5): a call may be transcribed more than once, live and after the call by a
more accurate model (the post-call pass, ``callqa retranscribe``), and each pass's result is kept.
``calls``, ``call_qa``, ``segments`` and (migration 6) ``qa_events`` carry ``revision`` in their keys: 0 is the live pass, 1 the first
post-call pass, one more per retranscribe. (0, not 1, for the live pass: ClickHouse refuses a column with
a default in a sorting key added by ALTER, and every row written before had no revision.) Their
``_deduped`` views show each call's latest revision only: readers of the views see the most accurate
result there is; a reader of the raw tables chooses with ``revision``.
"""

from __future__ import annotations

from dataclasses import dataclass

from clickhouse_connect.driver.client import Client

from pipeline.store.client import check_identifier

# Reader-facing dedup keys and version expressions, one place for the views and for queries.py.
# (calls, call_qa and segments also key on ``revision``, added by migration 5.)
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "calls": ("call_id",),
    "segments": ("call_id", "segment_id"),
    "latency": ("call_id", "segment_id"),
    "call_qa": ("call_id",),
    "qa_events": ("call_id", "rule", "leg", "kind", "offset_ms"),
}


@dataclass(frozen=True)
class Migration:
    """One schema step; statements use ``{db}`` for the database name."""

    version: int
    name: str
    statements: tuple[str, ...]


_CALLS = """
CREATE TABLE IF NOT EXISTS {db}.calls (
    call_id String,
    tenant LowCardinality(String),
    agent_id String,
    queue LowCardinality(String),
    direction LowCardinality(String),
    legs Array(LowCardinality(String)),
    started_at DateTime64(3, 'UTC'),
    ended_at Nullable(DateTime64(3, 'UTC')),
    end_reason LowCardinality(String) COMMENT 'end|abort|timeout; empty while the call is open',
    segments UInt32,
    audio_ms UInt64,
    updated_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(updated_at)
PARTITION BY toYYYYMM(started_at)
ORDER BY call_id
"""

_SEGMENTS = """
CREATE TABLE IF NOT EXISTS {db}.segments (
    segment_id String,
    call_id String,
    leg LowCardinality(String),
    start_ms UInt32,
    end_ms UInt32,
    text String COMMENT 'redacted transcript text',
    confidence Float32,
    avg_logprob Float32,
    no_speech_prob Float32,
    is_final UInt8,
    model_name LowCardinality(String),
    model_version UInt32,
    redactions UInt16,
    produced_at DateTime64(3, 'UTC'),
    row_version UInt64 MATERIALIZED
        bitShiftLeft(toUInt64(is_final), 62) + toUInt64(toUnixTimestamp64Milli(produced_at))
) ENGINE = ReplacingMergeTree(row_version)
ORDER BY (call_id, segment_id)
"""

_LATENCY = """
CREATE TABLE IF NOT EXISTS {db}.latency (
    segment_id String,
    call_id String,
    leg LowCardinality(String),
    batch_size UInt16,
    batcher_wait_ms Float32,
    inference_ms Float32,
    frame_to_consume_ms Float32,
    end_to_end_ms Float32,
    worker_id LowCardinality(String),
    measured_at DateTime64(3, 'UTC'),
    row_version UInt64 MATERIALIZED
        toUInt64(9223372036854775807) - toUInt64(toUnixTimestamp64Milli(measured_at))
) ENGINE = ReplacingMergeTree(row_version)
PARTITION BY toYYYYMM(measured_at)
ORDER BY (call_id, segment_id)
"""

_CALL_QA = """
CREATE TABLE IF NOT EXISTS {db}.call_qa (
    call_id String,
    tenant LowCardinality(String),
    agent_id String,
    score_pct Float32,
    auto_failed UInt8,
    metrics Map(LowCardinality(String), Float64),
    items Nested(
        question String,
        weight Float32,
        passed UInt8,
        rationale String
    ),
    computed_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(computed_at)
PARTITION BY toYYYYMM(computed_at)
ORDER BY call_id
"""

_QA_EVENTS = """
CREATE TABLE IF NOT EXISTS {db}.qa_events (
    call_id String,
    rule LowCardinality(String),
    category LowCardinality(String),
    leg LowCardinality(String),
    kind LowCardinality(String) COMMENT 'match|missing|violation|alert',
    offset_ms UInt32,
    text String,
    severity LowCardinality(String),
    detected_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(detected_at)
PARTITION BY toYYYYMM(detected_at)
ORDER BY (call_id, rule, leg, kind, offset_ms)
"""

# A nonce alone cannot be made into a cookie (the MAC needs the token), so the table holds no secret.
_REVOKED_SESSIONS = """
CREATE TABLE IF NOT EXISTS {db}.revoked_sessions (
    session_id String COMMENT 'the nonce of a logged-out call-page session',
    expires_at DateTime('UTC') COMMENT 'when the session would have expired; the row is dropped then',
    revoked_at DateTime('UTC') DEFAULT now()
) ENGINE = ReplacingMergeTree
ORDER BY session_id
TTL expires_at
"""

_SCHEMA_MIGRATIONS = """
CREATE TABLE IF NOT EXISTS {db}.schema_migrations (
    version UInt32,
    name String,
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3)
) ENGINE = ReplacingMergeTree(applied_at)
ORDER BY version
"""


def _deduped_view(table: str, replace: bool = False) -> str:
    create = "CREATE OR REPLACE VIEW" if replace else "CREATE VIEW IF NOT EXISTS"
    return f"{create} {{db}}.{table}_deduped AS SELECT * FROM {{db}}.{table} FINAL"


# Sentiment per final segment and per call, longest monologue and hold time per call (all on
# the −5..+5 sentiment scale of pipeline/qa/sentiment.py; 0 for rows written before, and for partials).
_SENTIMENT_COLUMNS = {
    "segments": [("sentiment", "Float32", "sentiment of the redacted text, -5..+5; 0 for a partial")],
    "calls": [
        ("customer_sentiment", "Float32", "mean of the customer turns, -5..+5"),
        ("customer_sentiment_start", "Float32", "mean of the first third of the customer turns"),
        ("customer_sentiment_end", "Float32", "mean of the last third of the customer turns"),
        ("agent_sentiment_start", "Float32", "mean of the first third of the agent turns"),
        ("agent_sentiment_end", "Float32", "mean of the last third of the agent turns"),
        ("longest_monologue_ms", "UInt32", "longest stretch either party held the floor alone"),
        ("hold_ms", "UInt32", "total time on hold (no audio frames sent)"),
    ],
}


def _add_columns(table: str, columns: list[tuple[str, str, str]]) -> str:
    adds = ", ".join(f"ADD COLUMN IF NOT EXISTS {name} {kind} DEFAULT 0 COMMENT '{comment}'"
                     for name, kind, comment in columns)
    return f"ALTER TABLE {{db}}.{table} {adds}"


# When the call was on hold (the call page draws each hold), not only the total hold_ms.
_HOLDS_COLUMN = (
    "ALTER TABLE {db}.calls ADD COLUMN IF NOT EXISTS holds Array(Tuple(start_ms UInt32, end_ms UInt32)) "
    "DEFAULT [] COMMENT 'hold intervals [start_ms, end_ms) on the call clock; empty for rows written before'"
)

# The revision in the keys of the tables a post-call pass writes again (see the module's doc).
_REVISED_IN_5 = ("calls", "call_qa", "segments")
REVISED_TABLES = (*_REVISED_IN_5, "qa_events")  # qa_events since migration 6


def _revision_key(table: str) -> str:
    key = ", ".join((*TABLE_KEYS[table], "revision"))
    # Without a default, and in the same ALTER as the key change: ClickHouse allows only a newly added
    # column without a default expression into a sorting key. Running it again is a no-op.
    return (f"ALTER TABLE {{db}}.{table} ADD COLUMN IF NOT EXISTS revision UInt8 "
            f"COMMENT '0: the live pass; 1, 2, ...: post-call passes', MODIFY ORDER BY ({key})")


def _latest_revision_view(table: str) -> str:
    return (f"CREATE OR REPLACE VIEW {{db}}.{table}_deduped AS SELECT * FROM {{db}}.{table} FINAL "
            f"WHERE (call_id, revision) IN (SELECT call_id, max(revision) FROM {{db}}.{table} GROUP BY call_id)")


# A pass may find no events where the one before it found some: the latest revision of a call's events
# is its calls row's (written last), not the highest revision that happens to have events.
_QA_EVENTS_LATEST_VIEW = (
    "CREATE OR REPLACE VIEW {db}.qa_events_deduped AS SELECT * FROM {db}.qa_events FINAL "
    "WHERE (call_id, revision) IN (SELECT call_id, max(revision) FROM {db}.calls GROUP BY call_id)"
)


# ClickHouse removes outdated parts with a pool of up to 128 threads once more than
# concurrent_part_removal_threshold (100) are due, and the embedded engine (chdb) keeps every such thread
# for the life of the worker: 125 threads at the first clean-up, ~8 minutes after start, each later
# holding its allocator cache and three /proc files, so a worker's memory and open files grew for the
# whole of an hour's soak. The sink writes small parts often; one thread removes a clean-up's few hundred
# in well under a second, on a server too.
_PART_TABLES = (*TABLE_KEYS, "revoked_sessions", "schema_migrations")
_ONE_THREAD_PART_REMOVAL = tuple(
    f"ALTER TABLE {{db}}.{table} MODIFY SETTING concurrent_part_removal_threshold = 1000000" for table in _PART_TABLES
)


# Search across calls (pipeline/desk/search.py) finds whole words in the redacted text through a
# full-text index, not a scan: the lower-cased text cut at every ASCII character that is not a letter or a
# digit, the same cut the search makes of what is asked. Parts written before are indexed by the mutation
# (until it is done they are read whole: slower, not wrong).
_SEGMENT_WORDS_INDEX = (
    "ALTER TABLE {db}.segments ADD INDEX IF NOT EXISTS text_words lower(text) "
    "TYPE text(tokenizer = 'splitByNonAlpha')",
    "ALTER TABLE {db}.segments MATERIALIZE INDEX text_words",
)


# Human review of a call's scorecard (pipeline/desk/review.py). Each review is a row, never
# rewritten (the key holds its time and id: a review sent twice is stored once); the call's QA row is
# written again with the reviewed items and score, and the automatic score kept beside it, so every reader
# of call_qa (list, pages, search, dashboards) shows the reviewed score with no join.
_REVIEWS = """
CREATE TABLE IF NOT EXISTS {db}.reviews (
    review_id String COMMENT 'random per review: a review sent again is stored once',
    call_id String,
    item String COMMENT 'the scorecard item id (rules/scorecards/*.yaml)',
    question String,
    automatic LowCardinality(String) COMMENT 'pass|fail|na: the automatic verdict of the item',
    verdict LowCardinality(String) COMMENT 'pass|fail|na: the reviewer''s',
    reason String,
    reviewer String,
    revision UInt8 COMMENT 'the revision of the call (its QA) that was reviewed',
    reviewed_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree
ORDER BY (call_id, item, reviewed_at, review_id)
SETTINGS concurrent_part_removal_threshold = 1000000
"""
_REVIEWED_COLUMNS = (
    "ALTER TABLE {db}.call_qa ADD COLUMN IF NOT EXISTS automatic_score_pct Nullable(Float32) "
    "COMMENT 'the score before any review; NULL: never reviewed'",
    "ALTER TABLE {db}.call_qa ADD COLUMN IF NOT EXISTS reviewed_by String DEFAULT '' "
    "COMMENT 'who reviewed last; empty: never reviewed'",
)
# The call's categories (pipeline/qa/categories.py), written with its calls row at call end (and by
# each post-call pass, and `callqa recategorize`): the list filters and the dashboard counts read them there.
_CATEGORIES_COLUMN = ("ALTER TABLE {db}.calls ADD COLUMN IF NOT EXISTS categories Array(LowCardinality(String)) "
                      "DEFAULT [] COMMENT 'the categories of rules/categories/*.yaml the call is in'")

# Who erased which call, when and why (`callqa erase`, the retention sweeper; pipeline/store/erasure.py).
# It holds no text of the call; it is how an erasure is shown to have happened, and how the sweeper finds an erased
# call whose rows came back (a post-call job or a replay written after the erase) and erases them again.
_ERASURES = """
CREATE TABLE IF NOT EXISTS {db}.erasures (
    call_id String,
    erased_at DateTime64(3, 'UTC'),
    erased_by String COMMENT 'who asked: a user, or retention for the sweeper',
    reason LowCardinality(String) COMMENT 'request|retention|again (rows that came back after an erase)',
    rows Map(String, UInt64) COMMENT 'rows removed per table',
    outside String COMMENT 'what was done or left outside the store (topics, page files)'
) ENGINE = MergeTree
ORDER BY (call_id, erased_at)
SETTINGS concurrent_part_removal_threshold = 1000000
"""

# Accounts (pipeline/access/users.py): a token is kept only as its SHA-256; a name added again replaces
# the account, a removal is a row with removed = 1.
_USERS = """
CREATE TABLE IF NOT EXISTS {db}.users (
    name String,
    role LowCardinality(String) COMMENT 'admin|supervisor|agent',
    tenant String,
    agent_id String COMMENT 'an agent sees only the calls with this agent_id',
    token_sha256 String COMMENT 'hex SHA-256 of the API token; the token itself is never kept',
    password_scrypt String DEFAULT '' COMMENT 'scrypt hash of the page login password; empty: no page login',
    removed UInt8,
    created_at DateTime64(3, 'UTC'),
    updated_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(updated_at)
ORDER BY name
SETTINGS concurrent_part_removal_threshold = 1000000
"""

# Each account's id, which its page sessions name (pipeline/access/users.py): a name removed and added again is
# another account. Rows written before get an id from their name and creation time, the same on every read.
_ACCOUNT_ID_COLUMN = (
    "ALTER TABLE {db}.users ADD COLUMN IF NOT EXISTS account_id String "
    "DEFAULT lower(hex(substring(SHA256(concat(name, '/', toString(created_at))), 1, 16))) "
    "COMMENT 'random per account; a page session names it, so it never passes to a later account of the name'"
)

# Each finished call's redacted recording (pipeline/recordings): where it is kept and what was cut
# from it. It holds no audio and no text; a job redone writes an equal row (times from the job).
_RECORDINGS = """
CREATE TABLE IF NOT EXISTS {db}.recordings (
    call_id String,
    tenant String,
    url String COMMENT 'where the Ogg/Opus file is kept (a file:// path or an fsspec URL)',
    media_type LowCardinality(String),
    bytes UInt64,
    duration_ms UInt32,
    channels Array(LowCardinality(String)) COMMENT 'the leg of each channel, left first',
    cuts Array(Tuple(leg LowCardinality(String), start_ms UInt32, end_ms UInt32, kind String,
                     how LowCardinality(String))) COMMENT 'stretches silenced: what they hide, which step held',
    started_at DateTime64(3, 'UTC'),
    written_at DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(written_at)
ORDER BY call_id
SETTINGS concurrent_part_removal_threshold = 1000000
"""

# Secure pauses (an operator paused the call's capture during payment; the gateway dropped its
# audio): how long and when, apart from holds, so the call page draws them as paused and QA does not count
# them as hold time.
_PAUSES_COLUMNS = (
    "ALTER TABLE {db}.calls ADD COLUMN IF NOT EXISTS paused_ms UInt32 DEFAULT 0 "
    "COMMENT 'total time the capture of the call was securely paused (no audio left the gateway)', "
    "ADD COLUMN IF NOT EXISTS pauses Array(Tuple(start_ms UInt32, end_ms UInt32)) DEFAULT [] "
    "COMMENT 'secure pauses [start_ms, end_ms) on the call clock; empty for rows written before'"
)

# Keypad tones (in-band DTMF) the worker found in a leg and silenced (pipeline/audio/dtmf.py):
# when, on which leg, so the call page shows them and counts them. Never which key: it is not known past the
# detector.
_KEYPAD_COLUMN = (
    "ALTER TABLE {db}.calls ADD COLUMN IF NOT EXISTS keypad "
    "Array(Tuple(leg LowCardinality(String), start_ms UInt32, end_ms UInt32)) DEFAULT [] "
    "COMMENT 'keypad tones silenced in the audio, [start_ms, end_ms) on the leg clock; empty for rows written before'"
)

# Tables the query API reads beside TABLE_KEYS' (and their views); like every table since migration 8 they
# remove their outdated parts with one thread.
MORE_TABLES = ("reviews", "recordings")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "tables", (_CALLS, _SEGMENTS, _LATENCY, _CALL_QA, _QA_EVENTS)),
    Migration(2, "deduped views", tuple(_deduped_view(t) for t in TABLE_KEYS)),
    Migration(3, "sentiment, monologue and hold columns", (
        *(_add_columns(table, columns) for table, columns in _SENTIMENT_COLUMNS.items()),
        *(_deduped_view(table, replace=True) for table in _SENTIMENT_COLUMNS),
    )),
    Migration(4, "hold intervals of a call", (_HOLDS_COLUMN, _deduped_view("calls", replace=True))),
    Migration(5, "revisions: the live and post-call passes of a call", (
        *(_revision_key(table) for table in _REVISED_IN_5),
        *(_latest_revision_view(table) for table in _REVISED_IN_5),
    )),
    # The worker's post-call pass stores the rule verdicts of its transcript too: without the
    # revision in their key, the final pass's events would mix with the live pass's in one list.
    Migration(6, "revisions of a call's QA events", (_revision_key("qa_events"), _QA_EVENTS_LATEST_VIEW)),
    # /logout revokes a call-page session for every worker on the store (pipeline/api/revocations.py).
    Migration(7, "sessions logged out", (_REVOKED_SESSIONS,)),
    Migration(8, "outdated parts removed by one thread", _ONE_THREAD_PART_REMOVAL),
    Migration(9, "a full-text index of the segments' words", _SEGMENT_WORDS_INDEX),
    Migration(10, "reviews of a call's scorecard", (_REVIEWS, *_REVIEWED_COLUMNS, _latest_revision_view("call_qa"))),
    Migration(11, "call categories", (_CATEGORIES_COLUMN, _latest_revision_view("calls"))),
    Migration(12, "erasures: who erased which call", (_ERASURES,)),
    Migration(13, "accounts", (_USERS,)),
    Migration(14, "recordings", (_RECORDINGS,)),
    Migration(15, "secure pauses of a call", (_PAUSES_COLUMNS, _latest_revision_view("calls"))),
    Migration(16, "keypad tones of a call", (_KEYPAD_COLUMN, _latest_revision_view("calls"))),
    Migration(17, "account ids", (_ACCOUNT_ID_COLUMN,)),
)


def applied_versions(client: Client, database: str) -> set[int]:
    """Versions already recorded in ``schema_migrations`` (creating that table if missing)."""
    db = check_identifier(database)
    client.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    client.command(_SCHEMA_MIGRATIONS.format(db=db))
    rows = client.query(f"SELECT DISTINCT version FROM {db}.schema_migrations").result_rows
    return {int(r[0]) for r in rows}


def migrate(client: Client, database: str, migrations: tuple[Migration, ...] = MIGRATIONS) -> list[int]:
    """Apply the migrations not yet recorded, in version order; returns the versions applied now."""
    db = check_identifier(database)
    done = applied_versions(client, db)
    applied = []
    for migration in sorted(migrations, key=lambda m: m.version):
        if migration.version in done:
            continue
        for statement in migration.statements:
            client.command(statement.format(db=db))
        client.insert(
            "schema_migrations",
            [[migration.version, migration.name]],
            column_names=["version", "name"],
            database=db,
        )
        applied.append(migration.version)
    return applied


def schema_version(client: Client, database: str) -> int:
    """Highest applied migration version, 0 for an empty database."""
    return max(applied_versions(client, database), default=0)
