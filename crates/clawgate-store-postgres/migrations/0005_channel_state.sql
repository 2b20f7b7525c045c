-- clawgate state on PostgreSQL, schema 5 (each statement may run again): what channel crates keep between runs, scoped to one
-- channel account (kind + account), shared by every gateway on this database. A book's
-- `last_seq` row is locked by each append until it commits, so records are numbered in commit
-- order and a reader that has seen `seq` never misses a later commit with a lower number.
CREATE TABLE IF NOT EXISTS channel_books (
    kind     TEXT NOT NULL,
    account  TEXT NOT NULL,
    book     TEXT NOT NULL,
    last_seq BIGINT NOT NULL,
    PRIMARY KEY (kind, account, book)
);

CREATE TABLE IF NOT EXISTS channel_records (
    kind        TEXT NOT NULL,
    account     TEXT NOT NULL,
    book        TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    key         TEXT NOT NULL,
    value       TEXT NOT NULL,
    recorded_at BIGINT NOT NULL,
    PRIMARY KEY (kind, account, book, seq),
    UNIQUE (kind, account, book, key)
);

CREATE INDEX IF NOT EXISTS channel_records_by_time ON channel_records (kind, account, book, recorded_at);

CREATE TABLE IF NOT EXISTS channel_values (
    kind       TEXT NOT NULL,
    account    TEXT NOT NULL,
    name       TEXT NOT NULL,
    value      TEXT NOT NULL,
    version    BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (kind, account, name)
);
