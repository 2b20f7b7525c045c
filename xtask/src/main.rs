//! `cargo xtask <command>`: the project's automation, written in Rust so it runs wherever cargo
//! does (the alias lives in `.cargo/config.toml`).
//!
//! Each command lives in its own module; this file only parses arguments and dispatches. Adding a
//! command means one module, one [`Command`] variant, one arm in [`parse`], one arm in [`run`]
//! and one line of [`USAGE`].

mod bench;
mod ci;
mod cmd;
mod codegen;
mod conformance;
mod doc_pages;
mod migrate;
mod packaged;
mod postgres;
mod setup;
mod soak;
mod tidy;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  codegen [--check]   write docs/schema/ (JSON Schemas of the wire types + README.md);
                      --check only compares and fails when docs/schema/ is stale
  migrate --state-dir DIR [--status]
                      apply the state database migrations in DIR (created if empty);
                      --status only shows each migration's state
  bench store [--backend sqlite|postgres|both]
                      store throughput beside a raw SQLite baseline from the same run
  bench send [--backend sqlite|postgres|both]
                      durable sends/s and recovery of 100,000 intents beside raw SQLite; on
                      PostgreSQL at concurrency 64 and 512, one and two gateways, beside pgbench
                      (PostgreSQL: CLAWGATE_BENCH_PG_URL, else a throwaway cluster, fsync on)
  bench receive       inbound events/s (normalize, dedupe, record, ack) beside raw SQLite
  bench awareness     signal log, changesSince, notice fan-out, pruning beside raw SQLite
  bench acpx          lease verifications/s on live processes, time to reap 100 orphan trees
  bench gateway       the clawgate binary: idle RSS, inbound → committed final p50/p99 vs the agent alone
  bench telegram      a Telegram bot on the Bot API simulator: inbound → final p50/p99, messages/s over 100 chats
  bench matrix        a Matrix account on a real Synapse: inbound → final p50/p99, messages/s over 10 rooms
                      (each suite is `clawgate-bench <suite>` of clawgate-benchmarks, run from a
                      release build; `bench <suite> --help` prints its usage)
  tidy                check the crate layering and the publish metadata of every crate, and
                      that no crate's modules import each other in a circle
  soak [--kills N] [--seeds A,B,…] [--matrix NAME] [--fuzz-cases N]
                      the gateway's crash matrices (every channel's and shared-postgres, or
                      NAME: qa, telegram, matrix, irc, shared-postgres, …) run long on a release
                      build: N SIGKILLs (default 100) per matrix and seed (default five fixed
                      seeds), figures added up; shared-postgres on a throwaway cluster;
                      first the protocol model checks one step deeper than CI (NAME model:
                      those alone) and 10,000 seeds of the deterministic simulation (NAME
                      sim: those alone), then every fuzz target with N cases (CLAWGATE_FUZZ_CASES,
                      default 20000; `--matrix fuzz`: only those)
  conformance         run every conformance suite (store backends, adapters)
  setup               install the test tools `ci` needs (cargo-deny, chromium + chromedriver,
                      the aiogram and Synapse venvs under the target directory); `ci` runs it first
  pg start            start a throwaway PostgreSQL cluster (installing Debian's postgresql if
                      needed) and print `export CLAWGATE_TEST_PG_URL=…` and its stop command
  ci [--step NAME]    run what CI runs: fmt, clippy, docs, tests, codegen --check, tidy,
                      cargo-deny, conformance, the packaged crates' own tests;
                      --step runs that one step alone (e.g. --step docs, --step packaged-crates)
  help                print this text
";

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Command {
    Codegen(codegen::Mode),
    Migrate(migrate::Migrate),
    Bench(bench::Bench),
    Tidy,
    Soak(soak::Soak),
    Conformance,
    Setup,
    Ci(Option<String>),
    PgStart,
    Help,
}

/// A command line that does not name a command we know, or passes options it does not take.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ArgError {
    MissingCommand,
    UnknownCommand(String),
    UnexpectedArgument {
        command: String,
        argument: String,
    },
    MissingValue {
        command: String,
        option: String,
    },
    MissingOption {
        command: String,
        option: String,
    },
    UnknownSuite(String),
    InvalidValue {
        command: String,
        option: String,
        value: String,
    },
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgError::MissingCommand => write!(f, "no command given"),
            ArgError::UnknownCommand(name) => write!(f, "unknown command `{name}`"),
            ArgError::UnexpectedArgument { command, argument } => {
                write!(f, "`{command}` does not take the argument `{argument}`")
            }
            ArgError::MissingValue { command, option } => {
                write!(f, "`{command} {option}` needs a value")
            }
            ArgError::MissingOption { command, option } => {
                write!(f, "`{command}` needs `{option}`")
            }
            ArgError::InvalidValue {
                command,
                option,
                value,
            } => write!(
                f,
                "`{command} {option}`: {value:?} is not a number (or list of numbers)"
            ),
            ArgError::UnknownSuite(name) => {
                write!(
                    f,
                    "unknown benchmark suite `{name}` (known: {})",
                    bench::SUITES.join(", ")
                )
            }
        }
    }
}

