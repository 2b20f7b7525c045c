//! The database in the way mid-reply or before a message arrives, without any crash: the reply
//! lands once when the fault clears, and nothing extra is left visible. In the way of a start,
//! a Ctrl-C still ends the gateway by its own hand.

use std::time::Duration;

use crate::support::{
    GatewayProcess, MidReply, bot_texts, config_file, demo_reply, eventually, external_platform,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_by_another_process_mid_reply_delays_the_final_but_never_loses_it() {
    let MidReply {
        platform,
        state,
        gateway,
        _dir,
        ..
    } = MidReply::start(
        "dm-locked",
        "are you stuck",
        &["--chunk-ms", "150", "--words", "20"],
    )
    .await;
    // Another process takes SQLite's write lock for longer than the gateway's busy timeout
    // (5 s) while the reply streams and its final is due: the gateway's writes fail closed.
    let db = rusqlite::Connection::open(state.join("state.db")).expect("state.db");
    db.execute_batch("BEGIN IMMEDIATE")
        .expect("write lock taken");
    tokio::time::sleep(Duration::from_secs(9)).await;
    db.execute_batch("ROLLBACK").expect("write lock released");
    drop(db);

    let expected = demo_reply("are you stuck", 20);
    eventually(
        Duration::from_secs(60),
        "the final once the lock is gone",
        || async {
            bot_texts(&platform, "dm-locked")
                .contains(&expected)
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        bot_texts(&platform, "dm-locked"),
        vec![expected.clone()],
        "one final, no preview or partial reply left beside it"
    );
    // The lock taken before the next message arrives: its record, its reply intent and the
    // final all wait for the lock; the reply lands once when it is gone.
    let db = rusqlite::Connection::open(state.join("state.db")).expect("state.db");
    db.execute_batch("BEGIN IMMEDIATE")
        .expect("write lock taken");
    gateway.say("dm-locked", "and now").await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    db.execute_batch("ROLLBACK").expect("write lock released");
    drop(db);
    let second = demo_reply("and now", 20);
    eventually(
        Duration::from_secs(60),
        "the reply to the message sent while locked",
        || async {
            bot_texts(&platform, "dm-locked")
                .contains(&second)
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        bot_texts(&platform, "dm-locked"),
        vec![demo_reply("are you stuck", 20), second],
        "each message answered once"
    );
    assert!(gateway.interrupt().success());
}

/// A small tmpfs mounted at a path for the test's lifetime (a disk that really fills up).
struct SmallDisk {
    path: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(path: &std::path::Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(path).expect("mount point");
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("mount runs");
        assert!(
            status.success(),
            "mounting a {size} tmpfs at {} failed: this test needs root (CAP_SYS_ADMIN), as CI has",
            path.display()
        );
        SmallDisk {
            path: path.to_path_buf(),
        }
    }

    /// Writes a filler file until the disk refuses more; returns its path.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write as _;
        let filler = self.path.join("filler");
        let mut file = std::fs::File::create(&filler).expect("filler");
        let block = vec![0u8; 64 * 1024];
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling the disk: {e}"),
            }
        }
        // The last bytes: a write smaller than the block may still fit.
        let _ = file.write_all(&[0u8; 512]);
        let _ = file.sync_all();
        filler
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_that_fills_mid_reply_delays_the_final_until_space_is_freed() {
    let platform = external_platform().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let disk = SmallDisk::mount(&state, "4m");
    let config = config_file(
        dir.path(),
        Some(&platform),
        &["--chunk-ms", "150", "--words", "20"],
    );
    let gateway = GatewayProcess::start(&state, &config);
    gateway.say("dm-full", "is there room").await;
    eventually(Duration::from_secs(30), "the first preview", || async {
        (!bot_texts(&platform, "dm-full").is_empty()).then_some(())
    })
    .await;
    let filler = disk.fill();
    // The stream ends and its final is due while the disk is full.
    tokio::time::sleep(Duration::from_secs(6)).await;
    std::fs::remove_file(&filler).expect("space freed");

    let expected = demo_reply("is there room", 20);
    eventually(
        Duration::from_secs(60),
        "the final once there is room",
        || async {
            bot_texts(&platform, "dm-full")
                .contains(&expected)
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        bot_texts(&platform, "dm-full"),
        vec![expected],
        "one final, no preview or partial reply left beside it"
    );
    // A message written while the disk is full is answered once there is room again.
    let filler = disk.fill();
    gateway.say("dm-full", "still there").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    std::fs::remove_file(&filler).expect("space freed");
    let second = demo_reply("still there", 20);
    eventually(
        Duration::from_secs(60),
        "the reply to the message sent while full",
        || async {
            bot_texts(&platform, "dm-full")
                .contains(&second)
                .then_some(())
        },
    )
    .await;
    assert!(gateway.interrupt().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_on_a_full_disk_says_the_disk_is_full_and_where() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let disk = SmallDisk::mount(&state, "2m");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    assert!(gateway.interrupt().success());
    let _filler = disk.fill();
    let output = up_command(&state, &config).output().expect("clawgate runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "refused to start: {stderr}");
    assert!(
        stderr.contains("is full") && stderr.contains(&state.display().to_string()),
        "a typed disk-full error naming the state directory: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_while_the_start_waits_for_a_locked_database_ends_it_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let config = config_file(dir.path(), None, &[]);
    let gateway = GatewayProcess::start(&state, &config);
    assert!(gateway.interrupt().success());
    // Another process holds SQLite's write lock: the next start waits for it.
    let db = rusqlite::Connection::open(state.join("state.db")).expect("state.db");
    db.execute_batch("BEGIN IMMEDIATE")
        .expect("write lock taken");
    let mut starting = up_command(&state, &config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("clawgate runs");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        starting.try_wait().expect("try_wait").is_none(),
        "the start waits for the lock"
    );
    crate::support::signal(starting.id(), 2);
    // Ended by its own hand, while the lock is still held (once the database open under way
    // gives up after the busy timeout, never cut off mid-migration): not killed by the signal.
    let status = crate::support::wait_with_timeout(&mut starting, Duration::from_secs(20));
    let mut printed = String::new();
    std::io::Read::read_to_string(&mut starting.stdout.take().expect("stdout"), &mut printed)
        .expect("stdout read");
    assert!(status.success(), "{status}: {printed}");
    assert!(printed.contains("stopped while starting"), "{printed}");
    db.execute_batch("ROLLBACK").expect("write lock released");
    drop(db);
    // Nothing of the state was harmed: the next start comes up.
    let gateway = GatewayProcess::start(&state, &config);
    assert!(gateway.interrupt().success());
}

/// `clawgate up` on `state` with `config`, to run by hand (a start that is not expected to come
/// up, or is stopped before it does).
fn up_command(state: &std::path::Path, config: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(crate::support::BIN);
    command
        .arg("--state-dir")
        .arg(state)
        .arg("--config")
        .arg(config)
        .arg("up");
    command
}
