//! What a channel keeps between runs, kept in the gateway's store.
//!
//! A channel that must remember something — the sends it attempted (to settle a lost answer),
//! the echoes it saw, a sync cursor, a rotating token, a conversation reference — writes it
//! through the [`ChannelState`] its [`ChannelSetup`](crate::ChannelSetup) carries. The handle is
//! scoped to the channel's kind and account, so two accounts of one kind never collide, and it
//! lives in the gateway's store, so every gateway sharing a PostgreSQL database sees the same
//! evidence when it takes the account over. A write that returns `Ok` is durable: evidence
//! written before a platform call is there after a crash at any later instant.
//!
//! Two shapes: a [`Book`] of keyed records (append once, find by key, read in order, prune) for
//! journals and echo books, and named values written with compare-and-set ([`ChannelState::swap`])
//! for cursors, tokens and references.
//!
//! [`LegacyFiles`] reads the files an earlier release kept in the state directory, so a channel
//! imports them once and sets them aside.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clawgate_store::{ChannelStateStore, StoreError};
use clawgate_types::UnixMillis;
use clawgate_types::clock::{Clock, SystemClock};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use clawgate_store::{ChannelRecord, ChannelScope, ValueExpectation};

/// A channel state read or write failed (what happened: [`StateError::kind`]).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StateError(Box<StateErrorKind>);

impl StateError {
    /// What failed.
    pub fn kind(&self) -> &StateErrorKind {
        &self.0
    }
}

impl From<StateErrorKind> for StateError {
    fn from(kind: StateErrorKind) -> Self {
        StateError(Box::new(kind))
    }
}

/// What failed in a [`StateError`].
#[derive(Debug, thiserror::Error)]
pub enum StateErrorKind {
    /// The store refused or failed the call (full, locked, unreachable…).
    #[error("the channel state of {scope} ({what}) could not be used: {source}")]
    Store {
        /// Whose state.
        scope: ChannelScope,
        /// The book or value.
        what: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A stored record or value does not have the shape this build reads.
    #[error(
        "the channel state of {scope} ({what}) holds a value this build cannot read: {reason}; \
         it was written by another version of the channel"
    )]
    Shape {
        /// Whose state.
        scope: ChannelScope,
        /// The book or value.
        what: String,
        /// What did not fit.
        reason: String,
    },
}

/// A value read with its version (pass the version to [`ChannelState::swap`] to write it only
/// if no one else did since).
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned<T> {
    /// The value.
    pub value: T,
    /// 1 when first written, one more with every write.
    pub version: i64,
}

/// What [`ChannelState::swap`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Swapped<T> {
    /// Written: the new version.
    Written(i64),
    /// The stored value did not meet the expectation; nothing was written. The stored value.
    Conflict(Option<Versioned<T>>),
}

/// One channel account's state in the gateway's store (cheap to clone).
#[derive(Clone)]
pub struct ChannelState {
    store: Arc<dyn ChannelStateStore>,
    scope: ChannelScope,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for ChannelState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelState")
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

impl ChannelState {
    /// The state of `scope` in `store`, stamped by `clock`.
    pub fn new(
        store: Arc<dyn ChannelStateStore>,
        scope: ChannelScope,
        clock: Arc<dyn Clock>,
    ) -> ChannelState {
        ChannelState {
            store,
            scope,
            clock,
        }
    }

    /// [`ChannelState::new`] with the system clock.
    pub fn with_system_clock(store: Arc<dyn ChannelStateStore>, scope: ChannelScope) -> Self {
        ChannelState::new(store, scope, Arc::new(SystemClock))
    }

    /// Whose state this is.
    pub fn scope(&self) -> &ChannelScope {
        &self.scope
    }

    /// The gateway's clock (the one every stored time is stamped with).
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The gateway clock's now, in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> UnixMillis {
        self.clock.now_ms()
    }

    /// The book named `name` (a journal, an echo book…).
    pub fn book(&self, name: &str) -> Book {
        Book {
            state: self.clone(),
            name: name.to_owned(),
        }
    }

    fn store_error(&self, what: &str, source: StoreError) -> StateError {
        StateErrorKind::Store {
            scope: self.scope.clone(),
            what: what.to_owned(),
            source,
        }
        .into()
    }

