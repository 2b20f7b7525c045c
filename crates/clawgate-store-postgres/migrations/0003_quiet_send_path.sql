-- clawgate state on PostgreSQL, schema 3: only the writes notices depend on are announced.
-- A transaction that NOTIFYs takes a database-wide lock at commit, so per-row notifications on
-- send intents and inbound records serialised every send of every gateway behind one lock
-- (benchmark: about 1,300 sends/s, against 21,900 plain inserts/s on the same server). The
-- only reader of the feed is notice rebuilding, which reads signal events and watch cursors;
-- other gateways find intents and inbound records by polling their due times and claims.
DROP TRIGGER IF EXISTS send_intents_changed ON send_intents;
DROP TRIGGER IF EXISTS inbound_records_changed ON inbound_records;
