//! A VFS shim that hands each commit's WAL frames to the operating system in one write.
//!
//! SQLite writes every WAL frame with two `pwrite`s (its 24-byte header, then the page), so a
//! commit of 20 pages costs 40 system calls on the one thread every write waits for. This shim
//! wraps the platform VFS and, for WAL files only and only while the calling thread runs a
//! `COMMIT` inside [`commit`], gathers a run of contiguous frame writes in memory and writes the
//! run at once when its commit frame is complete. Everything else goes to the platform VFS
//! untouched; the files on disk are byte for byte what SQLite would write.
//!
//! Why that is safe: a frame becomes visible to other connections only when the committing
//! connection updates the WAL index, which SQLite does after it wrote the commit frame, and the
//! run is written when that frame's page arrives. Any other call on the WAL file (read, sync,
//! size, truncate, file control, close) writes the run first, so SQLite never observes the file
//! without bytes it wrote. A run that fails to write is reported as the failing write, exactly as
//! a failed `pwrite` would be, and is then dropped; so is a run its commit never completed:
//! SQLite abandons those frames with the transaction that wrote them. Frames a transaction
//! spills before its `COMMIT` are written straight through, since it may still roll back (see
//! [`commit`]). Only the frame pattern is held (see [`FrameRun`]); a log SQLite pads to sector
//! boundaries (a database opened with `psow=0`) is written through.
//!
//! Only the store's writer connection opens the database through the shim; readers, other
//! processes and the `sqlite3` shell use SQLite's own VFS on the same files.
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

use rusqlite::ffi;

/// The name connections open the shim by.
const NAME: &CStr = c"clawgate-wal-batch";

/// The size of a WAL frame header (file format: page number, database size after commit, two
/// salts, two checksums). SQLite writes it alone, right before the frame's page.
const FRAME_HEADER: usize = 24;

/// The most a run holds: SQLite's unix VFS writes at most 128 KiB - 1 bytes per call. A write
/// that would make the run longer is preceded by writing the run.
const MAX_RUN: usize = 0x1_ffff;

/// Contiguous WAL writes not yet handed to the operating system.
///
/// Only SQLite's frame pattern is held: a 24-byte frame header, then the page that follows it.
/// Any other write (the WAL header, a write SQLite splits around a sync) goes straight through
/// after the run, so a change in that pattern costs batching, never a frame left unwritten.
#[derive(Debug, Default)]
pub(crate) struct FrameRun {
    start: i64,
    bytes: Vec<u8>,
    /// The last write held was a frame header: `Some(true)` when it heads a commit frame, whose
    /// page completes the commit.
    header_held: Option<bool>,
}

/// What becomes of a write offered to a [`FrameRun`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    /// Held in the run.
    Held,
    /// Held, and the run now ends with a complete commit frame: write it.
    Complete,
    /// Not a frame write: write the run, then this write on its own.
    Through,
}

impl FrameRun {
    /// Whether a write of `len` bytes at `offset` can join the run (an empty run takes any).
    pub(crate) fn takes(&self, offset: i64, len: usize) -> bool {
        self.bytes.is_empty() || (offset == self.end() && self.bytes.len() + len <= MAX_RUN)
    }

    fn end(&self) -> i64 {
        self.start + i64::try_from(self.bytes.len()).unwrap_or(i64::MAX)
    }

    /// Offers a write the run [`takes`](Self::takes).
    pub(crate) fn push(&mut self, offset: i64, data: &[u8]) -> Push {
        let header = data.len() == FRAME_HEADER;
        let page_of = if header {
            None
        } else {
            self.header_held.take()
        };
        if !header && page_of.is_none() {
            return Push::Through;
        }
        if self.bytes.is_empty() {
            self.start = offset;
        }
        self.bytes.extend_from_slice(data);
        if header {
            // Bytes 4..8: the database size after commit, zero for every other frame.
            self.header_held = Some(data[4..8] != [0; 4]);
            Push::Held
        } else if page_of == Some(true) {
            Push::Complete
        } else {
            Push::Held
        }
    }