    fn shape_error(&self, what: &str, reason: impl ToString) -> StateError {
        StateErrorKind::Shape {
            scope: self.scope.clone(),
            what: what.to_owned(),
            reason: reason.to_string(),
        }
        .into()
    }

    fn decode<T: DeserializeOwned>(
        &self,
        what: &str,
        value: serde_json::Value,
    ) -> Result<T, StateError> {
        serde_json::from_value(value).map_err(|e| self.shape_error(what, e))
    }

    fn encode<T: Serialize>(&self, what: &str, value: &T) -> Result<serde_json::Value, StateError> {
        serde_json::to_value(value).map_err(|e| self.shape_error(what, e))
    }

    /// The value named `name`, with its version.
    pub async fn value<T: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<Option<Versioned<T>>, StateError> {
        let what = format!("value {name}");
        let stored = self
            .store
            .load_channel_value(&self.scope, name)
            .await
            .map_err(|e| self.store_error(&what, e))?;
        stored
            .map(|v| {
                Ok(Versioned {
                    value: self.decode(&what, v.value)?,
                    version: v.version,
                })
            })
            .transpose()
    }

    /// Writes `value` under `name` if the stored one meets `expected`, in one write: of two
    /// gateways expecting the same version, exactly one writes.
    pub async fn swap<T: Serialize + DeserializeOwned>(
        &self,
        name: &str,
        expected: ValueExpectation,
        value: &T,
    ) -> Result<Swapped<T>, StateError> {
        let what = format!("value {name}");
        let json = self.encode(&what, value)?;
        match self
            .store
            .swap_channel_value(&self.scope, name, expected, &json, self.now_ms())
            .await
            .map_err(|e| self.store_error(&what, e))?
        {
            clawgate_store::ValueSwap::Written(v) => Ok(Swapped::Written(v.version)),
            clawgate_store::ValueSwap::Conflict(stored) => Ok(Swapped::Conflict(
                stored
                    .map(|v| {
                        Ok::<_, StateError>(Versioned {
                            value: self.decode(&what, v.value)?,
                            version: v.version,
                        })
                    })
                    .transpose()?,
            )),
        }
    }

    /// Writes `value` under `name` whatever is stored (for a value one writer owns, like a
    /// cursor the account holder moves); returns its version.
    pub async fn put<T: Serialize + DeserializeOwned>(
        &self,
        name: &str,
        value: &T,
    ) -> Result<i64, StateError> {
        match self.swap(name, ValueExpectation::Any, value).await? {
            Swapped::Written(version) => Ok(version),
            Swapped::Conflict(_) => Err(self.shape_error(
                &format!("value {name}"),
                "an unconditional write was refused by the store",
            )),
        }
    }

    /// Removes the value named `name`; true when there was one.
    pub async fn delete(&self, name: &str) -> Result<bool, StateError> {
        self.store
            .delete_channel_value(&self.scope, name)
            .await
            .map_err(|e| self.store_error(&format!("value {name}"), e))
    }
}

/// A record read from a [`Book`].
#[derive(Debug, Clone, PartialEq)]
pub struct Record<T> {
    /// Its position in the book (appends are numbered in the order they commit).
    pub seq: i64,
    /// Its key (unique in the book).
    pub key: String,
    /// What was recorded.
    pub value: T,
    /// When it was appended, by the gateway's clock.
    pub recorded_at: UnixMillis,
}

/// One book of keyed records in a channel's state.
#[derive(Debug, Clone)]
pub struct Book {
    state: ChannelState,
    name: String,
}

/// How many records one read of a book returns at most.
const PAGE: u32 = 500;

impl Book {
    fn what(&self) -> String {
        format!("book {}", self.name)
    }

    fn typed<T: DeserializeOwned>(&self, record: ChannelRecord) -> Result<Record<T>, StateError> {
        Ok(Record {
            seq: record.seq,
            value: self.state.decode(&self.what(), record.value)?,
            key: record.key,
            recorded_at: record.recorded_at,
        })
    }

