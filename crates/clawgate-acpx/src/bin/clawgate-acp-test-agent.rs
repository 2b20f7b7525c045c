//! The bundled deterministic ACP agent as its own binary (see `clawgate_acpx::demo_agent`).

fn main() {
    clawgate_acpx::demo_agent::run(std::env::args().skip(1));
}