impl std::error::Error for ArgError {}

/// Parses the arguments after `cargo xtask`.
fn parse(args: &[String]) -> Result<Command, ArgError> {
    let (name, rest) = args.split_first().ok_or(ArgError::MissingCommand)?;
    let mut rest = Options {
        command: name,
        rest: rest.to_vec(),
    };
    let command = match name.as_str() {
        "codegen" => Command::Codegen(if rest.flag("--check") {
            codegen::Mode::Check
        } else {
            codegen::Mode::Write
        }),
        "migrate" => {
            let state_dir = rest
                .value("--state-dir")?
                .ok_or_else(|| ArgError::MissingOption {
                    command: name.clone(),
                    option: "--state-dir".into(),
                })?;
            Command::Migrate(migrate::Migrate {
                state_dir: state_dir.into(),
                status_only: rest.flag("--status"),
            })
        }
        "bench" => {
            let suite = rest
                .positional()
                .ok_or_else(|| ArgError::UnknownSuite(String::new()))?;
            if !bench::SUITES.contains(&suite.as_str()) {
                return Err(ArgError::UnknownSuite(suite));
            }
            // The rest is the suite's own (`--help` included): clawgate-bench checks it.
            Command::Bench(bench::Bench {
                suite,
                args: std::mem::take(&mut rest.rest),
            })
        }
        "tidy" => Command::Tidy,
        "soak" => {
            let invalid = |option: &str, value: &str| ArgError::InvalidValue {
                command: name.clone(),
                option: option.to_owned(),
                value: value.to_owned(),
            };
            let kills = match rest.value("--kills")? {
                Some(v) => v.parse().map_err(|_| invalid("--kills", &v))?,
                None => 100,
            };
            let seeds = match rest.value("--seeds")? {
                Some(v) => v
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<Vec<u64>, _>>()
                    .map_err(|_| invalid("--seeds", &v))?,
                None => soak::Soak::default_seeds(),
            };
            let matrix = rest.value("--matrix")?;
            let fuzz_cases = match rest.value("--fuzz-cases")? {
                Some(v) => v.parse().map_err(|_| invalid("--fuzz-cases", &v))?,
                None => soak::DEFAULT_FUZZ_CASES,
            };
            Command::Soak(soak::Soak {
                seeds,
                kills,
                matrix,
                fuzz_cases,
            })
        }
        "conformance" => Command::Conformance,
        "setup" => Command::Setup,
        "ci" => Command::Ci(rest.value("--step")?),
        "pg" => match rest.positional().as_deref() {
            Some("start") => Command::PgStart,
            Some(other) => {
                return Err(ArgError::UnexpectedArgument {
                    command: "pg".into(),
                    argument: other.to_owned(),
                });
            }
            None => {
                return Err(ArgError::MissingOption {
                    command: "pg".into(),
                    option: "start".into(),
                });
            }
        },
        "help" | "-h" | "--help" => Command::Help,
        other => return Err(ArgError::UnknownCommand(other.to_owned())),
    };
    rest.finish()?;
    Ok(command)
}

/// The options after a command name; each is taken once, and whatever is left is an error.
struct Options<'a> {
    command: &'a str,
    rest: Vec<String>,
}