    /// Appends `value` under `key`, durably. A key the book holds already changes nothing (the
    /// append is repeatable after a crash); true when the record is new.
    pub async fn append<T: Serialize>(&self, key: &str, value: &T) -> Result<bool, StateError> {
        let json = self.state.encode(&self.what(), value)?;
        let appended = self
            .state
            .store
            .append_channel_record(
                &self.state.scope,
                &self.name,
                key,
                &json,
                self.state.now_ms(),
            )
            .await
            .map_err(|e| self.state.store_error(&self.what(), e))?;
        Ok(appended.new)
    }

    /// The record under `key`.
    pub async fn find<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<Record<T>>, StateError> {
        self.state
            .store
            .find_channel_record(&self.state.scope, &self.name, key)
            .await
            .map_err(|e| self.state.store_error(&self.what(), e))?
            .map(|r| self.typed(r))
            .transpose()
    }

    /// Every record after position `after` (0: from the start), in order. A reader that keeps
    /// the last `seq` it saw and reads again from there sees every later append, whichever
    /// gateway made it.
    pub async fn since<T: DeserializeOwned>(
        &self,
        mut after: i64,
    ) -> Result<Vec<Record<T>>, StateError> {
        let mut out = Vec::new();
        loop {
            let page = self
                .state
                .store
                .channel_records_since(&self.state.scope, &self.name, after, PAGE)
                .await
                .map_err(|e| self.state.store_error(&self.what(), e))?;
            let full = page.len() == PAGE as usize;
            for record in page {
                after = record.seq;
                out.push(self.typed(record)?);
            }
            if !full {
                return Ok(out);
            }
        }
    }

    /// Removes the records older than `max_age` and, of the rest, all but the newest
    /// `keep_newest`; returns how many.
    pub async fn prune(
        &self,
        max_age: std::time::Duration,
        keep_newest: u64,
    ) -> Result<u64, StateError> {
        let age = i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX);
        let older_than = self.state.now_ms().saturating_sub(age);
        self.state
            .store
            .prune_channel_records(&self.state.scope, &self.name, older_than, keep_newest)
            .await
            .map_err(|e| self.state.store_error(&self.what(), e))
    }
}

/// The files an earlier release of a channel kept in the gateway's state directory, for a
/// one-time import into the store: read a file, write what it holds through the
/// [`ChannelState`] (repeatable: records by their keys, values only where none is stored),
/// then [`retire`](LegacyFiles::retire) it. A crash anywhere in between imports again on the
/// next start and loses nothing. A file of named values is imported by
/// [`ChannelState::import_values`], which keeps that order.
///
/// The earlier release named several files the same for every account of a kind (one send book
/// for all Zalo OAs, one for all WhatsApp numbers…), so such a file may hold evidence of more
/// than one account. In a gateway every channel reads [`LegacyFiles::shared_in_dir`]: each
/// account imports what the file holds (its records are keyed by the channel, so another
/// account's records are inert), and the files are set aside by
/// [`retire_noted`](LegacyFiles::retire_noted) once every channel was built, never by the first
/// account before the others read them.
#[derive(Debug, Clone, Default)]
pub struct LegacyFiles {
    dir: Option<PathBuf>,
    /// Shared mode: the names [`retire`](LegacyFiles::retire) noted, set aside later.
    noted: Option<Arc<std::sync::Mutex<Noted>>>,
}

/// The files noted for setting aside, until [`LegacyFiles::retire_noted`] ran (after it, a
/// late import sets its file aside at once).
#[derive(Debug, Default)]
struct Noted {
    names: std::collections::BTreeSet<String>,
    done: bool,
}

/// A file of a legacy directory: its name and bytes.
pub type LegacyFile = (String, Vec<u8>);

/// The suffix a retired file is renamed with.
pub const RETIRED_SUFFIX: &str = ".imported";

impl LegacyFiles {
    /// The files in `dir` (the gateway's state directory).
    pub fn in_dir(dir: impl Into<PathBuf>) -> LegacyFiles {
        LegacyFiles {
            dir: Some(dir.into()),
            noted: None,
        }
    }

    /// The files in `dir`, read by every channel of a gateway: [`retire`](LegacyFiles::retire)
    /// only notes a file, [`retire_noted`](LegacyFiles::retire_noted) (on this value or a clone)
    /// sets the noted files aside once every channel has imported.
    pub fn shared_in_dir(dir: impl Into<PathBuf>) -> LegacyFiles {
        LegacyFiles {
            dir: Some(dir.into()),
            noted: Some(Arc::default()),
        }
    }

