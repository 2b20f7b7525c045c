//! `cargo xtask soak`: the gateway's random-time crash matrix run long, for releases — several
//! seeds, many SIGKILLs each, on a release build — with the figures added up at the end. It
//! runs the same test as CI (`crash_matrix` in `crates/clawgate/tests/gateway`), sized through
//! its environment variables; it is not part of `cargo xtask ci`.

use std::io::{BufRead as _, BufReader};
use std::process::Stdio;

use anyhow::{Context as _, bail};

use crate::cmd::{cargo, display};

/// What one soak runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Soak {
    pub(crate) seeds: Vec<u64>,
    pub(crate) kills: u64,
}

impl Soak {
    /// Five seeds of 100 kills: 500 SIGKILLs. The seeds are fixed so a release's soak can be
    /// replayed; `--seeds` picks others.
    pub(crate) fn default_seeds() -> Vec<u64> {
        vec![16, 1_600, 160_016, 16_000_016, 1_616_161_616]
    }
}

const TEST: &str = "crash_matrix::random_sigkills_leave_exactly_one_final_per_message";

/// The figures the test prints for one seed.
#[derive(Debug, Default)]
struct Figures {
    kills: u64,
    messages: u64,
    finals: u64,
    notices: u64,
    violations: u64,
    leftovers: u64,
}

fn parse_figures(line: &str) -> Option<Figures> {
    let rest = line.split("crash matrix figures:").nth(1)?;
    let mut figures = Figures::default();
    for pair in rest.split_whitespace() {
        let (name, value) = pair.split_once('=')?;
        let value: u64 = value.parse().ok()?;
        match name {
            "kills" => figures.kills = value,
            "messages" => figures.messages = value,
            "finals" => figures.finals = value,
            "notices" => figures.notices = value,
            "violations" => figures.violations = value,
            "leftovers" => figures.leftovers = value,
            _ => {}
        }
    }
    Some(figures)
}

pub(crate) fn run(soak: &Soak) -> anyhow::Result<()> {
    // At least three messages per kill, never fewer than the CI run's 120.
    let messages = (soak.kills * 3).max(120);
    let mut rows = Vec::new();
    for &seed in &soak.seeds {
        let mut command = cargo([
            "test",
            "--release",
            "-p",
            "clawgate",
            "--test",
            "gateway",
            "--",
            "--exact",
            TEST,
            "--nocapture",
        ]);
        command
            .env("CLAWGATE_CRASH_SEED", seed.to_string())
            .env("CLAWGATE_CRASH_KILLS", soak.kills.to_string())
            .env("CLAWGATE_CRASH_MESSAGES", messages.to_string())
            .stderr(Stdio::piped());
        let line = display(&command);
        eprintln!("soak: seed {seed}: {line}");
        let mut child = command
            .spawn()
            .with_context(|| format!("could not start `{line}`"))?;
        let stderr = child.stderr.take().context("stderr of the test")?;
        let mut figures = None;
        // Passed through as it comes, so a long run shows its progress and its failure table.
        for text in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{text}");
            if let Some(found) = parse_figures(&text) {
                figures = Some(found);
            }
        }
        let status = child
            .wait()
            .with_context(|| format!("waiting for `{line}`"))?;
        rows.push((seed, status.success(), figures));
    }
    println!(
        "soak: {} seed(s), {} kills each, {messages} messages each",
        soak.seeds.len(),
        soak.kills
    );
    println!(
        "{:>12} {:>6} {:>9} {:>7} {:>8} {:>11} {:>10}  result",
        "seed", "kills", "messages", "finals", "notices", "violations", "leftovers"
    );
    let mut total = Figures::default();
    let mut failed = 0;
    for (seed, ok, figures) in &rows {
        match figures {
            Some(f) => {
                println!(
                    "{seed:>12} {:>6} {:>9} {:>7} {:>8} {:>11} {:>10}  {}",
                    f.kills,
                    f.messages,
                    f.finals,
                    f.notices,
                    f.violations,
                    f.leftovers,
                    if *ok { "ok" } else { "FAILED" }
                );
                total.kills += f.kills;
                total.messages += f.messages;
                total.finals += f.finals;
                total.notices += f.notices;
                total.violations += f.violations;
                total.leftovers += f.leftovers;
            }
            None => println!(
                "{seed:>12}  (the test printed no figures: it failed before the judge)  FAILED"
            ),
        }
        if !ok {
            failed += 1;
        }
    }
    println!(
        "{:>12} {:>6} {:>9} {:>7} {:>8} {:>11} {:>10}",
        "total",
        total.kills,
        total.messages,
        total.finals,
        total.notices,
        total.violations,
        total.leftovers
    );
    if failed > 0 {
        bail!(
            "{failed} of {} soak run(s) failed; replay one with CLAWGATE_CRASH_SEED=<seed> \
             CLAWGATE_CRASH_KILLS={} cargo test --release -p clawgate --test gateway crash_matrix",
            rows.len(),
            soak.kills
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_line_is_read_back() {
        let f = parse_figures(
            "crash matrix figures: seed=7 kills=30 messages=120 finals=49 notices=0 \
             violations=71 leftovers=0",
        )
        .expect("figures");
        assert_eq!(
            (f.kills, f.messages, f.finals, f.violations),
            (30, 120, 49, 71)
        );
        assert!(parse_figures("crash matrix: seed 7").is_none());
    }
}
