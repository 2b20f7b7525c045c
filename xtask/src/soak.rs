//! `cargo xtask soak`: the gateway's random-time crash matrices run long, for releases — every
//! channel's matrix (QA, Telegram, Matrix, IRC, …), several seeds, many SIGKILLs each, on a
//! release build — with the figures added up at the end. It runs the same tests as CI (the
//! `random_sigkills_*` tests in `crates/clawgate/tests/gateway`), sized through
//! `CLAWGATE_SOAK_KILLS` / `CLAWGATE_SOAK_MESSAGES`; it is not part of `cargo xtask ci`. The
//! `shared-postgres` matrices (two gateways on one PostgreSQL state, kills alternating: QA, Zalo,
//! WhatsApp, Teams, LINE) run on
//! a throwaway cluster started here, unless `CLAWGATE_TEST_PG=0` leaves it out.
//!
//! First it runs the protocol model checks (`clawgate-model`) one step deeper than in CI
//! (`CLAWGATE_MODEL_DEPTH`; `--matrix model` runs them alone), then every fuzz target (the wire
//! types' decoding, the configuration file, the control API's parameters, each channel's
//! normalizer: the tests named `fuzz::…` and `normalize_never_panics…`) with
//! `CLAWGATE_FUZZ_CASES` set to `--fuzz-cases` (CI runs `clawgate_fuzz::DEFAULT_CASES`);
//! `--matrix fuzz` runs only those. The deterministic simulation (`clawgate-sim`) runs
//! 10,000 seeds per adapter kind (`--matrix sim` alone).

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;

use anyhow::{Context as _, bail};

use crate::cmd::{cargo, display, run as run_command};
use crate::postgres::{self, Cluster};

/// The matrix of two gateways sharing one PostgreSQL state (module `shared_postgres`).
const SHARED_POSTGRES: &str = "shared-postgres";

/// `--matrix fuzz`: the fuzz targets alone.
pub(crate) const FUZZ: &str = "fuzz";

/// Cases per fuzz target in a soak unless `--fuzz-cases` says otherwise.
pub(crate) const DEFAULT_FUZZ_CASES: u64 = 20_000;

/// The libtest filters every fuzz target's name matches.
const FUZZ_FILTERS: [&str; 2] = ["fuzz::", "normalize_never_panics"];

/// The protocol model checks, as a matrix name.
const MODEL: &str = "model";

/// The deterministic simulation, as a matrix name.
const SIM: &str = "sim";

/// Seeds of the deterministic simulation per adapter kind in a soak (CI runs a few hundred).
const SIM_SEEDS: &str = "10000";

/// How much deeper than CI the soak checks the models (more units, events and crashes; a few
/// million states, under a minute on a release build).
const MODEL_DEPTH: &str = "1";

/// What one soak runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Soak {
    pub(crate) seeds: Vec<u64>,
    pub(crate) kills: u64,
    /// One matrix (`qa`, `telegram`, `matrix`, `irc`, `twitch`, …: the test module; `fuzz`:
    /// the fuzz targets alone), or all.
    pub(crate) matrix: Option<String>,
    /// Cases per fuzz target.
    pub(crate) fuzz_cases: u64,
}

impl Soak {
    /// Five seeds of 100 kills: 500 SIGKILLs per matrix. The seeds are fixed so a release's
    /// soak can be replayed; `--seeds` picks others.
    pub(crate) fn default_seeds() -> Vec<u64> {
        vec![16, 1_600, 160_016, 16_000_016, 1_616_161_616]
    }

    /// The libtest filter: every crash matrix, or the one named (the QA matrix lives in the
    /// `crash_matrix` module).
    fn filter(&self) -> String {
        match self.matrix.as_deref() {
            None => "random_sigkills".to_owned(),
            Some("qa") => "crash_matrix::random_sigkills".to_owned(),
            // The module and its per-channel submodules (`shared_postgres::line::…`): libtest
            // filters by substring, so the module prefix; its few other tests are short.
            Some(SHARED_POSTGRES) => format!("{}::", postgres::GATEWAY_MODULE),
            // A module name has `_` where a matrix name may have `-` (`zalo-personal`).
            Some(name) => format!("{}::random_sigkills", name.replace('-', "_")),
        }
    }
}

