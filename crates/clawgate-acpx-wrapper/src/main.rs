//! The `clawgate-acpx-wrapper` binary; the contract is in the library documentation.

fn main() -> std::process::ExitCode {
    clawgate_acpx_wrapper::run(std::env::args_os().skip(1))
}
