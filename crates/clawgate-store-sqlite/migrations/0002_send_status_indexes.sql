-- clawgate state, schema 2: cheaper status changes for send intents.
-- Every send moves its intent pending -> sending -> sent. An index keyed by status rewrote an
-- entry at each of those moves; listings page in creation order instead, and only the statuses
-- operators look for keep an index of their own. The predicates below are repeated verbatim by
-- the queries that use these partial indexes (SQLite matches them textually).

DROP INDEX send_intents_status;

CREATE INDEX send_intents_created ON send_intents (created_at, id);

CREATE INDEX send_intents_attention ON send_intents (status, created_at, id)
    WHERE status IN ('unknown_after_send', 'failed', 'cancelled');
