//! `cargo xtask <command>`: the project's automation, written in Rust so it runs wherever cargo
//! does (the alias lives in `.cargo/config.toml`).
//!
//! Each command lives in its own module; this file only parses arguments and dispatches. Adding a
//! command means one module, one [`Command`] variant, one arm in [`parse`], one arm in [`run`]
//! and one line of [`USAGE`]. (`migrate` and `bench` from docs/architecture.md are not written
//! yet; each arrives that way, as `migrate.rs` and `bench.rs`.)

mod ci;
mod cmd;
mod codegen;
mod conformance;
mod tidy;

use std::process::ExitCode;

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  codegen [--check]   write docs/schema/ (JSON Schemas of the wire types + README.md);
                      --check only compares and fails when docs/schema/ is stale
  tidy                check the crate layering and the publish metadata of every crate
  conformance         run every conformance suite (today: the store suite)
  ci                  run what CI runs: fmt, clippy, tests, codegen --check, tidy,
                      cargo-deny, conformance, cargo package
  help                print this text
";

/// A parsed command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Codegen(codegen::Mode),
    Tidy,
    Conformance,
    Ci,
    Help,
}

/// A command line that does not name a command we know, or passes options it does not take.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ArgError {
    MissingCommand,
    UnknownCommand(String),
    UnexpectedArgument { command: String, argument: String },
}

impl std::fmt::Display for ArgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ArgError::MissingCommand => write!(f, "no command given"),
            ArgError::UnknownCommand(name) => write!(f, "unknown command `{name}`"),
            ArgError::UnexpectedArgument { command, argument } => {
                write!(f, "`{command}` does not take the argument `{argument}`")
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
        "tidy" => Command::Tidy,
        "conformance" => Command::Conformance,
        "ci" => Command::Ci,
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
        Command::Tidy => tidy::run(),
        Command::Conformance => conformance::run(),
        Command::Ci => ci::run(),
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
            ("conformance", Ok(Command::Conformance)),
            ("ci", Ok(Command::Ci)),
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
        for name in ["codegen", "tidy", "conformance", "ci", "help"] {
            assert!(parse_str(name).is_ok(), "{name} parses");
            assert!(USAGE.contains(&format!("\n  {name}")), "usage lists {name}");
        }
    }
}
