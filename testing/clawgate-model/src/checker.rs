//! A small explicit-state checker: breadth-first search over every interleaving from the
//! initial states, a visited set of states, and a counterexample as the actions that lead to
//! the first violation (breadth first, so it is a shortest one).

use std::collections::{HashMap, VecDeque};
use std::fmt::{self, Debug, Display};
use std::hash::Hash;

/// A protocol as a transition system.
pub trait Model {
    type State: Clone + Eq + Hash + Debug;
    type Action: Clone + Debug + Display;

    fn init(&self) -> Vec<Self::State>;

    /// Every action enabled in `state`, with the state it leads to.
    fn next(&self, state: &Self::State, out: &mut Vec<(Self::Action, Self::State)>);

    /// Properties every reachable state must have: `Err` names the one that fails.
    fn check_state(&self, state: &Self::State) -> Result<(), String>;

    /// Properties of one step.
    fn check_step(
        &self,
        _from: &Self::State,
        _action: &Self::Action,
        _to: &Self::State,
    ) -> Result<(), String> {
        Ok(())
    }

    /// Properties of a state where nothing can happen any more (the bounded form of "it ends
    /// well"): `Err` names what is left unfinished.
    fn check_end(&self, state: &Self::State) -> Result<(), String>;

    /// Whether to check progress too: from every reachable state, some path leads to an end
    /// state (every end is checked by [`Model::check_end`]). Under fair scheduling that is
    /// "everything ends, and ends well"; a livelock or a wait nothing can satisfy fails it.
    fn progress(&self) -> bool {
        false
    }

    /// One line describing a state, for traces.
    fn describe(&self, state: &Self::State) -> String {
        format!("{state:?}")
    }
}

/// A property that failed, with the steps that get there from an initial state.
#[derive(Debug, Clone)]
pub struct Violation {
    pub property: String,
    /// The initial state, then each action with the state after it.
    pub initial: String,
    pub steps: Vec<(String, String)>,
}

impl Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "violated: {}", self.property)?;
        writeln!(f, "   start: {}", self.initial)?;
        for (n, (action, state)) in self.steps.iter().enumerate() {
            writeln!(f, "{:>3}. {action}", n + 1)?;
            writeln!(f, "      → {state}")?;
        }
        Ok(())
    }
}

/// What a check explored, and the first violation if there was one.
#[derive(Debug, Clone)]
pub struct Report {
    pub states: usize,
    pub transitions: usize,
    /// Reachable states with nothing left to do.
    pub ends: usize,
    /// The longest shortest path from an initial state.
    pub depth: usize,
    pub violation: Option<Violation>,
}

impl Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} states, {} transitions, {} end states, depth {}",
            self.states, self.transitions, self.ends, self.depth
        )?;
        match &self.violation {
            Some(v) => write!(f, "\n{v}"),
            None => write!(f, ": every property holds"),
        }
    }
}

