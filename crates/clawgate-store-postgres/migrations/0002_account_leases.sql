-- clawgate state on PostgreSQL, schema 2: which gateway serves each channel account. A row is
-- taken (or renewed) by one conditional upsert; a change of hands raises the epoch.
CREATE TABLE account_leases (
    account TEXT PRIMARY KEY,
    holder  TEXT NOT NULL,
    epoch   BIGINT NOT NULL,
    until   BIGINT NOT NULL
);
