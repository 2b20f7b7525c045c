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
    let mut successors = Vec::new();
    while let Some((state, id)) = queue.pop_front() {
        successors.clear();
        model.next(&state, &mut successors);
        report.transitions += successors.len();
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
            if index.contains_key(&to) {
                continue;
            }
            let at = parent.len() as u32;
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
    report
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
