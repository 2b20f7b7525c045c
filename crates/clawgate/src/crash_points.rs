//! Crash points: a test hook that makes the gateway die at one chosen durable write or platform
//! call, so a test can enumerate every such point of a turn instead of sampling instants.
//!
//! Read once, from the environment of `clawgate up` (see docs/operations.md):
//!
//! * `CLAWGATE_CRASH_AT=write:N:before|after` — the Nth transaction the store's writer commits
//!   (1-based, counted from the start of this process): `before` aborts right before its
//!   `COMMIT` (nothing of it stored), `after` right after `COMMIT` returned (stored, no caller
//!   told yet);
//! * `CLAWGATE_CRASH_AT=platform:N:before|after` — the Nth call the send side makes to a
//!   platform (send, edit, delete, reconcile, live begin/update/finalize/cancel, every channel
//!   counted together): `before` aborts before the request goes out, `after` once the platform
//!   answered (it acted, the answer is lost);
//! * `CLAWGATE_CRASH_AT=write:N:full` — not a crash: the Nth commit fails as on a full disk
//!   (nothing of it stored, its writers told `DiskFull`) and the process goes on, so a test can
//!   fail every durable write of a turn in turn and see the reply land once the fault is gone;
//! * `CLAWGATE_CRASH_COUNT=FILE` — appends `write N` for each commit and `platform N OP` for each
//!   call to FILE, so a test learns how many points a clean turn passes.
//!
//! The crash is `std::process::abort()`: no destructor, no flush, like SIGKILL. Unset, nothing
//! is wrapped and the store gets no hook.

use std::future::Future;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use clawgate_channel_sdk::{
    ChannelMessageAdapter, MessageLiveAdapter, MessageOriginAdapter, MessageRenderAdapter,
    Reconciliation, SendContext, SendError,
};
use clawgate_store_sqlite::{CommitHook, CommitStage, CommitVerdict};
use clawgate_types::{
    LiveCancelReason, MessageCapabilities, MessageReceipt, MessageReceiptPart, RenderedMessageUnit,
};

pub const CRASH_AT_ENV: &str = "CLAWGATE_CRASH_AT";
pub const CRASH_COUNT_ENV: &str = "CLAWGATE_CRASH_COUNT";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write,
    Platform,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Point {
    kind: Kind,
    n: u64,
    /// Before the commit / the request, else after it.
    before: bool,
}

#[derive(Debug)]
struct Plan {
    at: Option<Point>,
    /// `write:N:full`: the Nth commit fails as on a full disk; the process goes on.
    full_at: Option<u64>,
    count: Option<Mutex<std::fs::File>>,
    platform_calls: AtomicU64,
}

/// `write:N:full`, the one fault that is not a crash.
fn parse_disk_full(value: &str) -> Option<u64> {
    let n = value.trim().strip_prefix("write:")?.strip_suffix(":full")?;
    n.parse().ok().filter(|n| *n > 0)
}

fn parse(value: &str) -> Option<Point> {
    let mut parts = value.trim().split(':');
    let kind = match parts.next()? {
        "write" => Kind::Write,
        "platform" => Kind::Platform,
        _ => return None,
    };
    let n = parts.next()?.parse().ok().filter(|n| *n > 0)?;
    let before = match parts.next()? {
        "before" => true,
        "after" => false,
        _ => return None,
    };
    parts.next().is_none().then_some(Point { kind, n, before })
}

/// The plan of this process, `None` when neither variable is set. A value that cannot be used
/// stops the process with a message: a test that asked for a crash must not run without one.
fn plan() -> Option<&'static Plan> {
    static PLAN: OnceLock<Option<Plan>> = OnceLock::new();
    PLAN.get_or_init(|| {
        let value = std::env::var(CRASH_AT_ENV).ok();
        let full_at = value.as_deref().and_then(parse_disk_full);
        let at = value.filter(|_| full_at.is_none()).map(|value| {
            parse(&value).unwrap_or_else(|| {
                eprintln!(
                    "error: {CRASH_AT_ENV}={value:?}: expected write:N:before|after, \
                     write:N:full or platform:N:before|after (N from 1)"
                );
                std::process::exit(2)
            })
        });
        let count = std::env::var_os(CRASH_COUNT_ENV).map(|path| {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|e| {
                    eprintln!("error: {CRASH_COUNT_ENV}={}: {e}", path.to_string_lossy());
                    std::process::exit(2)
                });
            Mutex::new(file)
        });
        (at.is_some() || full_at.is_some() || count.is_some()).then(|| Plan {
            at,
            full_at,
            count,
            platform_calls: AtomicU64::new(0),
        })
    })
    .as_ref()
}

impl Plan {
    fn note(&self, line: std::fmt::Arguments<'_>) {
        if let Some(file) = &self.count {
            let mut file = file
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let _ = writeln!(file, "{line}");
        }
    }

    fn reached(&self, kind: Kind, n: u64, before: bool, what: &str) {
        if self.at == Some(Point { kind, n, before }) {
            let when = if before { "before" } else { "after" };
            eprintln!("crash point reached: {what} {n} ({when}); aborting");
            std::process::abort();
        }
    }