    /// No files to import (a new account, a test).
    pub fn none() -> LegacyFiles {
        LegacyFiles {
            dir: None,
            noted: None,
        }
    }

    fn path(&self, name: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|dir| dir.join(name))
    }

    /// The bytes of file `name`, when it is there and not yet retired.
    pub fn read(&self, name: &str) -> std::io::Result<Option<Vec<u8>>> {
        let Some(path) = self.path(name) else {
            return Ok(None);
        };
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            // A directory of that name: not a file to read.
            Err(_) if path.is_dir() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The files in directory `name` (name and bytes, sorted by name), when it is there.
    pub fn read_dir(&self, name: &str) -> std::io::Result<Option<Vec<LegacyFile>>> {
        let Some(path) = self.path(name) else {
            return Ok(None);
        };
        let entries = match std::fs::read_dir(&path) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                out.push((
                    entry.file_name().to_string_lossy().into_owned(),
                    std::fs::read(entry.path())?,
                ));
            }
        }
        out.sort();
        Ok(Some(out))
    }

    /// Sets file (or directory) `name` aside as `<name>.imported` (`.imported.2`, … when an
    /// earlier one is there), durably; nothing when it is not there. Call it only once what
    /// the file holds is stored. In shared mode the file is only noted here (other accounts
    /// may still have to read it) and set aside by [`retire_noted`](LegacyFiles::retire_noted).
    pub fn retire(&self, name: &str) -> std::io::Result<()> {
        if let Some(noted) = &self.noted {
            let mut noted = noted
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !noted.done {
                noted.names.insert(name.to_owned());
                return Ok(());
            }
        }
        self.set_aside(name)
    }

    /// Sets aside every file [`retire`](LegacyFiles::retire) noted (shared mode): call it once
    /// every channel reading the directory has imported. Returns the files that could not be
    /// set aside, with why (they are read again at the next start, adding nothing).
    pub fn retire_noted(&self) -> Vec<(PathBuf, std::io::Error)> {
        let Some(noted) = &self.noted else {
            return Vec::new();
        };
        let names = {
            let mut noted = noted
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            noted.done = true;
            std::mem::take(&mut noted.names)
        };
        names
            .into_iter()
            .filter_map(|name| {
                self.set_aside(&name)
                    .err()
                    .map(|e| (self.path(&name).unwrap_or_else(|| PathBuf::from(&name)), e))
            })
            .collect()
    }

    fn set_aside(&self, name: &str) -> std::io::Result<()> {
        let (Some(dir), Some(path)) = (self.dir.as_ref(), self.path(name)) else {
            return Ok(());
        };
        if std::fs::symlink_metadata(&path).is_err() {
            return Ok(());
        }
        // An earlier import's copy may be there (a file put back by hand): keep both, since a
        // directory cannot be renamed over a full one.
        let mut target = dir.join(format!("{name}{RETIRED_SUFFIX}"));
        let mut n = 1;
        while std::fs::symlink_metadata(&target).is_ok() {
            n += 1;
            target = dir.join(format!("{name}{RETIRED_SUFFIX}.{n}"));
        }
        std::fs::rename(&path, target)?;
        sync_dir(dir)
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// What [`ChannelState::import_values`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Imported {
    /// The file was there and is now set aside (shared mode: noted, set aside once every
    /// channel has imported).
    pub retired: bool,
    /// Values of the file written to the store.
    pub written: usize,
    /// Values of the file the store held already (newer, or imported before a crash): left as
    /// stored.
    pub kept: usize,
}

