-- clawgate state, schema 7 (each statement may run again): what channel crates keep between runs, scoped to one channel
-- account (kind + account). Books of keyed records, numbered per book in commit order, and
-- named values written with compare-and-set.
CREATE TABLE IF NOT EXISTS channel_books (
    kind     TEXT NOT NULL,
    account  TEXT NOT NULL,
    book     TEXT NOT NULL,
    last_seq INTEGER NOT NULL,
    PRIMARY KEY (kind, account, book)
) STRICT, WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS channel_records (
    kind        TEXT NOT NULL,
    account     TEXT NOT NULL,
    book        TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (kind, account, book, seq)
) STRICT, WITHOUT ROWID;

CREATE UNIQUE INDEX IF NOT EXISTS channel_records_by_key ON channel_records (kind, account, book, key);
CREATE INDEX IF NOT EXISTS channel_records_by_time ON channel_records (kind, account, book, recorded_at);

CREATE TABLE IF NOT EXISTS channel_values (
    kind       TEXT NOT NULL,
    account    TEXT NOT NULL,
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    version    INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (kind, account, name)
) STRICT, WITHOUT ROWID;