    async fn call<T>(&self, op: &str, call: impl Future<Output = T>) -> T {
        let n = self.platform_calls.fetch_add(1, Ordering::SeqCst) + 1;
        self.reached(Kind::Platform, n, true, op);
        let answer = call.await;
        self.note(format_args!("platform {n} {op}"));
        self.reached(Kind::Platform, n, false, op);
        answer
    }
}

/// The store's commit hook, when a plan is set.
pub fn commit_hook() -> Option<CommitHook> {
    let plan = plan()?;
    Some(CommitHook(Arc::new(move |stage, n| {
        match stage {
            CommitStage::Before if plan.full_at == Some(n) => {
                eprintln!("fault point reached: write {n} refused as on a full disk");
                return CommitVerdict::RefuseAsDiskFull;
            }
            CommitStage::Before => plan.reached(Kind::Write, n, true, "write"),
            CommitStage::Committed => {
                plan.note(format_args!("write {n}"));
                plan.reached(Kind::Write, n, false, "write");
            }
        }
        CommitVerdict::Proceed
    })))
}

/// The adapters the messenger sends through, each wrapped when a plan is set.
pub fn wrap(adapters: Vec<Arc<dyn ChannelMessageAdapter>>) -> Vec<Arc<dyn ChannelMessageAdapter>> {
    let Some(plan) = plan() else {
        return adapters;
    };
    adapters
        .into_iter()
        .map(|inner| Arc::new(Crashing { inner, plan }) as Arc<dyn ChannelMessageAdapter>)
        .collect()
}

/// An adapter that counts its platform calls and dies at the planned one.
struct Crashing {
    inner: Arc<dyn ChannelMessageAdapter>,
    plan: &'static Plan,
}

impl Crashing {
    fn live_inner(&self) -> Result<&dyn MessageLiveAdapter, SendError> {
        self.inner
            .live()
            .ok_or_else(|| SendError::unsupported(self.inner.channel(), "live"))
    }
}

#[async_trait]
impl ChannelMessageAdapter for Crashing {
    fn channel(&self) -> &str {
        self.inner.channel()
    }

    fn capabilities(&self) -> &MessageCapabilities {
        self.inner.capabilities()
    }

    async fn send_unit(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.plan
            .call("send", self.inner.send_unit(ctx, unit))
            .await
    }

    async fn edit(
        &self,
        ctx: &SendContext,
        part: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        self.plan
            .call("edit", self.inner.edit(ctx, part, unit))
            .await
    }

    async fn delete(&self, ctx: &SendContext, part: &MessageReceiptPart) -> Result<(), SendError> {
        self.plan.call("delete", self.inner.delete(ctx, part)).await
    }

    async fn reconcile_unknown_send(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<Reconciliation, SendError> {
        self.plan
            .call("reconcile", self.inner.reconcile_unknown_send(ctx, unit))
            .await
    }

    async fn after_commit(&self, ctx: &SendContext, receipt: &MessageReceipt) {
        self.inner.after_commit(ctx, receipt).await;
    }

    fn render(&self) -> Option<&dyn MessageRenderAdapter> {
        self.inner.render()
    }

    fn live(&self) -> Option<&dyn MessageLiveAdapter> {
        self.inner.live().map(|_| self as &dyn MessageLiveAdapter)
    }

    fn origin(&self) -> Option<&dyn MessageOriginAdapter> {
        self.inner.origin()
    }
}

#[async_trait]
impl MessageLiveAdapter for Crashing {
    async fn show(
        &self,
        ctx: &SendContext,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let live = self.live_inner()?;
        self.plan.call("live-show", live.show(ctx, unit)).await
    }

    async fn replace(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let live = self.live_inner()?;
        self.plan
            .call("live-replace", live.replace(ctx, preview, unit))
            .await
    }

    async fn finalize(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        final_unit: &RenderedMessageUnit,
    ) -> Result<MessageReceiptPart, SendError> {
        let live = self.live_inner()?;
        self.plan
            .call("live-finalize", live.finalize(ctx, preview, final_unit))
            .await
    }

    async fn remove(
        &self,
        ctx: &SendContext,
        preview: &MessageReceiptPart,
        reason: LiveCancelReason,
    ) -> Result<(), SendError> {
        let live = self.live_inner()?;
        self.plan
            .call("live-remove", live.remove(ctx, preview, reason))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_points_parse_strictly() {
        assert_eq!(
            parse("write:3:before"),
            Some(Point {
                kind: Kind::Write,
                n: 3,
                before: true
            })
        );
        assert_eq!(
            parse("platform:12:after"),
            Some(Point {
                kind: Kind::Platform,
                n: 12,
                before: false
            })
        );
        for bad in [
            "",
            "write",
            "write:0:before",
            "write:3",
            "write:3:during",
            "disk:1:before",
            "write:3:before:x",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse_disk_full("write:7:full"), Some(7));
        for bad in [
            "write:0:full",
            "platform:2:full",
            "write:full",
            "write:7:before",
        ] {
            assert_eq!(parse_disk_full(bad), None, "{bad:?}");
        }
    }
}