    /// The pending run (offset and bytes), if any.
    pub(crate) fn pending(&self) -> Option<(i64, &[u8])> {
        (!self.bytes.is_empty()).then_some((self.start, self.bytes.as_slice()))
    }

    /// Forgets the run once written (or once its write failed). A header just held still
    /// marks the page that follows it, which may open the next run.
    pub(crate) fn clear(&mut self) {
        self.bytes.clear();
    }
}

/// The platform VFS the shim forwards to.
struct Platform(*mut ffi::sqlite3_vfs);
// SAFETY: a registered VFS is immutable and lives until the process ends; SQLite calls it from
// any thread.
unsafe impl Send for Platform {}
unsafe impl Sync for Platform {}

static REGISTERED: OnceLock<Result<Platform, c_int>> = OnceLock::new();

/// Registers the shim (once per process) and returns its name, or SQLite's error code.
pub(crate) fn register() -> Result<&'static CStr, c_int> {
    let registered = REGISTERED.get_or_init(|| {
        // SAFETY: `sqlite3_vfs_find` initialises SQLite if needed and returns the default VFS or
        // null. The copy keeps every platform method and its app data, so the methods this shim
        // does not replace run as they would for the platform VFS. The leaked copy is never
        // freed, as SQLite requires of a registered VFS.
        unsafe {
            let platform = ffi::sqlite3_vfs_find(std::ptr::null());
            if platform.is_null() {
                return Err(ffi::SQLITE_ERROR);
            }
            let mut shim = *platform;
            shim.pNext = std::ptr::null_mut();
            shim.zName = NAME.as_ptr();
            shim.szOsFile = (*platform)
                .szOsFile
                .max(c_int::try_from(REAL_OFFSET).unwrap_or(c_int::MAX) + (*platform).szOsFile);
            shim.xOpen = Some(open);
            let rc = ffi::sqlite3_vfs_register(Box::into_raw(Box::new(shim)), 0);
            if rc == ffi::SQLITE_OK {
                Ok(Platform(platform))
            } else {
                Err(rc)
            }
        }
    });
    match registered {
        Ok(_) => Ok(NAME),
        Err(rc) => Err(*rc),
    }
}

fn platform() -> *mut ffi::sqlite3_vfs {
    match REGISTERED.get() {
        Some(Ok(platform)) => platform.0,
        _ => std::ptr::null_mut(),
    }
}

/// A WAL file as the shim opens it: its own header, then the platform's file in the same
/// allocation (SQLite allocates `szOsFile` bytes, 8-aligned, for every open file).
#[repr(C)]
struct WalFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    /// Off (a log SQLite pads to sectors): every write goes straight through.
    batching: bool,
}

const REAL_OFFSET: usize = (std::mem::size_of::<WalFile>() + 7) & !7;

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let platform = platform();
    // SAFETY: SQLite hands `file` with `szOsFile` writable bytes, at least the platform's size
    // and, for the WAL layout, `REAL_OFFSET` more; `platform` is the registered platform VFS.
    unsafe {
        let Some(platform_open) = platform.as_ref().and_then(|p| p.xOpen) else {
            return ffi::SQLITE_ERROR;
        };
        if flags & ffi::SQLITE_OPEN_WAL == 0 {
            return platform_open(platform, name, file, flags, out_flags);
        }
        let real = file
            .cast::<u8>()
            .add(REAL_OFFSET)
            .cast::<ffi::sqlite3_file>();
        let rc = platform_open(platform, name, real, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            // Null methods: SQLite does not call xClose on a file that failed to open.
            (*file).pMethods = std::ptr::null();
            return rc;
        }
        // Without power-safe overwrite (the database's `psow` URI parameter, on by default)
        // SQLite pads each commit to a sector boundary, splitting a frame write around a sync:
        // that log is written through.
        let batching = ffi::sqlite3_uri_boolean(name, c"psow".as_ptr(), 1) != 0;
        file.cast::<WalFile>().write(WalFile {
            base: ffi::sqlite3_file {
                pMethods: &WAL_METHODS,
            },
            real,
            batching,
        });
        ffi::SQLITE_OK
    }
}