/// Explores every reachable state; stops at the first violation.
pub fn check<M: Model>(model: &M) -> Report {
    // Index of each state, its parent's index and the action from there (for traces).
    let mut index: HashMap<M::State, u32> = HashMap::new();
    let mut parent: Vec<Option<(u32, M::Action)>> = Vec::new();
    let mut depth_of: Vec<u32> = Vec::new();
    let mut queue: VecDeque<(M::State, u32)> = VecDeque::new();
    let mut report = Report {
        states: 0,
        transitions: 0,
        ends: 0,
        depth: 0,
        violation: None,
    };
    for state in model.init() {
        if index.contains_key(&state) {
            continue;
        }
        let id = parent.len() as u32;
        index.insert(state.clone(), id);
        parent.push(None);
        depth_of.push(0);
        if let Err(property) = model.check_state(&state) {
            report.violation = Some(trace(model, &index, &parent, id, None, property));
            report.states = parent.len();
            return report;
        }
        queue.push_back((state, id));
    }
    let progress = model.progress();
    // Every transition as (from, to), for the progress check.
    let mut edges: Vec<(u32, u32)> = Vec::new();
    let mut is_end: Vec<bool> = Vec::new();
    let mut successors = Vec::new();
    while let Some((state, id)) = queue.pop_front() {
        successors.clear();
        model.next(&state, &mut successors);
        report.transitions += successors.len();
        if progress {
            is_end.resize(parent.len().max(id as usize + 1), false);
            is_end[id as usize] = successors.is_empty();
        }
        let failed = if successors.is_empty() {
            report.ends += 1;
            model.check_end(&state).err().map(|p| (id, p))
        } else {
            None
        };
        if let Some((at, property)) = failed {
            report.violation = Some(trace(model, &index, &parent, at, None, property));
            break;
        }
        for (action, to) in successors.drain(..) {
            if let Err(property) = model.check_step(&state, &action, &to) {
                report.violation = Some(trace(
                    model,
                    &index,
                    &parent,
                    id,
                    Some((action, to)),
                    property,
                ));
                break;
            }
            if let Some(known) = index.get(&to) {
                if progress {
                    edges.push((id, *known));
                }
                continue;
            }
            let at = parent.len() as u32;
            if progress {
                edges.push((id, at));
            }
            let depth = depth_of[id as usize] + 1;
            report.depth = report.depth.max(depth as usize);
            parent.push(Some((id, action)));
            depth_of.push(depth);
            index.insert(to.clone(), at);
            if let Err(property) = model.check_state(&to) {
                report.violation = Some(trace(model, &index, &parent, at, None, property));
                break;
            }
            queue.push_back((to, at));
        }
        if report.violation.is_some() {
            break;
        }
    }
    report.states = parent.len();
    if progress && report.violation.is_none() {
        is_end.resize(parent.len(), false);
        if let Some(stuck) = first_without_an_end(parent.len(), &edges, &is_end) {
            report.violation = Some(trace(
                model,
                &index,
                &parent,
                stuck,
                None,
                "progress: no end state is reachable from here".to_owned(),
            ));
        }
    }
    report
}

/// The first state (in breadth-first order: a shortest trace) from which no end state is
/// reachable, found by walking the transitions backwards from every end state.
fn first_without_an_end(states: usize, edges: &[(u32, u32)], is_end: &[bool]) -> Option<u32> {
    // Predecessors in compressed form: `start[to]..start[to + 1]` indexes `from`.
    let mut start = vec![0u32; states + 1];
    for (_, to) in edges {
        start[*to as usize + 1] += 1;
    }
    for n in 0..states {
        start[n + 1] += start[n];
    }
    let mut fill = start.clone();
    let mut from = vec![0u32; edges.len()];
    for (a, b) in edges {
        from[fill[*b as usize] as usize] = *a;
        fill[*b as usize] += 1;
    }
    let mut reaches = is_end.to_vec();
    let mut stack: Vec<u32> = (0..states as u32).filter(|s| is_end[*s as usize]).collect();
    while let Some(to) = stack.pop() {
        let range = start[to as usize] as usize..start[to as usize + 1] as usize;
        for a in &from[range] {
            if !reaches[*a as usize] {
                reaches[*a as usize] = true;
                stack.push(*a);
            }
        }
    }
    reaches.iter().position(|r| !r).map(|s| s as u32)
}

/// The path to state `at` (or, for a failed step, to `at` and then `last`).
fn trace<M: Model>(
    model: &M,
    index: &HashMap<M::State, u32>,
    parent: &[Option<(u32, M::Action)>],
    at: u32,
    last: Option<(M::Action, M::State)>,
    property: String,
) -> Violation {
    let mut path = vec![at];
    let mut cursor = at;
    while let Some((from, _)) = &parent[cursor as usize] {
        path.push(*from);
        cursor = *from;
    }
    path.reverse();
    // One pass over the visited set finds the states of the path.
    let mut states: HashMap<u32, &M::State> = HashMap::new();
    for (state, id) in index {
        if path.contains(id) {
            states.insert(*id, state);
        }
    }
    let describe = |id: &u32| {
        states
            .get(id)
            .map_or_else(String::new, |s| model.describe(s))
    };
    let mut steps: Vec<(String, String)> = path[1..]
        .iter()
        .map(|id| {
            let action = parent[*id as usize].as_ref().map(|(_, a)| a.to_string());
            (action.unwrap_or_default(), describe(id))
        })
        .collect();
    if let Some((action, state)) = last {
        steps.push((action.to_string(), model.describe(&state)));
    }
    Violation {
        property,
        initial: describe(&path[0]),
        steps,
    }
}
