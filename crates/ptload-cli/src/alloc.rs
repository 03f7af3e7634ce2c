//! The process's allocator, and how soon it gives freed memory back.
//!
//! mimalloc serves the open's many small allocations fast, from arenas
//! backed by huge pages. It keeps freed memory for a while before giving
//! it back to the system (a second, in mimalloc 3). That is right for an
//! open, which frees and reuses much in a short time, and wrong for a
//! pass over a checkpoint read by ranged requests: each fetched storage is
//! freed once written or hashed, and memory kept for a second doubles the
//! peak (docs/benchmarks.md, "Reading a URL in bounded memory").
//! [`give_back_at_once`] makes freed memory go back at once, for the rest
//! of the process; the commands call it once a ranged source is open.
//!
//! The process runs without transparent huge pages. Where the system
//! hands them out (`always`, or `madvise`, which mimalloc asks for), the
//! first touch of an arena zeroes 2 MiB: a quarter of a small command's
//! time went to clearing two of them before `main`, and a third of
//! `inspect` of a 500 MB state dict. The open's allocations no longer
//! fill enough memory for the fewer page faults to pay that back; the
//! storages of a URL, freed once used, go back to the system a page at a
//! time (peaks a third lower); see docs/benchmarks.md, "The process's
//! start, the scan's shortcut and the JSON writer". `MIMALLOC_ALLOW_THP`,
//! when set, decides instead.

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs before `main`, after mimalloc's own start (a constructor of
/// higher priority) and before its first arena is touched (the runtime's
/// first allocation, in `lang_start`).
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static NO_HUGE_PAGES: extern "C" fn() = no_huge_pages;

/// Turns transparent huge pages off for the process, unless the user
/// chose with `MIMALLOC_ALLOW_THP` (read by mimalloc, which turns them off
/// itself for 0); and makes the first arena small (see
/// [`SMALL_FIRST_ARENA`]). Allocates nothing: an allocation here would
/// touch the arena first.
#[cfg(target_os = "linux")]
extern "C" fn no_huge_pages() {
    // SAFETY: getenv reads the environment with a NUL-terminated name,
    // before any other thread exists; prctl with PR_SET_THP_DISABLE only
    // sets a flag of this process's memory.
    unsafe {
        if libc::getenv(c"MIMALLOC_ALLOW_THP".as_ptr()).is_null() {
            libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
        }
    }
    small_first_arena();
}

/// `mi_option_arena_reserve` in mimalloc 3's `mi_option_t` (KiB of
/// address space reserved for each new arena).
const ARENA_RESERVE: libmimalloc_sys::mi_option_t = 23;
/// Its default in mimalloc 3 on 64-bit systems: 1 GiB.
const ARENA_RESERVE_DEFAULT: std::os::raw::c_long = 1024 * 1024;
/// The first arena's reservation: mimalloc's smallest arena, 32 MiB.
///
/// Setting up an arena writes its bitmaps, which grow with its size: for
/// 1 GiB, 42 of the 360 pages `ptload --version` touches. Most commands
/// fill a few MiB; the first arena is made this small before the first
/// allocation, and [`arenas_at_full_size`] puts the default back at the
/// start of `main`, so that a large open's further arenas are reserved a
/// GiB at a time, as before (arenas of 64 MiB throughout made the open of
/// 20,000 tensors 6% slower).
const SMALL_FIRST_ARENA: std::os::raw::c_long = 32 * 1024;

/// Reserve the first arena small, unless the user chose the reservation
/// (`MIMALLOC_ARENA_RESERVE`) or the linked mimalloc is not the version
/// whose option number this knows.
#[cfg(target_os = "linux")]
fn small_first_arena() {
    // SAFETY: getenv reads the environment with a NUL-terminated name,
    // before any other thread exists (no allocation, see the caller).
    let chosen = unsafe { !libc::getenv(c"MIMALLOC_ARENA_RESERVE".as_ptr()).is_null() };
    if chosen || !knows_arena_reserve() {
        return;
    }
    // SAFETY: mi_option_set stores a number in mimalloc's table of
    // options; `ARENA_RESERVE` is a valid option of the linked version
    // (checked above), and mimalloc rounds any size up to its smallest.
    unsafe { libmimalloc_sys::mi_option_set(ARENA_RESERVE, SMALL_FIRST_ARENA) }
}