/// Version 1: the WAL file is never mapped and holds no shared memory (the database file does).
static WAL_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 1,
    xClose: Some(wal_close),
    xRead: Some(wal_read),
    xWrite: Some(wal_write),
    xTruncate: Some(wal_truncate),
    xSync: Some(wal_sync),
    xFileSize: Some(wal_file_size),
    xLock: Some(wal_lock),
    xUnlock: Some(wal_unlock),
    xCheckReservedLock: Some(wal_check_reserved_lock),
    xFileControl: Some(wal_file_control),
    xSectorSize: Some(wal_sector_size),
    xDeviceCharacteristics: Some(wal_device_characteristics),
    xShmMap: None,
    xShmLock: None,
    xShmBarrier: None,
    xShmUnmap: None,
    xFetch: None,
    xUnfetch: None,
};

/// The run of frames the commit running on this thread holds, and the platform file it is for.
struct Held {
    real: *mut ffi::sqlite3_file,
    run: FrameRun,
}

thread_local! {
    /// Set while this thread runs a commit inside [`commit`]: frames are held only then.
    static COMMITTING: Cell<bool> = const { Cell::new(false) };
    /// What the commit running on this thread holds (kept between commits for its buffer).
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Runs `commit` (SQLite's `COMMIT`) with this thread's WAL frames held and written together.
///
/// Frames are held only here: a transaction may spill pages to the WAL before it commits and
/// then roll back. Held, such frames would reach the file later, possibly over frames another
/// connection wrote at the same offsets in the meantime; written straight through, they are
/// overwritten like SQLite expects. Frames still held when `commit` returns never got their
/// commit frame (the commit failed part way) and are dropped: they belong to no transaction.
pub(crate) fn commit<T>(commit: impl FnOnce() -> T) -> T {
    struct Scope;
    impl Drop for Scope {
        fn drop(&mut self) {
            COMMITTING.set(false);
            HELD.with_borrow_mut(|held| {
                if let Some(held) = held {
                    held.run.clear();
                }
            });
        }
    }
    COMMITTING.set(true);
    let _scope = Scope;
    commit()
}

/// The platform's file behind a WAL file this shim opened, and whether its frames may be held.
///
/// SAFETY (for callers): `file` is a `WalFile` written by `open` and not yet closed.
unsafe fn parts(file: *mut ffi::sqlite3_file) -> (*mut ffi::sqlite3_file, bool) {
    // SAFETY: see above.
    unsafe {
        let shim = &*file.cast::<WalFile>();
        (shim.real, shim.batching)
    }
}

/// The platform's methods of the platform's file.
unsafe fn methods<'a>(real: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    // SAFETY: an open platform file has methods.
    unsafe { &*(*real).pMethods }
}

/// Writes `run` to `real`, if it holds anything, and forgets it.
unsafe fn write_run(run: &mut FrameRun, real: *mut ffi::sqlite3_file) -> c_int {
    let Some((offset, bytes)) = run.pending() else {
        return ffi::SQLITE_OK;
    };
    // SAFETY: `real` is open; the bytes live until the call returns.
    let rc = unsafe {
        match (methods(real).xWrite, c_int::try_from(bytes.len())) {
            (Some(write), Ok(len)) => write(real, bytes.as_ptr().cast(), len, offset),
            _ => ffi::SQLITE_IOERR_WRITE,
        }
    };
    run.clear();
    rc
}

/// Writes what this thread holds for `real`, if anything.
unsafe fn write_held(real: *mut ffi::sqlite3_file) -> c_int {
    HELD.with_borrow_mut(|held| match held {
        // SAFETY: a held run's file is open: the run is written or dropped before its commit
        // returns, and SQLite closes no file during a commit.
        Some(held) if held.real == real => unsafe { write_run(&mut held.run, real) },
        _ => ffi::SQLITE_OK,
    })
}

/// Writes what this thread holds for the file, then runs `then` on the platform file unless
/// that write failed.
unsafe fn after_held(
    file: *mut ffi::sqlite3_file,
    then: impl FnOnce(*mut ffi::sqlite3_file, &ffi::sqlite3_io_methods) -> c_int,
) -> c_int {
    // SAFETY: `file` is an open shim WAL file (SQLite's contract for io methods).
    unsafe {
        let (real, _) = parts(file);
        let rc = write_held(real);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        then(real, methods(real))
    }
}

unsafe extern "C" fn wal_close(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: SQLite closes an open file once; nothing held refers to it afterwards.
    unsafe {
        let (real, _) = parts(file);
        let written = write_held(real);
        HELD.with_borrow_mut(|held| {
            if held.as_ref().is_some_and(|held| held.real == real) {
                *held = None;
            }
        });
        let closed = methods(real)
            .xClose
            .map_or(ffi::SQLITE_OK, |close| close(real));
        if written != ffi::SQLITE_OK {
            written
        } else {
            closed
        }
    }
}

unsafe extern "C" fn wal_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: SQLite passes `amount` readable bytes at `data`; `real` is open.
    unsafe {
        let (real, batching) = parts(file);
        let through = |real: *mut ffi::sqlite3_file| {
            methods(real)
                .xWrite
                .map_or(ffi::SQLITE_IOERR_WRITE, |f| f(real, data, amount, offset))
        };
        let Ok(len) = usize::try_from(amount) else {
            return ffi::SQLITE_IOERR_WRITE;
        };
        if !batching || !COMMITTING.get() {
            return match write_held(real) {
                ffi::SQLITE_OK => through(real),
                failed => failed,
            };
        }
        HELD.with_borrow_mut(|slot| {
            let held = slot.get_or_insert_with(|| Held {
                real,
                run: FrameRun::default(),
            });
            if held.real != real {
                // Another log's run (never within one commit): written before this file's.
                let rc = write_run(&mut held.run, held.real);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
                held.real = real;
            }
            if !held.run.takes(offset, len) {
                let rc = write_run(&mut held.run, real);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
            }
            match held
                .run
                .push(offset, std::slice::from_raw_parts(data.cast::<u8>(), len))
            {
                Push::Held => ffi::SQLITE_OK,
                Push::Complete => write_run(&mut held.run, real),
                Push::Through => match write_run(&mut held.run, real) {
                    ffi::SQLITE_OK => through(real),
                    failed => failed,
                },
            }
        })
    }
}

