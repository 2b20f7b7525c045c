-- clawgate state, schema 1.
-- Rows that hold whole domain records keep them as JSON in `payload` with a `format_version`,
-- beside the columns queries need. Later migrations convert payloads; they never drop rows.

CREATE TABLE gateway_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

CREATE TABLE send_intents (
    id              TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    channel         TEXT NOT NULL,
    account_id      TEXT,
    status          TEXT NOT NULL,
    attempt         INTEGER NOT NULL,
    next_attempt_at INTEGER,
    expires_at      INTEGER,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    claimed_by      TEXT,
    claim_until     INTEGER,
    format_version  INTEGER NOT NULL,
    payload         TEXT NOT NULL
) STRICT;

-- Recovery scans only the intents that may still need work, oldest first.
CREATE INDEX send_intents_open ON send_intents (created_at, id)
    WHERE status IN ('pending', 'sending', 'committing', 'unknown_after_send');
CREATE INDEX send_intents_status ON send_intents (status, created_at, id);

CREATE TABLE inbound_records (
    channel     TEXT NOT NULL,
    account_id  TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    status      TEXT NOT NULL,
    attempts    INTEGER NOT NULL,
    payload     TEXT NOT NULL,
    last_error  TEXT,
    received_at INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (channel, account_id, event_id)
) STRICT;

CREATE INDEX inbound_records_status ON inbound_records (status, received_at);

CREATE TABLE polling_watermarks (
    channel    TEXT NOT NULL,
    account_id TEXT NOT NULL,
    source     TEXT NOT NULL,
    watermark  INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (channel, account_id, source)
) STRICT;

-- Per-session head: the state version survives pruning; pruned_through makes historyGap exact.
CREATE TABLE session_heads (
    session_key    TEXT PRIMARY KEY,
    head           INTEGER NOT NULL,
    pruned_through INTEGER NOT NULL DEFAULT 0,
    updated_at     INTEGER NOT NULL
) STRICT;

-- The global id orders appends, so pruning by age or by row cap removes a prefix per session.
CREATE TABLE session_state_events (
    id                INTEGER PRIMARY KEY,
    session_key       TEXT NOT NULL,
    sequence          INTEGER NOT NULL,
    kind              TEXT NOT NULL,
    actor_type        TEXT NOT NULL,
    actor_id          TEXT,
    summary           TEXT NOT NULL,
    outcome           TEXT,
    child_session_key TEXT,
    dedupe_key        TEXT,
    created_at        INTEGER NOT NULL,
    UNIQUE (session_key, sequence)
) STRICT;

CREATE UNIQUE INDEX session_state_events_dedupe ON session_state_events (session_key, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
CREATE INDEX session_state_events_created ON session_state_events (created_at);

CREATE TABLE session_watch_cursors (
    watcher_key      TEXT NOT NULL,
    target_key       TEXT NOT NULL,
    acked_version    INTEGER NOT NULL,
    notified_version INTEGER,
    material_version INTEGER NOT NULL,
    source           TEXT NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    PRIMARY KEY (watcher_key, target_key)
) STRICT;

CREATE INDEX session_watch_cursors_target ON session_watch_cursors (target_key);

CREATE TABLE sessions (
    session_key    TEXT PRIMARY KEY,
    agent_id       TEXT NOT NULL,
    deleted_at     INTEGER,
    format_version INTEGER NOT NULL,
    payload        TEXT NOT NULL
) STRICT;

CREATE TABLE acpx_leases (
    lease_id            TEXT PRIMARY KEY,
    gateway_instance_id TEXT NOT NULL,
    session_key         TEXT NOT NULL,
    state               TEXT NOT NULL,
    started_at          INTEGER NOT NULL,
    ended_at            INTEGER,
    format_version      INTEGER NOT NULL,
    payload             TEXT NOT NULL
) STRICT;

CREATE INDEX acpx_leases_instance ON acpx_leases (gateway_instance_id, state, started_at);
