//! Session visibility: one pure rule on row metadata, used by every session tool.
//!
//! Invariants:
//! * the decision reads only the [`SessionVisibilityInput`] (no secondary lookups), so what
//!   `sessions_list` shows, `sessions_history`, `sessions_send` and `session_status` allow;
//! * `all` ⊇ `agent` ⊇ `tree` ⊇ `self`: a requester-owned child is visible wherever the
//!   configured visibility includes the requester's tree;
//! * a sandboxed requester never sees more than `tree`;
//! * agent-to-agent patterns fail closed and match in linear time.

use clawgate_store::SessionRow;
use clawgate_types::{
    AgentToAgentPolicy, SessionKey, SessionVisibility, SessionVisibilityInput, VisibilityRow,
};

/// Whether the requester may see (list, read, send to, query) the row.
pub fn can_see_session_row(input: &SessionVisibilityInput) -> bool {
    let requester = &input.requester_session_key;
    let row = &input.row;
    if row.key == *requester {
        return true;
    }
    let owned = is_in_requester_tree(row, requester);
    let same_agent = requester.agent_id() == Some(row.agent_id.as_str());
    match effective_visibility(input.visibility, input.requester_sandboxed) {
        SessionVisibility::OwnSession => false,
        SessionVisibility::Tree => owned,
        SessionVisibility::Agent => owned || same_agent,
        // Ownership is checked before the a2a policy on purpose: a requester's own ACP child of
        // another agent stays visible even when agent-to-agent access is off.
        SessionVisibility::All => {
            owned
                || same_agent
                || (input.a2a_policy.enabled && agent_allowed(&input.a2a_policy, &row.agent_id))
        }
    }
}

/// The visibility that applies: sandboxed requesters are clamped to `tree` (never widened).
pub fn effective_visibility(configured: SessionVisibility, sandboxed: bool) -> SessionVisibility {
    match (configured, sandboxed) {
        (SessionVisibility::OwnSession, _) => SessionVisibility::OwnSession,
        (_, true) => SessionVisibility::Tree,
        (v, false) => v,
    }
}

/// The row is in the requester's tree: the row itself says it was spawned by, parented by or
/// is owned by the requester.
fn is_in_requester_tree(row: &VisibilityRow, requester: &SessionKey) -> bool {
    [
        &row.owner_session_key,
        &row.spawned_by,
        &row.parent_session_key,
    ]
    .into_iter()
    .any(|k| k.as_ref() == Some(requester))
}

/// Whether the policy's allow list admits `agent_id` (the `enabled` flag is checked apart).
pub fn agent_allowed(policy: &AgentToAgentPolicy, agent_id: &str) -> bool {
    policy.allow.iter().any(|p| pattern_matches(p, agent_id))
}

/// One allow pattern against an agent id.
///
/// * blank patterns match nothing (a config typo must not open access);
/// * a pattern with `*` is a case-insensitive wildcard (`*` = any run of characters);
/// * a pattern without `*` is an exact, case-sensitive name;
/// * every other character is literal (`.`, `+`, `(`… are not regex syntax).
///
/// Matching splits the pattern at `*` and finds each literal piece left to right; leftmost
/// placement is always safe for `*`-only globs, so there is no backtracking and the cost is
/// linear in the lengths (the substring search is two-way).
pub fn pattern_matches(pattern: &str, agent_id: &str) -> bool {
    let pattern = pattern.trim();
    if pattern.is_empty() {
        return false;
    }
    if !pattern.contains('*') {
        return pattern == agent_id;
    }
    let pattern = pattern.to_lowercase();
    let text = agent_id.to_lowercase();
    let pieces: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = match pieces.split_first() {
        Some(split) => split,
        None => return false,
    };
    let Some(mut remaining) = text.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return remaining.is_empty();
    };
    for piece in middle {
        match remaining.find(piece) {
            Some(at) => remaining = &remaining[at + piece.len()..],
            None => return false,
        }
    }
    remaining.len() >= last.len() && remaining.ends_with(last)
}

/// The visibility metadata of a registry row: ownership lives on the row, including the ACP
/// owner record, so no second query is ever needed.
pub fn visibility_row(row: &SessionRow) -> VisibilityRow {
    let acp = row.acp_owner.as_ref();
    VisibilityRow {
        key: row.session_key.clone(),
        agent_id: row.agent_id.clone(),
        owner_session_key: row
            .owner_session_key
            .clone()
            .or_else(|| acp.map(|a| a.owner_session_key.clone())),
        spawned_by: row
            .spawned_by
            .clone()
            .or_else(|| acp.and_then(|a| a.spawned_by.clone())),
        parent_session_key: row
            .parent_session_key
            .clone()
            .or_else(|| acp.and_then(|a| a.parent_session_key.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_pieces_are_found_left_to_right() {
        assert!(pattern_matches("a*b*c", "aXbYc"));
        assert!(pattern_matches("*", ""));
        assert!(pattern_matches("**", "x"));
        assert!(!pattern_matches("a*b", "ab-"));
        assert!(pattern_matches("ab*ab", "abab"));
        assert!(!pattern_matches("ab*ba", "aba"), "pieces may not overlap");
    }
}