impl Options<'_> {
    fn flag(&mut self, name: &str) -> bool {
        let before = self.rest.len();
        self.rest.retain(|arg| arg != name);
        self.rest.len() != before
    }

    /// `--name VALUE` or `--name=VALUE`.
    fn value(&mut self, name: &str) -> Result<Option<String>, ArgError> {
        let prefix = format!("{name}=");
        if let Some(at) = self.rest.iter().position(|arg| arg.starts_with(&prefix)) {
            let arg = self.rest.remove(at);
            return Ok(Some(arg[prefix.len()..].to_owned()));
        }
        let Some(at) = self.rest.iter().position(|arg| arg == name) else {
            return Ok(None);
        };
        if at + 1 >= self.rest.len() || self.rest[at + 1].starts_with("--") {
            return Err(ArgError::MissingValue {
                command: self.command.to_owned(),
                option: name.to_owned(),
            });
        }
        let value = self.rest.remove(at + 1);
        self.rest.remove(at);
        Ok(Some(value))
    }

    /// The first argument that is not an option.
    fn positional(&mut self) -> Option<String> {
        let at = self.rest.iter().position(|arg| !arg.starts_with("--"))?;
        Some(self.rest.remove(at))
    }

    fn finish(self) -> Result<(), ArgError> {
        match self.rest.into_iter().next() {
            None => Ok(()),
            Some(argument) => Err(ArgError::UnexpectedArgument {
                command: self.command.to_owned(),
                argument,
            }),
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Codegen(mode) => codegen::run(mode),
        Command::Migrate(args) => migrate::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Tidy => tidy::run(),
        Command::Soak(soak) => soak::run(&soak),
        Command::Conformance => conformance::run(),
        Command::Setup => setup::ensure_test_tools(),
        Command::Ci(step) => ci::run(step.as_deref()),
        Command::PgStart => postgres::start_for_developer(),
        Command::Help => {
            print!("{USAGE}");
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse(&args) {
        Ok(command) => command,
        Err(error) => {
            eprintln!("error: {error}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(suite: &str, args: &[&str]) -> Command {
        Command::Bench(bench::Bench {
            suite: suite.into(),
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
        })
    }

    fn parse_str(line: &str) -> Result<Command, ArgError> {
        let args: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        parse(&args)
    }

    #[test]
    fn command_lines() {
        let cases: &[(&str, Result<Command, ArgError>)] = &[
            ("codegen", Ok(Command::Codegen(codegen::Mode::Write))),
            (
                "codegen --check",
                Ok(Command::Codegen(codegen::Mode::Check)),
            ),
            ("tidy", Ok(Command::Tidy)),
            (
                "migrate --state-dir /tmp/x --status",
                Ok(Command::Migrate(migrate::Migrate {
                    state_dir: "/tmp/x".into(),
                    status_only: true,
                })),
            ),
            (
                "migrate --state-dir=.clawgate",
                Ok(Command::Migrate(migrate::Migrate {
                    state_dir: ".clawgate".into(),
                    status_only: false,
                })),
            ),
            (
                "migrate",
                Err(ArgError::MissingOption {
                    command: "migrate".into(),
                    option: "--state-dir".into(),
                }),
            ),
            (
                "migrate --state-dir",
                Err(ArgError::MissingValue {
                    command: "migrate".into(),
                    option: "--state-dir".into(),
                }),
            ),
            ("bench store", Ok(bench("store", &[]))),
            ("bench awareness", Ok(bench("awareness", &[]))),
            ("bench acpx", Ok(bench("acpx", &[]))),
            ("bench gateway", Ok(bench("gateway", &[]))),
            ("bench send --help", Ok(bench("send", &["--help"]))),
            ("bench warp", Err(ArgError::UnknownSuite("warp".into()))),
            ("conformance", Ok(Command::Conformance)),
            ("setup", Ok(Command::Setup)),
            (
                "soak --kills 40 --seeds 1,2",
                Ok(Command::Soak(soak::Soak {
                    seeds: vec![1, 2],
                    kills: 40,
                    matrix: None,
                    fuzz_cases: soak::DEFAULT_FUZZ_CASES,
                })),
            ),
            (
                "soak --matrix irc",
                Ok(Command::Soak(soak::Soak {
                    seeds: soak::Soak::default_seeds(),
                    kills: 100,
                    matrix: Some("irc".into()),
                    fuzz_cases: soak::DEFAULT_FUZZ_CASES,
                })),
            ),
            (
                "soak --matrix fuzz --fuzz-cases 500",
                Ok(Command::Soak(soak::Soak {
                    seeds: soak::Soak::default_seeds(),
                    kills: 100,
                    matrix: Some("fuzz".into()),
                    fuzz_cases: 500,
                })),
            ),
            (
                "soak --kills many",
                Err(ArgError::InvalidValue {
                    command: "soak".into(),
                    option: "--kills".into(),
                    value: "many".into(),
                }),
            ),
            ("setup", Ok(Command::Setup)),
            ("ci", Ok(Command::Ci(None))),
            (
                "ci --step packaged-crates",
                Ok(Command::Ci(Some("packaged-crates".into()))),
            ),
            ("help", Ok(Command::Help)),
            ("--help", Ok(Command::Help)),
            ("", Err(ArgError::MissingCommand)),
            (
                "frobnicate",
                Err(ArgError::UnknownCommand("frobnicate".into())),
            ),
            (
                "codegen --chek",
                Err(ArgError::UnexpectedArgument {
                    command: "codegen".into(),
                    argument: "--chek".into(),
                }),
            ),
            (
                "tidy --check",
                Err(ArgError::UnexpectedArgument {
                    command: "tidy".into(),
                    argument: "--check".into(),
                }),
            ),
        ];
        for (line, expected) in cases {
            assert_eq!(&parse_str(line), expected, "command line {line:?}");
        }
    }

    #[test]
    fn usage_names_every_command() {
        for name in [
            "codegen",
            "migrate",
            "bench",
            "tidy",
            "soak",
            "conformance",
            "setup",
            "ci",
            "help",
        ] {
            assert!(USAGE.contains(&format!("\n  {name}")), "usage lists {name}");
        }
    }
}