unsafe extern "C" fn wal_read(
    file: *mut ffi::sqlite3_file,
    data: *mut c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: forwarded unchanged to the platform file.
    unsafe {
        after_held(file, |real, m| {
            m.xRead
                .map_or(ffi::SQLITE_IOERR_READ, |f| f(real, data, amount, offset))
        })
    }
}

unsafe extern "C" fn wal_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    // SAFETY: forwarded unchanged to the platform file.
    unsafe {
        after_held(file, |real, m| {
            m.xTruncate
                .map_or(ffi::SQLITE_IOERR_TRUNCATE, |f| f(real, size))
        })
    }
}

unsafe extern "C" fn wal_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: forwarded unchanged to the platform file.
    unsafe {
        after_held(file, |real, m| {
            m.xSync.map_or(ffi::SQLITE_IOERR_FSYNC, |f| f(real, flags))
        })
    }
}

unsafe extern "C" fn wal_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: forwarded unchanged to the platform file.
    unsafe {
        after_held(file, |real, m| {
            m.xFileSize
                .map_or(ffi::SQLITE_IOERR_FSTAT, |f| f(real, size))
        })
    }
}

unsafe extern "C" fn wal_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: forwarded unchanged to the platform file.
    unsafe {
        after_held(file, |real, m| {
            m.xFileControl
                .map_or(ffi::SQLITE_NOTFOUND, |f| f(real, op, arg))
        })
    }
}

