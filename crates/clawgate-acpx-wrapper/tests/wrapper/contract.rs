use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// The adapter: a shell that ignores TERM (so only KILL ends it) with a grandchild that does
/// too, or a plain one.
const STUBBORN: &str = "trap '' TERM; sleep 600 & exec sleep 601";
const PLAIN: &str = "sleep 600 & exec sleep 601";

#[test]
fn reports_root_and_group_and_marks_the_adapter_environment() {
    let mut wrapper = spawn_wrapper(200, &["sh", "-c", PLAIN]);
    let (root, group) = read_report(wrapper.stderr.take().unwrap());
    assert_eq!(root, wrapper.id());
    assert_eq!(pgid_of(group), group, "the adapter leads its own group");
    assert_ne!(
        pgid_of(root),
        group,
        "the wrapper is not in the adapter's group"
    );
    let environ = std::fs::read(format!("/proc/{group}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains("CLAWGATE_ACPX_LEASE_ID=lease-w"));
    assert!(environ.contains("CLAWGATE_GATEWAY_INSTANCE_ID=gw-w"));
    term(root);
    wrapper.wait().unwrap();
}

#[test]
fn forwards_term_to_the_group_and_exits_after_it_is_empty() {
    let mut wrapper = spawn_wrapper(5_000, &["sh", "-c", PLAIN]);
    let (root, adapter) = read_report(wrapper.stderr.take().unwrap());
    eventually(Duration::from_secs(5), "grandchild started", || {
        !children_of(adapter).is_empty()
    });
    let grandchild = children_of(adapter)[0];
    term(root);
    let status = wrapper.wait().unwrap();
    // The adapter died of TERM: the signal mask the wrapper uses was not inherited.
    assert_eq!(status.code(), Some(128 + 15));
    eventually(Duration::from_secs(5), "group gone", || {
        !alive(adapter) && !alive(grandchild)
    });
}

#[test]
fn parent_death_terms_the_group_then_kills_it_after_the_grace() {
    // A stand-in gateway: it starts the wrapper and is then killed with SIGKILL.
    let args = wrapper_args(300, &["sh", "-c", STUBBORN]);
    let mut gateway = Command::new("sh")
        .arg("-c")
        .arg("\"$0\" \"$@\" & wait")
        .arg(WRAPPER)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (root, adapter) = read_report(gateway.stderr.take().unwrap());
    eventually(Duration::from_secs(5), "grandchild started", || {
        !children_of(adapter).is_empty()
    });
    let grandchild = children_of(adapter)[0];
    gateway.kill().unwrap();
    gateway.wait().unwrap();
    // TERM is ignored by the whole group: only the KILL fallback can end it, and the wrapper
    // stays alive until it ran.
    eventually(Duration::from_secs(10), "group killed", || {
        !alive(adapter) && !alive(grandchild)
    });
    eventually(Duration::from_secs(5), "wrapper exited", || !alive(root));
}

#[test]
fn refuses_to_start_when_the_parent_is_already_gone() {
    let output = Command::new(WRAPPER)
        .args(wrapper_args(100, &["sh", "-c", "echo started; sleep 600"]))
        // Not our parent: as if the real one died before the wrapper could check.
        .env("CLAWGATE_ACPX_PARENT_PID", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    assert!(
        output.stdout.is_empty(),
        "the adapter must not have started"
    );
}

#[test]
fn usage_errors_and_adapter_exit_status() {
    let usage = Command::new(WRAPPER).args(["--", "true"]).output().unwrap();
    assert_eq!(usage.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&usage.stderr).contains("--clawgate-acpx-lease-id is required")
    );
    let mut wrapper = spawn_wrapper(100, &["sh", "-c", "exit 7"]);
    let _ = read_report(wrapper.stderr.take().unwrap());
    assert_eq!(wrapper.wait().unwrap().code(), Some(7));
}

#[test]
fn a_sigkilled_wrapper_takes_its_adapter_with_it() {
    // A plain adapter that would otherwise run for ten minutes, reparented to init.
    let mut wrapper = spawn_wrapper(5_000, &["sleep", "600"]);
    let (_, adapter) = read_report(wrapper.stderr.take().unwrap());
    let survivor = Survivor::of(adapter);
    // SIGKILL: the wrapper gets no chance to drain its group; only the kernel can act.
    wrapper.kill().unwrap();
    wrapper.wait().unwrap();
    eventually(
        Duration::from_secs(5),
        "adapter gone with its wrapper",
        || !alive(adapter),
    );
    drop(survivor);
}
