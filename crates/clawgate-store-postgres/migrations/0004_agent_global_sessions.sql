-- clawgate state on PostgreSQL, schema 4 (each statement may run again): two things the session registry could not say before.
--
-- 1. Each agent's `global`-scope session is its own. Under session.scope = "global" every agent's
--    session is called `global`; the store now keys an agent's one by `global::<agentId>` (a
--    spelling no session key parses to, so it never collides with a real key) in every table
--    keyed by session, so two agents' rows, heads, logs and cursors never mix. The one `global`
--    session a state could hold so far moves to its agent's key; its payload keeps saying
--    `global` and is read under the key column. An agent id that is not one key segment cannot
--    be spelled so: that row stays a bare `global`, still readable as before.
-- 2. A deleted target leaves its watchers one deletion notice: the cursor stays, marked with who
--    deleted the target, until the watcher consumes the notice.
ALTER TABLE session_watch_cursors ADD COLUMN IF NOT EXISTS target_deleted_by TEXT;

-- The `sessions` row goes last: the statements before it read its agent id.
UPDATE session_heads SET session_key = (SELECT 'global::' || agent_id FROM sessions WHERE session_key = 'global')
    WHERE session_key = 'global' AND EXISTS (SELECT 1 FROM sessions WHERE session_key = 'global' AND agent_id <> ''
        AND strpos(agent_id, ':') = 0 AND agent_id !~ '\s');
UPDATE session_state_events SET session_key = (SELECT 'global::' || agent_id FROM sessions WHERE session_key = 'global')
    WHERE session_key = 'global' AND EXISTS (SELECT 1 FROM sessions WHERE session_key = 'global' AND agent_id <> ''
        AND strpos(agent_id, ':') = 0 AND agent_id !~ '\s');
UPDATE session_state_events SET child_session_key = (SELECT 'global::' || agent_id FROM sessions WHERE session_key = 'global')
    WHERE child_session_key = 'global' AND EXISTS (SELECT 1 FROM sessions WHERE session_key = 'global' AND agent_id <> ''
        AND strpos(agent_id, ':') = 0 AND agent_id !~ '\s');
UPDATE session_watch_cursors SET target_key = (SELECT 'global::' || agent_id FROM sessions WHERE session_key = 'global')
    WHERE target_key = 'global' AND EXISTS (SELECT 1 FROM sessions WHERE session_key = 'global' AND agent_id <> ''
        AND strpos(agent_id, ':') = 0 AND agent_id !~ '\s');
UPDATE sessions SET session_key = (SELECT 'global::' || agent_id FROM sessions WHERE session_key = 'global')
    WHERE session_key = 'global' AND EXISTS (SELECT 1 FROM sessions WHERE session_key = 'global' AND agent_id <> ''
        AND strpos(agent_id, ':') = 0 AND agent_id !~ '\s');