unsafe extern "C" fn wal_lock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: forwarded unchanged to the platform file.
    unsafe {
        let (real, _) = parts(file);
        methods(real)
            .xLock
            .map_or(ffi::SQLITE_OK, |f| f(real, level))
    }
}

unsafe extern "C" fn wal_unlock(file: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    // SAFETY: forwarded unchanged to the platform file.
    unsafe {
        let (real, _) = parts(file);
        methods(real)
            .xUnlock
            .map_or(ffi::SQLITE_OK, |f| f(real, level))
    }
}

unsafe extern "C" fn wal_check_reserved_lock(
    file: *mut ffi::sqlite3_file,
    out: *mut c_int,
) -> c_int {
    // SAFETY: forwarded unchanged to the platform file.
    unsafe {
        let (real, _) = parts(file);
        methods(real)
            .xCheckReservedLock
            .map_or(ffi::SQLITE_IOERR_CHECKRESERVEDLOCK, |f| f(real, out))
    }
}

unsafe extern "C" fn wal_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: forwarded unchanged to the platform file.
    unsafe {
        let (real, _) = parts(file);
        methods(real).xSectorSize.map_or(4096, |f| f(real))
    }
}

unsafe extern "C" fn wal_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: forwarded unchanged to the platform file.
    unsafe {
        let (real, _) = parts(file);
        methods(real).xDeviceCharacteristics.map_or(0, |f| f(real))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
pub(crate) mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    const PAGE: usize = 4096;

    fn header(page: u32, size_after_commit: u32) -> Vec<u8> {
        let mut bytes = vec![0u8; FRAME_HEADER];
        bytes[..4].copy_from_slice(&page.to_be_bytes());
        bytes[4..8].copy_from_slice(&size_after_commit.to_be_bytes());
        bytes
    }

    /// Where frame `n` (from 0) starts in a WAL of 4 KiB pages.
    fn frame_at(n: i64) -> i64 {
        32 + n * (FRAME_HEADER + PAGE) as i64
    }

    #[test]
    fn a_run_is_written_when_the_page_of_its_commit_frame_arrives() {
        let mut run = FrameRun::default();
        let page = vec![7u8; PAGE];
        for (n, size_after_commit) in [(0, 0), (1, 0), (2, 9)] {
            let at = frame_at(n);
            assert!(run.takes(at, FRAME_HEADER));
            assert_eq!(
                run.push(at, &header(n as u32 + 2, size_after_commit)),
                Push::Held
            );
            assert!(run.takes(at + FRAME_HEADER as i64, PAGE));
            let expected = if size_after_commit == 0 {
                Push::Held
            } else {
                Push::Complete
            };
            assert_eq!(
                run.push(at + FRAME_HEADER as i64, &page),
                expected,
                "frame {n}"
            );
        }
        let (offset, bytes) = run.pending().unwrap();
        assert_eq!(offset, frame_at(0));
        assert_eq!(bytes.len(), 3 * (FRAME_HEADER + PAGE));
        assert_eq!(&bytes[FRAME_HEADER..FRAME_HEADER + PAGE], page.as_slice());
        run.clear();
        assert!(run.pending().is_none());
    }

    #[test]
    fn a_write_elsewhere_or_past_the_size_limit_does_not_join_the_run() {
        let mut run = FrameRun::default();
        assert!(
            run.takes(frame_at(5), FRAME_HEADER),
            "an empty run takes any write"
        );
        run.push(frame_at(5), &header(3, 0));
        let next = frame_at(5) + FRAME_HEADER as i64;
        assert!(run.takes(next, PAGE));
        assert!(!run.takes(next + 1, PAGE), "a gap");
        assert!(
            !run.takes(frame_at(0), FRAME_HEADER),
            "a rewrite of an earlier frame"
        );
        assert!(!run.takes(next, MAX_RUN), "longer than one platform write");
    }

    #[test]
    fn only_frame_headers_and_the_pages_after_them_are_held() {
        let mut run = FrameRun::default();
        let page = vec![3u8; PAGE];
        assert_eq!(
            run.push(0, &[0u8; 32]),
            Push::Through,
            "the log's own header"
        );
        assert_eq!(run.push(32, &page), Push::Through, "a page after no header");
        // Headers rewritten in a row: the page belongs to the last one.
        assert_eq!(run.push(frame_at(0), &header(2, 5)), Push::Held);
        assert_eq!(run.push(frame_at(1), &header(3, 0)), Push::Held);
        assert_eq!(run.push(frame_at(1) + 24, &page), Push::Held);
        assert_eq!(
            run.push(frame_at(2), &page),
            Push::Through,
            "one page per header"
        );
        assert_eq!(
            run.push(frame_at(2), &[1u8; 100]),
            Push::Through,
            "a split write"
        );
    }

    #[test]
    fn a_commit_page_that_opens_a_new_run_is_still_written_at_once() {
        let mut run = FrameRun::default();
        let page = vec![1u8; PAGE];
        let mut n = 0;
        while run.pending().map_or(0, |(_, bytes)| bytes.len()) + FRAME_HEADER + PAGE <= MAX_RUN {
            assert_eq!(run.push(frame_at(n), &header(2, 0)), Push::Held);
            assert_eq!(
                run.push(frame_at(n) + FRAME_HEADER as i64, &page),
                Push::Held
            );
            n += 1;
        }
        // The commit header still fits; its page does not, so the run is written without it.
        assert!(run.takes(frame_at(n), FRAME_HEADER));
        assert_eq!(run.push(frame_at(n), &header(2, n as u32)), Push::Held);
        assert!(!run.takes(frame_at(n) + FRAME_HEADER as i64, PAGE));
        run.clear();
        assert_eq!(
            run.push(frame_at(n) + FRAME_HEADER as i64, &page),
            Push::Complete
        );
    }

    /// A connection to `uri` (`file:` URI) through the shim or the platform VFS.
    fn open(uri: &str, shim: bool) -> Connection {
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI;
        let conn = if shim {
            Connection::open_with_flags_and_vfs(uri, flags, register().unwrap()).unwrap()
        } else {
            Connection::open_with_flags(uri, flags).unwrap()
        };
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             CREATE TABLE IF NOT EXISTS t (n INTEGER PRIMARY KEY, b BLOB NOT NULL);",
        )
        .unwrap();
        conn
    }

    fn uri(dir: &tempfile::TempDir, name: &str) -> String {
        format!("file:{}", dir.path().join(name).display())
    }

    /// Write system calls made by the calling thread so far.
    #[cfg(target_os = "linux")]
    pub(crate) fn write_calls() -> u64 {
        let io = std::fs::read_to_string("/proc/thread-self/io").unwrap();
        io.lines()
            .find_map(|line| line.strip_prefix("syscw:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// The reason the shim exists: SQLite alone makes two writes per WAL frame.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_commit_reaches_the_wal_in_a_few_writes_instead_of_two_per_frame() {
        let dir = tempfile::tempdir().unwrap();
        let mut databases = 0;
        let mut calls = |shim: bool, params: &str, scoped: bool| {
            databases += 1;
            let name = format!("{databases}.db");
            let conn = open(&format!("{}{params}", uri(&dir, &name)), shim);
            let before = write_calls();
            let tx = conn.unchecked_transaction().unwrap();
            for n in 0..60 {
                tx.execute("INSERT INTO t (n, b) VALUES (?1, zeroblob(3000))", [n])
                    .unwrap();
            }
            if scoped {
                commit(|| tx.commit()).unwrap();
            } else {
                tx.commit().unwrap();
            }
            write_calls() - before
        };
        let platform = calls(false, "", true);
        assert!(
            platform >= 120,
            "60 pages or more, two writes each: {platform}"
        );
        let shim = calls(true, "", true);
        assert!(
            shim <= 5,
            "runs of up to 128 KiB: {shim} (platform VFS: {platform})"
        );
        // Outside `commit`, and without power-safe overwrite, SQLite's own writes are kept.
        let unscoped = calls(true, "", false);
        assert!(
            unscoped >= 120,
            "written through outside a commit: {unscoped}"
        );
        let padded = calls(true, "?psow=0", true);
        assert!(
            padded >= 120,
            "written through with sector padding: {padded}"
        );
    }

    /// Frames a transaction spills to the log before it rolls back are written at once, never
    /// held: held, they would reach the file after another connection committed its own frames
    /// at the same offsets, over them.
    #[test]
    fn frames_spilled_by_a_rolled_back_transaction_never_overwrite_a_later_commit() {
        let dir = tempfile::tempdir().unwrap();
        let shimmed = open(&uri(&dir, "state.db"), true);
        let other = open(&uri(&dir, "state.db"), false);
        // A cache of ten pages: the transaction below spills most of its pages to the log. An
        // empty log: undoing it then reads nothing back from the log.
        shimmed
            .execute_batch("PRAGMA cache_size = 10; PRAGMA wal_checkpoint(TRUNCATE);")
            .unwrap();
        let tx = shimmed.unchecked_transaction().unwrap();
        for n in 0..100 {
            tx.execute("INSERT INTO t (n, b) VALUES (?1, randomblob(3000))", [n])
                .unwrap();
        }
        tx.rollback().unwrap();
        // Another connection (another process, say) commits where the spilled frames were.
        let tx = other.unchecked_transaction().unwrap();
        for n in 0..100 {
            tx.execute(
                "INSERT INTO t (n, b) VALUES (?1, zeroblob(3000))",
                [1000 + n],
            )
            .unwrap();
        }
        tx.commit().unwrap();
        // The shimmed connection reads and commits again.
        let seen: i64 = shimmed
            .query_row("SELECT COUNT(*) FROM t WHERE n >= 1000", [], |r| r.get(0))
            .unwrap();
        assert_eq!(seen, 100);
        let tx = shimmed.unchecked_transaction().unwrap();
        tx.execute("INSERT INTO t (n, b) VALUES (5000, zeroblob(10))", [])
            .unwrap();
        commit(|| tx.commit()).unwrap();
        drop(shimmed);
        let check = open(&uri(&dir, "state.db"), false);
        let (rows, zeros): (i64, i64) = check
            .query_row(
                "SELECT COUNT(*), SUM(b = zeroblob(length(b))) FROM t",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((rows, zeros), (101, 101));
        assert_intact(&check);
    }

    /// A commit is in the file before SQLite publishes it: a connection through the platform VFS
    /// reads every commit the moment it is made, and the file stays intact. Also with a sync
    /// per commit, and with the sector padding SQLite adds without power-safe overwrite.
    #[test]
    fn another_connection_reads_each_commit_as_soon_as_it_is_made() {
        for (params, sync) in [("", "NORMAL"), ("", "FULL"), ("?psow=0", "FULL")] {
            reads_each_commit(params, sync);
        }
    }

    fn reads_each_commit(params: &str, sync: &str) {
        let dir = tempfile::tempdir().unwrap();
        let writer = open(&format!("{}{params}", uri(&dir, "state.db")), true);
        writer
            .execute_batch(&format!("PRAGMA synchronous = {sync}"))
            .unwrap();
        let reader = open(&uri(&dir, "state.db"), false);
        for round in 1..=40i64 {
            let tx = writer.unchecked_transaction().unwrap();
            for n in 0..round % 7 + 1 {
                tx.execute("INSERT INTO t (b) VALUES (randomblob(?1))", [500 + 300 * n])
                    .unwrap();
            }
            commit(|| tx.commit()).unwrap();
            let seen: i64 = reader
                .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
                .unwrap();
            let made: i64 = writer
                .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
                .unwrap();
            assert_eq!(seen, made, "round {round} ({params} {sync})");
        }
        drop(writer);
        assert_intact(&reader);
    }

    fn assert_intact(conn: &Connection) {
        let verdict: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(verdict, "ok");
    }
}