/// Put the arena reservation back to mimalloc's default, after the first
/// arena is made (the runtime allocated before `main`). Does nothing
/// unless [`small_first_arena`] set it.
pub(crate) fn arenas_at_full_size() {
    // SAFETY: reads mimalloc's options' table.
    if unsafe { libmimalloc_sys::mi_option_get(ARENA_RESERVE) } != SMALL_FIRST_ARENA
        || std::env::var_os("MIMALLOC_ARENA_RESERVE").is_some()
        || !knows_arena_reserve()
    {
        return;
    }
    // SAFETY: as in `small_first_arena`.
    unsafe { libmimalloc_sys::mi_option_set(ARENA_RESERVE, ARENA_RESERVE_DEFAULT) }
}

/// Whether the linked mimalloc is version 3 and `ARENA_RESERVE` reads as
/// its default or as the first arena's size set here.
fn knows_arena_reserve() -> bool {
    // SAFETY: both only read mimalloc's version and its options' table.
    let (version, reserve) = unsafe {
        (
            libmimalloc_sys::mi_version(),
            libmimalloc_sys::mi_option_get(ARENA_RESERVE),
        )
    };
    version / 10_000 == MAJOR && (reserve == ARENA_RESERVE_DEFAULT || reserve == SMALL_FIRST_ARENA)
}

/// mimalloc's major version whose option numbers are below.
const MAJOR: i32 = 3;
/// `mi_option_purge_delay` in mimalloc 3's `mi_option_t` (milliseconds
/// freed memory is kept before it is given back).
const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// Its default in mimalloc 3.
const PURGE_DELAY_DEFAULT: std::os::raw::c_long = 1000;

/// Give freed memory back to the system at once from now on, unless the
/// user chose the delay (`MIMALLOC_PURGE_DELAY`). Does nothing when the
/// linked mimalloc is not the version whose option number this knows, or
/// the option does not read as that version's default (a check that the
/// number names the option meant).
pub(crate) fn give_back_at_once() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() || !knows_purge_delay() {
        return;
    }
    // SAFETY: mi_option_set stores a number in mimalloc's table of
    // options; `PURGE_DELAY` is a valid option of the linked version
    // (checked above), and any delay is valid.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) }
}

/// Whether the linked mimalloc is version 3 and `PURGE_DELAY` reads as its
/// default (or as 0, once set here).
fn knows_purge_delay() -> bool {
    // SAFETY: both only read mimalloc's version and its options' table.
    let (version, delay) = unsafe {
        (
            libmimalloc_sys::mi_version(),
            libmimalloc_sys::mi_option_get(PURGE_DELAY),
        )
    };
    version / 10_000 == MAJOR && (delay == PURGE_DELAY_DEFAULT || delay == 0)
}

/// The delay in force now, in milliseconds.
#[cfg(test)]
fn purge_delay() -> std::os::raw::c_long {
    // SAFETY: reads mimalloc's options' table.
    unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The constructor ran: the process's memory takes no huge pages.
    #[cfg(target_os = "linux")]
    #[test]
    fn huge_pages_are_off() {
        if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
            eprintln!("MIMALLOC_ALLOW_THP is set: the user's choice holds");
            return;
        }
        // SAFETY: PR_GET_THP_DISABLE only reads the flag.
        let off = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(off, 1);
    }

    /// A mimalloc update that renumbers its options or changes the
    /// default fails here, instead of silently setting another option or
    /// nothing.
    #[test]
    fn the_option_number_names_the_purge_delay() {
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            eprintln!("MIMALLOC_PURGE_DELAY is set: the default cannot be checked");
            return;
        }
        assert!(knows_purge_delay(), "mimalloc {}", unsafe {
            libmimalloc_sys::mi_version()
        });
        give_back_at_once();
        assert_eq!(purge_delay(), 0);
        // Other options are untouched: `mi_option_use_numa_nodes` (16)
        // keeps its default.
        assert_eq!(unsafe { libmimalloc_sys::mi_option_get(16) }, 0);
    }
}