/// The figures one matrix prints for one seed (`<name> crash matrix figures: k=v …`).
#[derive(Debug, Default, Clone)]
struct Figures {
    /// `qa`, `telegram Polling`, `irc`, …
    matrix: String,
    kills: u64,
    messages: u64,
    finals: u64,
    /// Outcomes the matrix allows with their evidence: failure notices, finals left unknown
    /// after a cut answer, lines a platform never redelivers.
    excused: u64,
    orphans: u64,
    violations: u64,
    leftovers: u64,
}

fn parse_figures(line: &str) -> Option<Figures> {
    let (name, rest) = line.split_once("crash matrix figures:")?;
    let name = name.trim();
    let mut figures = Figures {
        matrix: if name.is_empty() { "qa" } else { name }.to_owned(),
        ..Figures::default()
    };
    for pair in rest.split_whitespace() {
        let Some((key, value)) = pair.split_once('=') else {
            continue;
        };
        let Ok(number) = value.parse::<u64>() else {
            if key == "mode" {
                figures.matrix = format!("{} {value}", figures.matrix);
            }
            continue;
        };
        match key {
            "kills" => figures.kills = number,
            "messages" => figures.messages = number,
            "finals" => figures.finals = number,
            "notices" | "unknown" | "unrecorded" | "unseen_at_kill" => figures.excused += number,
            "orphan_previews" => figures.orphans = number,
            "violations" => figures.violations = number,
            "leftovers" => figures.leftovers = number,
            _ => {}
        }
    }
    Some(figures)
}

impl Soak {
    /// Whether the shared-PostgreSQL matrix is among those this soak runs.
    fn runs_shared_postgres(&self) -> bool {
        self.matrix
            .as_deref()
            .is_none_or(|name| name == SHARED_POSTGRES)
    }

    /// Whether the fuzz targets run (all of the soak, or `--matrix fuzz`).
    fn runs_fuzz(&self) -> bool {
        self.matrix.as_deref().is_none_or(|name| name == FUZZ)
    }

    /// Whether the protocol model checks are among what this soak runs.
    fn runs_model(&self) -> bool {
        self.matrix.as_deref().is_none_or(|name| name == MODEL)
    }

    /// Whether the deterministic simulation's seeds are among what this soak runs.
    fn runs_sim(&self) -> bool {
        self.matrix.as_deref().is_none_or(|name| name == SIM)
    }
}

/// Every fuzz target of the workspace, `cases` cases each, on a release build.
fn fuzz(cases: u64) -> anyhow::Result<()> {
    let mut command = cargo([
        "test",
        "--release",
        "--workspace",
        "--all-features",
        "--exclude",
        "xtask",
        "--exclude",
        "clawgate-benchmarks",
        "--exclude",
        "clawgate-e2e",
        "--",
    ]);
    command
        .args(FUZZ_FILTERS)
        .env("CLAWGATE_FUZZ_CASES", cases.to_string());
    let line = display(&command);
    eprintln!("soak: fuzz targets, {cases} cases each: CLAWGATE_FUZZ_CASES={cases} {line}");
    let status = command
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!(
            "a fuzz target failed (its minimal failing input is printed above); replay with \
             CLAWGATE_FUZZ_CASES={cases} {line}"
        );
    }
    println!("soak: every fuzz target held for {cases} cases");
    Ok(())
}

/// The deterministic simulation, `SIM_SEEDS` seeds per adapter kind; each test prints its
/// seeds per second.
fn run_sim() -> anyhow::Result<()> {
    let mut command = cargo([
        "test",
        "--release",
        "-p",
        "clawgate-sim",
        "--",
        "--nocapture",
    ]);
    command.env("CLAWGATE_SIM_SEEDS", SIM_SEEDS);
    eprintln!(
        "soak: deterministic simulation: CLAWGATE_SIM_SEEDS={SIM_SEEDS} {}",
        display(&command)
    );
    run_command(&mut command)
}

