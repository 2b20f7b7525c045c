-- clawgate state on PostgreSQL, schema 1: the tables of the SQLite backend's schema 4, in the
-- store's own schema (the connection's search_path). Rows that hold whole domain records keep
-- them as versioned JSON text in `payload` beside the columns queries need; later migrations
-- convert payloads, they never drop rows.

CREATE TABLE send_intents (
    id              TEXT PRIMARY KEY,
    idempotency_key TEXT NOT NULL UNIQUE,
    channel         TEXT NOT NULL,
    account_id      TEXT,
    status          TEXT NOT NULL,
    attempt         BIGINT NOT NULL,
    next_attempt_at BIGINT,
    expires_at      BIGINT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    claimed_by      TEXT,
    claim_until     BIGINT,
    format_version  BIGINT NOT NULL,
    payload         TEXT NOT NULL
);

-- Recovery scans only the intents that may still need work, oldest first.
CREATE INDEX send_intents_open ON send_intents (created_at, id)
    WHERE status IN ('pending', 'sending', 'committing', 'unknown_after_send');
CREATE INDEX send_intents_created ON send_intents (created_at, id);
CREATE INDEX send_intents_attention ON send_intents (status, created_at, id)
    WHERE status IN ('unknown_after_send', 'failed', 'cancelled');
CREATE INDEX send_intents_claimed_by ON send_intents (claimed_by) WHERE claimed_by IS NOT NULL;

CREATE TABLE inbound_records (
    channel     TEXT NOT NULL,
    account_id  TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    status      TEXT NOT NULL,
    attempts    BIGINT NOT NULL,
    payload     TEXT NOT NULL,
    last_error  TEXT,
    received_at BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL,
    PRIMARY KEY (channel, account_id, event_id)
);

CREATE INDEX inbound_records_status ON inbound_records (status, received_at);

CREATE TABLE polling_watermarks (
    channel    TEXT NOT NULL,
    account_id TEXT NOT NULL,
    source     TEXT NOT NULL,
    watermark  BIGINT NOT NULL,
    checkpoint TEXT,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (channel, account_id, source)
);

-- Per-session head: the state version survives pruning; pruned_through makes historyGap exact.
-- Appends take this row's lock, so one session's sequences are handed out one at a time.
CREATE TABLE session_heads (
    session_key    TEXT PRIMARY KEY,
    head           BIGINT NOT NULL,
    pruned_through BIGINT NOT NULL DEFAULT 0,
    updated_at     BIGINT NOT NULL
);

-- The global id orders appends, so pruning by age or by row cap removes a prefix per session.
CREATE TABLE session_state_events (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_key       TEXT NOT NULL,
    sequence          BIGINT NOT NULL,
    kind              TEXT NOT NULL,
    actor_type        TEXT NOT NULL,
    actor_id          TEXT,
    summary           TEXT NOT NULL,
    outcome           TEXT,
    child_session_key TEXT,
    dedupe_key        TEXT,
    created_at        BIGINT NOT NULL,
    UNIQUE (session_key, sequence)
);

CREATE UNIQUE INDEX session_state_events_dedupe ON session_state_events (session_key, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
CREATE INDEX session_state_events_created ON session_state_events (created_at);

CREATE TABLE session_watch_cursors (
    watcher_key      TEXT NOT NULL,
    target_key       TEXT NOT NULL,
    acked_version    BIGINT NOT NULL,
    notified_version BIGINT,
    material_version BIGINT NOT NULL,
    source           TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    PRIMARY KEY (watcher_key, target_key)
);

CREATE INDEX session_watch_cursors_target ON session_watch_cursors (target_key);
CREATE INDEX session_watch_cursors_pending ON session_watch_cursors (watcher_key, target_key)
    WHERE notified_version IS NOT NULL;

CREATE TABLE sessions (
    session_key    TEXT PRIMARY KEY,
    agent_id       TEXT NOT NULL,
    deleted_at     BIGINT,
    format_version BIGINT NOT NULL,
    payload        TEXT NOT NULL
);

CREATE TABLE acpx_leases (
    lease_id            TEXT PRIMARY KEY,
    gateway_instance_id TEXT NOT NULL,
    session_key         TEXT NOT NULL,
    state               TEXT NOT NULL,
    started_at          BIGINT NOT NULL,
    ended_at            BIGINT,
    format_version      BIGINT NOT NULL,
    payload             TEXT NOT NULL
);

CREATE INDEX acpx_leases_instance ON acpx_leases (gateway_instance_id, state, started_at);

-- The change feed: every write other gateways must see (intents, inbound records, signal events,
-- watch cursors) notifies `clawgate_changes` in its own transaction, so the notification is
-- delivered exactly when the write commits. The payload names the schema, so stores of other
-- schemas in the same database ignore it; PostgreSQL folds identical notifications of one
-- transaction into one.
CREATE FUNCTION clawgate_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('clawgate_changes', TG_TABLE_SCHEMA);
    RETURN NULL;
END
$$;

CREATE TRIGGER send_intents_changed AFTER INSERT OR UPDATE ON send_intents
    FOR EACH ROW EXECUTE FUNCTION clawgate_notify_change();
CREATE TRIGGER inbound_records_changed AFTER INSERT OR UPDATE ON inbound_records
    FOR EACH ROW EXECUTE FUNCTION clawgate_notify_change();
CREATE TRIGGER session_state_events_changed AFTER INSERT ON session_state_events
    FOR EACH ROW EXECUTE FUNCTION clawgate_notify_change();
CREATE TRIGGER session_watch_cursors_changed AFTER INSERT OR UPDATE OR DELETE
    ON session_watch_cursors FOR EACH ROW EXECUTE FUNCTION clawgate_notify_change();
