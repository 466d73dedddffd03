//! The reload scan, bounded per hook (issue 47): the roots are listed and each hook directory
//! is read (HOOK.yaml, the trust checks and hashes of its tree) on the service's threads for
//! hooks' files ([`crate::file_lanes`]). The roots are listed concurrently, each within
//! [`LIST_DEADLINE`] (one directory's listing); each hook directory is first looked at (itself
//! and its HOOK.yaml) within [`LIST_DEADLINE`], then read within [`SCAN_DEADLINE`]. A root or a directory whose files stall is reported as not answering (the
//! hooks running from it keep running) and the reload goes on with every other hook; its thread
//! stays its own, and while that read still waits, the next reload does not wait on it again
//! (it is reported at once): a stalled root costs the hooks under it and nothing else, and a
//! healthy hook's reload (its hand-over, `hook/handover.rs`) is not spent waiting on others'
//! stalls (issue 59).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::discovery::{Discovery, HookSpec, SkipCode, Skipped};
use crate::trust::policy::Gate;

/// How long the listing of one root, or the read of one hook directory, may take.
pub(crate) const SCAN_DEADLINE: Duration = crate::handler::starter::CHECK_DEADLINE;

/// How long the listing of one root may take.
pub(crate) const LIST_DEADLINE: Duration = Duration::from_secs(3);

// A reload's scan, however other hooks' files stall, ends before a hand-over gives up.
const _: () = assert!(
    crate::hook::handover::HANDOVER_WAIT.as_secs()
        > LIST_DEADLINE.as_secs() + SCAN_DEADLINE.as_secs() + 2
);

/// Called with each hook as soon as its directory is read, before the scan is over (the host
/// starts the fork server it will need then: issue 46's start-up cost).
pub(crate) type OnFound = Arc<dyn Fn(&HookSpec) + Send + Sync>;

/// Scans `roots` as [`crate::discovery::discover_with`] does, each root's listing and each hook
/// directory's read bounded (see the module comment); `env_stamp` is folded into each hook.
pub(crate) async fn scan(
    roots: Vec<PathBuf>,
    gate: Gate,
    env_stamp: u64,
    on_found: OnFound,
) -> Discovery {
    let gate = Arc::new(gate);
    let mut stalled_roots = Vec::new();
    let mut reads = Vec::new();
    let mut listings = tokio::task::JoinSet::new();
    for (i, root) in roots.into_iter().enumerate() {
        listings.spawn(async move {
            let key = format!("root:{}", root.to_string_lossy());
            let r = root.clone();
            let listed = bounded(
                &key,
                "the listing of a hooks directory",
                LIST_DEADLINE,
                move || crate::layout::hook_dir_candidates(&r),
            )
            .await;
            (i, root, listed)
        });
    }
    let mut listed = Vec::new();
    while let Some(done) = listings.join_next().await {
        if let Ok(one) = done {
            listed.push(one);
        }
    }
    listed.sort_by_key(|(i, _, _)| *i);
    for (_, root, dirs) in listed {
        match dirs {
            Ok(Some(dirs)) => reads.extend(dirs.into_iter().map(|d| (root.clone(), d))),
            Ok(None) => {} // a missing root loads nothing
            Err(e) => {
                tracing::warn!(root = %root.display(), "{e}: the hooks running from it keep running");
                stalled_roots.push(root);
            }
        }
    }
    let mut set = tokio::task::JoinSet::new();
    for (i, (root, dir)) in reads.into_iter().enumerate() {
        let (gate, on_found) = (gate.clone(), on_found.clone());
        set.spawn(async move {
            let load = read_dir(root, dir, gate, env_stamp).await;
            if let Some(Ok(spec)) = &load {
                on_found(spec);
            }
            (i, load)
        });
    }
    let mut loads: Vec<Option<Result<HookSpec, Box<Skipped>>>> = Vec::new();
    while let Some(done) = set.join_next().await {
        let Ok((i, load)) = done else { continue };
        if loads.len() <= i {
            loads.resize_with(i + 1, || None);
        }
        loads[i] = load;
    }
    let mut found = crate::discovery::assemble(loads.into_iter().flatten());
    found.stalled_roots = stalled_roots;
    found
}

/// One hook directory's load (`None`: not a directory), bounded.
async fn read_dir(
    root: PathBuf,
    dir: PathBuf,
    gate: Arc<Gate>,
    env_stamp: u64,
) -> Option<Result<HookSpec, Box<Skipped>>> {
    let key = dir.to_string_lossy().into_owned();
    // First the directory and its HOOK.yaml, within the listing's deadline: a mount that does
    // not answer costs the reload that, not the whole scan deadline that a tree that answers
    // gets for its hashes (a healthy hook's hand-over waits for this reload: issue 59).
    let d = dir.clone();
    let probe = bounded(
        &key,
        "a look at the hook directory",
        LIST_DEADLINE,
        move || {
            let is_dir = d.is_dir();
            let _ = d.join("HOOK.yaml").symlink_metadata();
            is_dir
        },
    )
    .await;
    match probe {
        Ok(false) => return None,
        Ok(true) => {}
        Err(e) => return Some(Err(Box::new(not_answering(&dir, e)))),
    }
    let d = dir.clone();
    let read = bounded(
        &key,
        "the scan of the hook's files",
        SCAN_DEADLINE,
        move || {
            if !d.is_dir() {
                return None;
            }
            let mut load = crate::discovery::load_dir_with(&root, &d, &gate);
            if let Ok(spec) = &mut load {
                crate::handler::prepare(spec);
                crate::dotenv::fold_into(spec, env_stamp);
            }
            Some(load)
        },
    )
    .await;
    match read {
        Ok(load) => load,
        Err(e) => Some(Err(Box::new(not_answering(&dir, e)))),
    }
}

/// A hook directory that did not answer: kept as it runs ([`SkipCode::Unreadable`] keeps the
/// last good version).
fn not_answering(dir: &Path, why: String) -> Skipped {
    Skipped {
        dir: dir.to_path_buf(),
        name: crate::layout::dir_name(dir),
        file: dir.join("HOOK.yaml"),
        code: SkipCode::Unreadable,
        reason: why,
        events: Vec::new(),
    }
}

/// [`crate::file_lanes::run`], refused at once while the last job of `key` still runs past
/// `deadline` and [`SCAN_DEADLINE`] (its file system still does not answer: waiting again would
/// only spend the reload's time; a hook directory's key is also that of the check before its
/// process starts, which may take up to [`SCAN_DEADLINE`] on a large tree).
async fn bounded<T: Send + 'static>(
    key: &str,
    what: &'static str,
    deadline: Duration,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let stuck = deadline.max(SCAN_DEADLINE);
    if let Some(waited) = crate::file_lanes::running_for(key).filter(|w| *w >= stuck) {
        return Err(format!(
            "{what} still does not answer (its last one has waited {})",
            crate::time::fmt_duration(waited)
        ));
    }
    crate::file_lanes::run(key, what, deadline, job)
        .await
        .map_err(|e| e.to_string())
}