/// The model checks at the soak's depth; each test prints the states it explored.
fn run_model() -> anyhow::Result<()> {
    let mut command = cargo([
        "test",
        "--release",
        "-p",
        "clawgate-model",
        "--",
        "--nocapture",
    ]);
    command.env("CLAWGATE_MODEL_DEPTH", MODEL_DEPTH);
    eprintln!("soak: model checks: {}", display(&command));
    run_command(&mut command)
}

pub(crate) fn run(soak: &Soak) -> anyhow::Result<()> {
    if soak.runs_model() {
        run_model()?;
    }
    if soak.runs_sim() {
        run_sim()?;
    }
    if soak.runs_fuzz() {
        fuzz(soak.fuzz_cases)?;
    }
    if matches!(soak.matrix.as_deref(), Some(FUZZ | MODEL | SIM)) {
        return Ok(());
    }
    // At least three messages per kill, never fewer than the QA matrix's CI run of 120.
    let messages = (soak.kills * 3).max(120);
    let filter = soak.filter();
    // The shared-state matrix needs a server: a throwaway cluster, stopped when this returns.
    let mut skip = None;
    let cluster = if !soak.runs_shared_postgres() {
        None
    } else if postgres::left_out() {
        if soak.matrix.is_some() {
            bail!(
                "the {SHARED_POSTGRES} matrix needs PostgreSQL, and {}=0 leaves it out",
                postgres::SWITCH_VAR
            );
        }
        println!(
            "soak: !!! {}=0: the {SHARED_POSTGRES} matrix is LEFT OUT !!!",
            postgres::SWITCH_VAR
        );
        skip = Some(postgres::GATEWAY_MODULE);
        None
    } else {
        Some(Cluster::start().context("the shared-postgres matrix needs a PostgreSQL cluster")?)
    };
    let mut rows: Vec<(u64, Figures)> = Vec::new();
    let mut failed_seeds = Vec::new();
    for &seed in &soak.seeds {
        let mut command = cargo([
            "test",
            "--release",
            "-p",
            "clawgate",
            "--test",
            "gateway",
            "--",
            &filter,
            "--nocapture",
            // One matrix at a time: each has the machine to itself, as in a real outage.
            "--test-threads",
            "1",
        ]);
        if let Some(module) = skip {
            command.args(["--skip", module]);
        }
        if let Some(cluster) = &cluster {
            command.envs(cluster.exports());
        }
        command
            .env("CLAWGATE_CRASH_SEED", seed.to_string())
            .env("CLAWGATE_SOAK_KILLS", soak.kills.to_string())
            .env("CLAWGATE_SOAK_MESSAGES", messages.to_string())
            .stderr(Stdio::piped());
        let line = display(&command);
        eprintln!("soak: seed {seed}: {line}");
        let mut child = command
            .spawn()
            .with_context(|| format!("could not start `{line}`"))?;
        let stderr = child.stderr.take().context("stderr of the test")?;
        let before = rows.len();
        // Passed through as it comes, so a long run shows its progress and its failure table.
        for text in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{text}");
            if let Some(found) = parse_figures(&text) {
                rows.push((seed, found));
            }
        }
        let status = child
            .wait()
            .with_context(|| format!("waiting for `{line}`"))?;
        if !status.success() || rows.len() == before {
            failed_seeds.push(seed);
        }
    }
    println!(
        "soak: {} seed(s), {} kills and {messages} messages per matrix and seed",
        soak.seeds.len(),
        soak.kills
    );
    println!(
        "{:>12} {:<18} {:>6} {:>9} {:>7} {:>8} {:>8} {:>11} {:>10}",
        "seed",
        "matrix",
        "kills",
        "messages",
        "finals",
        "excused",
        "orphans",
        "violations",
        "leftovers"
    );
    let mut total = Figures::default();
    for (seed, f) in &rows {
        println!(
            "{seed:>12} {:<18} {:>6} {:>9} {:>7} {:>8} {:>8} {:>11} {:>10}",
            f.matrix,
            f.kills,
            f.messages,
            f.finals,
            f.excused,
            f.orphans,
            f.violations,
            f.leftovers
        );
        total.kills += f.kills;
        total.messages += f.messages;
        total.finals += f.finals;
        total.excused += f.excused;
        total.orphans += f.orphans;
        total.violations += f.violations;
        total.leftovers += f.leftovers;
    }
    println!(
        "{:>12} {:<18} {:>6} {:>9} {:>7} {:>8} {:>8} {:>11} {:>10}",
        "total",
        format!("{} runs", rows.len()),
        total.kills,
        total.messages,
        total.finals,
        total.excused,
        total.orphans,
        total.violations,
        total.leftovers
    );
    if !failed_seeds.is_empty() {
        bail!(
            "the soak failed for seed(s) {failed_seeds:?} (a failing matrix prints its table and \
             where it kept its state); replay one with CLAWGATE_CRASH_SEED=<seed> \
             CLAWGATE_SOAK_KILLS={} cargo test --release -p clawgate --test gateway {filter}",
            soak.kills
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_lines_of_every_matrix_are_read_back() {
        let f = parse_figures(
            "crash matrix figures: seed=7 kills=30 messages=120 finals=49 notices=2 \
             violations=71 leftovers=0",
        )
        .expect("figures");
        assert_eq!(
            (
                f.matrix.as_str(),
                f.kills,
                f.messages,
                f.finals,
                f.excused,
                f.violations
            ),
            ("qa", 30, 120, 49, 2, 71)
        );
        let t = parse_figures(
            "telegram crash matrix figures: mode=Webhook seed=3 kills=12 messages=40 finals=39 \
             unknown=1 orphan_previews=2 violations=0 leftovers=0 seconds=31.5",
        )
        .expect("figures");
        assert_eq!(
            (t.matrix.as_str(), t.finals, t.excused, t.orphans),
            ("telegram Webhook", 39, 1, 2)
        );
        let i = parse_figures(
            "irc crash matrix figures: seed=5 kills=8 messages=27 finals=22 unknown=2 \
             unrecorded=3 violations=0 leftovers=0 seconds=36.2",
        )
        .expect("figures");
        assert_eq!((i.matrix.as_str(), i.excused), ("irc", 5));
        assert!(parse_figures("crash matrix: seed 7").is_none());
    }

    #[test]
    fn one_matrix_or_all_are_selected() {
        let soak = |matrix: Option<&str>| Soak {
            seeds: vec![1],
            kills: 1,
            matrix: matrix.map(str::to_owned),
            fuzz_cases: 1,
        };
        assert_eq!(soak(None).filter(), "random_sigkills");
        assert_eq!(soak(Some("qa")).filter(), "crash_matrix::random_sigkills");
        assert_eq!(soak(Some("irc")).filter(), "irc::random_sigkills");
        assert_eq!(soak(Some("shared-postgres")).filter(), "shared_postgres::");
        assert!(soak(None).runs_shared_postgres());
        assert!(soak(Some("shared-postgres")).runs_shared_postgres());
        assert!(!soak(Some("qa")).runs_shared_postgres());
        assert!(soak(None).runs_fuzz());
        assert!(soak(Some("fuzz")).runs_fuzz());
        assert!(!soak(Some("qa")).runs_fuzz());
        assert!(!soak(Some("fuzz")).runs_shared_postgres());
        assert!(soak(None).runs_model());
        assert!(soak(Some("model")).runs_model());
        assert!(!soak(Some("qa")).runs_model());
        assert!(!soak(Some("model")).runs_shared_postgres());
        assert!(soak(None).runs_sim());
        assert!(soak(Some("sim")).runs_sim());
        assert!(!soak(Some("model")).runs_sim());
        assert!(!soak(Some("sim")).runs_model());
    }
}
