//! How much one call allocates: a global allocator that forwards to the system's and, on a
//! thread inside [`measure`], keeps the bytes live and their peak. Other threads pay one
//! thread-local read per allocation.
//!
//! Linking this crate installs the allocator in the test binary (a binary has one global
//! allocator: a test binary that sets its own cannot use this crate).
#![allow(unsafe_code)] // `GlobalAlloc` is an unsafe trait; every call forwards to `System`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    /// Whether this thread is inside [`measure`].
    static ON: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated and not yet freed since [`measure`] began (freeing older memory makes
    /// it negative).
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The highest `LIVE` since [`measure`] began.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // `try_with`: a thread being torn down has no thread-locals any more.
    let _ = ON.try_with(|on| {
        if on.get() {
            let live = LIVE.with(|l| {
                let v = l.get().saturating_add(delta);
                l.set(v);
                v
            });
            PEAK.with(|p| p.set(p.get().max(live)));
        }
    });
}

fn signed(n: usize) -> isize {
    isize::try_from(n).unwrap_or(isize::MAX)
}

// SAFETY: every method forwards to `System` with the arguments it was given; the counting
// touches only `const`-initialized thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(signed(layout.size()));
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(signed(layout.size()));
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-signed(layout.size()));
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(signed(new_size) - signed(layout.size()));
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Runs `f` and returns its result with the peak of bytes it held allocated at once on this
/// thread (allocations on other threads are not seen).
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    ON.with(|on| on.set(true));
    let out = f();
    ON.with(|on| on.set(false));
    let peak = PEAK.with(Cell::get);
    (out, usize::try_from(peak).unwrap_or(0))
}

/// The most a parser may hold at once for an input of `input_len` bytes of JSON text: a
/// multiple of the input that covers a parsed tree and a copy or two of it (a `Value` node
/// costs far more than its text: a 100 KB payload of small objects held about 25 MB as trees),
/// plus a fixed allowance. A parser that sizes a buffer from a number in its input blows
/// through it.
pub fn allowance(input_len: usize) -> usize {
    input_len.saturating_mul(512).saturating_add(4 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_of_one_call_is_measured() {
        let ((), small) = measure(|| drop(std::hint::black_box(vec![0u8; 16])));
        let ((), big) = measure(|| drop(std::hint::black_box(vec![0u8; 8 << 20])));
        assert!(small < 1_024, "{small}");
        assert!(big >= 8 << 20, "{big}");
        assert!(
            big > allowance(16),
            "a buffer sized from the input is over the allowance"
        );
    }
}
