-- clawgate state, schema 3: the send intents' partial indexes, with plain comparisons.
-- SQLite evaluates a partial index's predicate on the old and the new row of every insert and
-- update, and it codes an `IN (...)` list as a temporary in-memory B-tree built afresh for each
-- evaluation: four of them for every status change of every send. The same sets written as ORs
-- of equalities cost a few comparisons. Same rows in each index; the queries that use these
-- indexes repeat the predicates verbatim (SQLite matches them textually).

DROP INDEX send_intents_open;

CREATE INDEX send_intents_open ON send_intents (created_at, id)
    WHERE (status = 'pending' OR status = 'sending' OR status = 'committing' OR status = 'unknown_after_send');

DROP INDEX send_intents_attention;

CREATE INDEX send_intents_attention ON send_intents (status, created_at, id)
    WHERE (status = 'unknown_after_send' OR status = 'failed' OR status = 'cancelled');
