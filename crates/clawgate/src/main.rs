//! The `clawgate` binary. Multi-call: `clawgate acpx-wrapper …` is the ACPX wrapper and
//! `clawgate demo-agent …` the bundled ACP agent, so one installed program is the whole
//! system (the wrapper's executable path is part of the evidence that a process is ours).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use clawgate::config::Config;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "clawgate",
    version,
    about = "A durable chat gateway for AI agents",
    long_about = "A durable chat gateway for AI agents.\n\nOperator commands work against a \
                  running gateway (through its control API) and against a stopped one (on its \
                  state directory), and say which on stderr."
)]
struct Cli {
    /// Configuration file (TOML). Without one, the embedded defaults run.
    #[arg(long, global = true, env = "CLAWGATE_CONFIG")]
    config: Option<PathBuf>,
    /// State directory (overrides `state_dir` of the configuration).
    #[arg(long, global = true, env = "CLAWGATE_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Print the wire JSON (the control API's shapes, `docs/schema/`) instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway until Ctrl-C.
    Up {
        /// Listen address of the chat page and control API (loopback; port 0 = any free port).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
    },
    #[command(flatten)]
    Operator(clawgate::cli::Command),
    /// Talk to the QA channel from a terminal (needs a running gateway).
    #[cfg(feature = "channel-qa")]
    Qa {
        #[command(subcommand)]
        command: clawgate::qa::cli::QaCommand,
    },
}

fn main() -> ExitCode {
    // Multi-call dispatch before anything else: the wrapper must block signals while it is the
    // only thread.
    let mut args = std::env::args_os();
    let _program = args.next();
    match args.next().as_deref().and_then(|a| a.to_str()) {
        Some(clawgate::gateway::WRAPPER_SUBCOMMAND) => return clawgate_acpx_wrapper::run(args),
        Some(clawgate::gateway::DEMO_AGENT_SUBCOMMAND) => {
            clawgate_acpx::demo_agent::run(args.filter_map(|a| a.into_string().ok()));
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    let cli = Cli::parse();
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(clawgate::memory::on_worker_park)
        .thread_keep_alive(clawgate::memory::BLOCKING_THREAD_KEEP_ALIVE)
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", causes_once(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its chain of causes, each said once: most errors here name their cause in
/// their own text already (so that a log line holding only the outer error still says why), and
/// a cause already said is not repeated (`Permission denied (os error 13)` once, not three
/// times).
fn causes_once(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut config = Config::load(cli.config.as_deref())?;
    if let Some(dir) = cli.state_dir {
        config.state_dir = dir;
    }
    match cli.command {
        Command::Up { listen } => {
            if let Some(listen) = listen {
                config.gateway.listen = listen;
            }
            clawgate::serve::up(config).await?;
        }
        Command::Operator(command) => clawgate::cli::run(&config, command, cli.json).await?,
        #[cfg(feature = "channel-qa")]
        Command::Qa { command } => clawgate::qa::cli::run(&config, command, cli.json).await?,
    }
    Ok(())
}

/// Logs to stderr; `CLAWGATE_LOG` takes `tracing` targets (`info`, `clawgate=debug,warn`, …).
fn init_logging() {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::prelude::*;
    let filter: Targets = std::env::var("CLAWGATE_LOG")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::WARN));
    tracing_subscriber::registry()
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .with(filter)
        .init();
}