/// A legacy file could not be imported. It is left where it was (unless only setting it aside
/// failed), so what it holds is not lost.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file is there but cannot be read.
    #[error(
        "{} (kept by an earlier release) cannot be read: {source}; make it readable by the \
         gateway, or move it out of the state directory to start without what it holds",
        path.display()
    )]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The file does not hold what that release wrote there.
    #[error(
        "{} (kept by an earlier release) cannot be imported: {reason}; it was left in place: \
         repair it, or move it out of the state directory to start without what it holds",
        path.display()
    )]
    Unparsable {
        /// The file.
        path: PathBuf,
        /// What does not fit.
        reason: String,
    },
    /// The store refused a value of the file.
    #[error(
        "{} (kept by an earlier release) could not be imported: {source}; it was left in place \
         and is imported at the next start",
        path.display()
    )]
    Store {
        /// The file.
        path: PathBuf,
        /// The store's error.
        #[source]
        source: StateError,
    },
    /// Its values are stored, but the file could not be set aside.
    #[error(
        "{} was imported but could not be renamed with the suffix {RETIRED_SUFFIX}: {source}; \
         it is read again at the next start (adding nothing) until it is moved aside",
        path.display()
    )]
    Retire {
        /// The file.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

impl ChannelState {
    /// Imports the named values legacy file `file` holds, as `parse` reads them (an empty
    /// answer: nothing to import), then sets the file aside; no file, nothing done.
    ///
    /// A value the store holds already wins: it was learned after the file was written, or
    /// imported by a start that stopped before setting the file aside, so an old file never
    /// overwrites newer state and a repeated import adds nothing. The file is set aside only
    /// after every write returned, so a crash at any point reads it again at the next start. A
    /// file that cannot be read or parsed stops the import before any write and stays in place
    /// for the operator to repair or move.
    pub async fn import_values<N, T, I>(
        &self,
        legacy: &LegacyFiles,
        file: &str,
        parse: impl FnOnce(&[u8]) -> Result<I, String>,
    ) -> Result<Imported, ImportError>
    where
        I: IntoIterator<Item = (N, T)>,
        N: AsRef<str>,
        T: Serialize,
    {
        let path = || legacy.path(file).unwrap_or_else(|| PathBuf::from(file));
        let Some(bytes) = legacy.read(file).map_err(|source| ImportError::Read {
            path: path(),
            source,
        })?
        else {
            return Ok(Imported::default());
        };
        let values = parse(&bytes)
            .map_err(|reason| ImportError::Unparsable {
                path: path(),
                reason,
            })?
            .into_iter()
            .map(|(name, value)| {
                let name = name.as_ref().to_owned();
                let json = self.encode(&format!("value {name}"), &value)?;
                Ok((name, json))
            })
            .collect::<Result<Vec<_>, StateError>>()
            .map_err(|source| ImportError::Store {
                path: path(),
                source,
            })?;
        let mut imported = Imported {
            retired: true,
            ..Imported::default()
        };
        for (name, json) in values {
            // Absent: a stored value is newer than the file, or is this file's, imported before
            // a crash.
            let swapped = self
                .store
                .swap_channel_value(
                    &self.scope,
                    &name,
                    ValueExpectation::Absent,
                    &json,
                    self.now_ms(),
                )
                .await
                .map_err(|e| ImportError::Store {
                    path: path(),
                    source: self.store_error(&format!("value {name}"), e),
                })?;
            match swapped {
                clawgate_store::ValueSwap::Written(_) => imported.written += 1,
                clawgate_store::ValueSwap::Conflict(_) => imported.kept += 1,
            }
        }
        // Only now: a crash before this line leaves the file to be read again.
        legacy.retire(file).map_err(|source| ImportError::Retire {
            path: path(),
            source,
        })?;
        Ok(imported)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;
    use clawgate_store::{AppendedRecord, ChannelValue, StoreResult, ValueSwap};

    fn unused<T>() -> StoreResult<T> {
        Err(StoreError::InvalidInput(
            "this test keeps no channel state".into(),
        ))
    }

    /// A state for tests that never reach it (settings parsing).
    pub(crate) fn unused_state() -> ChannelState {
        ChannelState::with_system_clock(
            Arc::new(Values::default()),
            ChannelScope::new("memory", "default"),
        )
    }

    /// Named values in memory, with the port's compare-and-set (books are not kept: their calls
    /// fail).
    #[derive(Default)]
    struct Values {
        values: std::sync::Mutex<std::collections::HashMap<String, ChannelValue>>,
        refuse_writes: std::sync::atomic::AtomicBool,
    }

    #[async_trait::async_trait]
    impl ChannelStateStore for Values {
        async fn append_channel_record(
            &self,
            _: &ChannelScope,
            _: &str,
            _: &str,
            _: &serde_json::Value,
            _: UnixMillis,
        ) -> StoreResult<AppendedRecord> {
            unused()
        }
        async fn find_channel_record(
            &self,
            _: &ChannelScope,
            _: &str,
            _: &str,
        ) -> StoreResult<Option<ChannelRecord>> {
            unused()
        }
        async fn channel_records_since(
            &self,
            _: &ChannelScope,
            _: &str,
            _: i64,
            _: u32,
        ) -> StoreResult<Vec<ChannelRecord>> {
            unused()
        }
        async fn prune_channel_records(
            &self,
            _: &ChannelScope,
            _: &str,
            _: UnixMillis,
            _: u64,
        ) -> StoreResult<u64> {
            unused()
        }
        async fn load_channel_value(
            &self,
            _: &ChannelScope,
            name: &str,
        ) -> StoreResult<Option<ChannelValue>> {
            Ok(self.values.lock().unwrap().get(name).cloned())
        }
        async fn swap_channel_value(
            &self,
            _: &ChannelScope,
            name: &str,
            expected: ValueExpectation,
            value: &serde_json::Value,
            now: UnixMillis,
        ) -> StoreResult<ValueSwap> {
            if self.refuse_writes.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(StoreError::InvalidInput("writes are refused".into()));
            }
            let mut values = self.values.lock().unwrap();
            let stored = values.get(name).cloned();
            let holds = match expected {
                ValueExpectation::Absent => stored.is_none(),
                ValueExpectation::Version(v) => stored.as_ref().is_some_and(|s| s.version == v),
                ValueExpectation::Any => true,
            };
            if !holds {
                return Ok(ValueSwap::Conflict(stored));
            }
            let written = ChannelValue {
                value: value.clone(),
                version: stored.map_or(1, |s| s.version + 1),
                updated_at: now,
            };
            values.insert(name.to_owned(), written.clone());
            Ok(ValueSwap::Written(written))
        }
        async fn delete_channel_value(&self, _: &ChannelScope, name: &str) -> StoreResult<bool> {
            Ok(self.values.lock().unwrap().remove(name).is_some())
        }
    }

    fn memory_state() -> (ChannelState, Arc<Values>) {
        let store = Arc::new(Values::default());
        let state =
            ChannelState::with_system_clock(store.clone(), ChannelScope::new("memory", "default"));
        (state, store)
    }

    const CURSOR_FILE: &str = "memory-cursor";

    /// A legacy cursor file: a number, as text.
    fn cursor(bytes: &[u8]) -> Result<Option<(&'static str, u64)>, String> {
        let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
        let at = text
            .trim()
            .parse::<u64>()
            .map_err(|e| format!("not a cursor: {e}"))?;
        Ok(Some(("cursor", at)))
    }

    async fn stored_cursor(state: &ChannelState) -> Option<Versioned<u64>> {
        state.value("cursor").await.unwrap()
    }

    #[tokio::test]
    async fn a_failed_store_call_names_the_scope_and_the_book() {
        let error = unused_state()
            .book("sends")
            .append("k", &1)
            .await
            .expect_err("the store refuses");
        let text = error.to_string();
        assert!(
            text.contains("memory/default") && text.contains("book sends"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_legacy_value_is_imported_once_then_its_file_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CURSOR_FILE), b"42\n").unwrap();
        let legacy = LegacyFiles::in_dir(dir.path());
        let (state, _) = memory_state();

        let imported = state
            .import_values(&legacy, CURSOR_FILE, cursor)
            .await
            .unwrap();
        assert_eq!(
            imported,
            Imported {
                retired: true,
                written: 1,
                kept: 0
            }
        );
        assert_eq!(
            stored_cursor(&state).await,
            Some(Versioned {
                value: 42,
                version: 1
            })
        );
        assert!(!dir.path().join(CURSOR_FILE).exists(), "set aside");
        assert!(
            dir.path()
                .join(format!("{CURSOR_FILE}{RETIRED_SUFFIX}"))
                .is_file()
        );

        let again = state
            .import_values(&legacy, CURSOR_FILE, cursor)
            .await
            .unwrap();
        assert_eq!(again, Imported::default(), "no file, nothing done");
        assert_eq!(stored_cursor(&state).await.unwrap().version, 1);
    }

    #[tokio::test]
    async fn a_value_already_stored_is_kept_and_the_file_still_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("memory-refs.json"),
            br#"{"a": "old a", "b": "old b"}"#,
        )
        .unwrap();
        let legacy = LegacyFiles::in_dir(dir.path());
        let (state, _) = memory_state();
        state.put("ref/a", &"newer a".to_owned()).await.unwrap();

        let imported = state
            .import_values(&legacy, "memory-refs.json", |bytes| {
                let refs: std::collections::BTreeMap<String, String> =
                    serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
                Ok(refs.into_iter().map(|(k, v)| (format!("ref/{k}"), v)))
            })
            .await
            .unwrap();
        assert_eq!(
            imported,
            Imported {
                retired: true,
                written: 1,
                kept: 1
            }
        );
        let a = state.value::<String>("ref/a").await.unwrap().unwrap();
        assert_eq!(
            (a.value.as_str(), a.version),
            ("newer a", 1),
            "the stored value wins over the file's"
        );
        let b = state.value::<String>("ref/b").await.unwrap().unwrap();
        assert_eq!(b.value, "old b", "what the store lacked is imported");
        assert!(!dir.path().join("memory-refs.json").exists(), "set aside");
    }

    #[tokio::test]
    async fn a_start_killed_between_the_write_and_the_set_aside_imports_nothing_twice() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CURSOR_FILE), b"42").unwrap();
        let legacy = LegacyFiles::in_dir(dir.path());
        let (state, _) = memory_state();
        state
            .import_values(&legacy, CURSOR_FILE, cursor)
            .await
            .unwrap();
        // The kill: the value is written, the file was never renamed. The feed then ran on.
        std::fs::rename(
            dir.path().join(format!("{CURSOR_FILE}{RETIRED_SUFFIX}")),
            dir.path().join(CURSOR_FILE),
        )
        .unwrap();
        state.put("cursor", &50_u64).await.unwrap();

        let imported = state
            .import_values(&legacy, CURSOR_FILE, cursor)
            .await
            .unwrap();
        assert_eq!(
            imported,
            Imported {
                retired: true,
                written: 0,
                kept: 1
            }
        );
        assert_eq!(
            stored_cursor(&state).await,
            Some(Versioned {
                value: 50,
                version: 2
            }),
            "the old file does not move the cursor back"
        );
        assert!(
            !dir.path().join(CURSOR_FILE).exists(),
            "set aside this time"
        );
    }

    #[tokio::test]
    async fn a_file_that_does_not_parse_is_an_error_naming_it_and_stays_in_place() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CURSOR_FILE), b"yesterday").unwrap();
        let legacy = LegacyFiles::in_dir(dir.path());
        let (state, _) = memory_state();

        let error = state
            .import_values(&legacy, CURSOR_FILE, cursor)
            .await
            .expect_err("not a number");
        assert!(
            matches!(&error, ImportError::Unparsable { path, .. } if path.ends_with(CURSOR_FILE)),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(
            text.contains(CURSOR_FILE) && text.contains("not a cursor") && text.contains("move it"),
            "names the file, what is wrong and what to do: {text}"
        );
        assert_eq!(
            std::fs::read(dir.path().join(CURSOR_FILE)).unwrap(),
            b"yesterday",
            "left in place"
        );
        assert_eq!(stored_cursor(&state).await, None, "nothing written");
    }

    #[tokio::test]
    async fn a_refused_write_leaves_the_file_in_place() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CURSOR_FILE), b"42").unwrap();
        let legacy = LegacyFiles::in_dir(dir.path());
        let (state, store) = memory_state();
        store
            .refuse_writes
            .store(true, std::sync::atomic::Ordering::SeqCst);

        let error = state
            .import_values(&legacy, CURSOR_FILE, cursor)
            .await
            .expect_err("the store refuses");
        assert!(matches!(error, ImportError::Store { .. }), "{error:?}");
        assert!(dir.path().join(CURSOR_FILE).is_file(), "left in place");

        store
            .refuse_writes
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let imported = state
            .import_values(&legacy, CURSOR_FILE, cursor)
            .await
            .unwrap();
        assert_eq!(imported.written, 1, "imported at the next start");
    }

    #[tokio::test]
    async fn a_file_holding_nothing_to_import_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CURSOR_FILE), b"  \n").unwrap();
        let legacy = LegacyFiles::in_dir(dir.path());
        let (state, _) = memory_state();

        let imported = state
            .import_values(&legacy, CURSOR_FILE, |bytes| {
                let text = String::from_utf8_lossy(bytes).trim().to_owned();
                Ok((!text.is_empty()).then_some(("cursor", text)))
            })
            .await
            .unwrap();
        assert_eq!(
            imported,
            Imported {
                retired: true,
                written: 0,
                kept: 0
            }
        );
        assert!(!dir.path().join(CURSOR_FILE).exists(), "set aside");
        assert_eq!(LegacyFiles::none().read(CURSOR_FILE).unwrap(), None);
    }

    #[test]
    fn a_file_every_account_of_a_kind_shares_is_set_aside_only_after_all_imported_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sends.jsonl");
        std::fs::write(&file, b"{\"key\":\"a\"}\n").unwrap();
        let gateway = LegacyFiles::shared_in_dir(dir.path());
        let (first, second) = (gateway.clone(), gateway.clone());
        first.retire("sends.jsonl").unwrap();
        assert!(
            second.read("sends.jsonl").unwrap().is_some(),
            "the second account still reads what the first one imported"
        );
        second.retire("sends.jsonl").unwrap();
        assert!(
            file.is_file(),
            "nothing is set aside before every channel is built"
        );
        assert!(gateway.retire_noted().is_empty());
        assert!(!file.exists());
        assert!(dir.path().join("sends.jsonl.imported").is_file());
        assert!(
            !dir.path().join("sends.jsonl.imported.2").exists(),
            "set aside once, though two accounts retired it"
        );
        // An import after that (a channel built late) sets its file aside at once.
        std::fs::write(dir.path().join("late"), b"1").unwrap();
        first.retire("late").unwrap();
        assert!(dir.path().join("late.imported").is_file());
    }

    #[test]
    fn legacy_files_are_read_once_and_set_aside_durably() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("journal.jsonl"), b"{\"a\":1}\n").unwrap();
        std::fs::create_dir(dir.path().join("refs")).unwrap();
        std::fs::write(dir.path().join("refs").join("b"), b"2").unwrap();
        std::fs::write(dir.path().join("refs").join("a"), b"1").unwrap();
        let legacy = LegacyFiles::in_dir(dir.path());
        assert_eq!(
            legacy.read("journal.jsonl").unwrap().as_deref(),
            Some(&b"{\"a\":1}\n"[..])
        );
        assert_eq!(legacy.read("missing").unwrap(), None);
        assert_eq!(
            legacy.read("refs").unwrap(),
            None,
            "a directory is not a file"
        );
        assert_eq!(
            legacy.read_dir("refs").unwrap(),
            Some(vec![
                ("a".into(), b"1".to_vec()),
                ("b".into(), b"2".to_vec())
            ]),
            "a directory's files, by name"
        );
        legacy.retire("journal.jsonl").unwrap();
        legacy.retire("refs").unwrap();
        legacy.retire("missing").unwrap();
        assert_eq!(legacy.read("journal.jsonl").unwrap(), None, "retired");
        assert_eq!(legacy.read_dir("refs").unwrap(), None, "retired");
        assert!(dir.path().join("journal.jsonl.imported").is_file());
        assert!(dir.path().join("refs.imported").is_dir());
        assert_eq!(LegacyFiles::none().read("journal.jsonl").unwrap(), None);

        // Put back after an import (by hand, or a restored backup): imported again and set
        // aside beside the first copy.
        std::fs::create_dir(dir.path().join("refs")).unwrap();
        std::fs::write(dir.path().join("refs").join("c"), b"3").unwrap();
        legacy.retire("refs").unwrap();
        assert!(
            dir.path().join("refs.imported").join("a").is_file(),
            "the first copy"
        );
        assert!(
            dir.path().join("refs.imported.2").join("c").is_file(),
            "the second copy"
        );
        assert_eq!(legacy.read_dir("refs").unwrap(), None);
    }
}
