-- clawgate state, schema 5: which gateway serves each channel account. A SQLite state has one
-- gateway (the state directory's lock), so its rows only ever name that gateway; the table is
-- here so both backends answer the same port.
CREATE TABLE account_leases (
    account TEXT PRIMARY KEY,
    holder  TEXT NOT NULL,
    epoch   INTEGER NOT NULL,
    until   INTEGER NOT NULL
) STRICT;
