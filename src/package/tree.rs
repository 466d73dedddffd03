//! A hook's files as a package sees them: walked without following links, each checked
//! (regular files, directories, and links that stay inside the tree only; nothing owned by
//! another user when asked; a size budget), hashed into one tree hash for the lock file,
//! compared with another version, and copied.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::package::error::PackageError;

/// Largest package accepted: the sum of its files' sizes (declared sizes for archives,
/// checked before anything is written).
pub const MAX_PACKAGE_BYTES: u64 = 64 * 1024 * 1024;

/// Most entries (files, directories, links) a package may hold.
pub const MAX_PACKAGE_ENTRIES: usize = 20_000;

/// One entry of a tree, by path relative to its top (`/`-separated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory.
    Dir,
    /// A regular file: whether it is executable, its SHA-256 (hex), its size.
    File {
        /// Any execute bit set.
        exec: bool,
        /// SHA-256 of the content, hex.
        sha256: String,
        /// Bytes.
        size: u64,
    },
    /// A symbolic link and its target as written.
    Link(String),
}

/// A walked tree: entries by relative path.
pub type Tree = BTreeMap<String, Entry>;

/// What [`walk`] refuses besides links leaving the tree and special files.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rules {
    /// Refuse files and directories owned by a user other than this process's (and root).
    pub own_files_only: bool,
    /// Leave out a top-level `.git` directory.
    pub skip_git: bool,
}

/// Walks `top` without following links, checking every entry ([`Rules`], links inside `top`,
/// no special files, at most [`MAX_PACKAGE_BYTES`] and [`MAX_PACKAGE_ENTRIES`]).
pub fn walk(top: &Path, rules: Rules) -> Result<Tree, PackageError> {
    let mut tree = Tree::new();
    let mut total = 0u64;
    let mut stack = vec![PathBuf::new()];
    let mut links = BTreeMap::new();
    let uid = unsafe_free_euid();
    while let Some(rel) = stack.pop() {
        let dir = top.join(&rel);
        let entries = std::fs::read_dir(&dir).map_err(PackageError::io("read", &dir))?;
        for e in entries {
            let e = e.map_err(PackageError::io("read", &dir))?;
            let rel = rel.join(e.file_name());
            if rules.skip_git && rel == Path::new(".git") {
                continue;
            }
            let path = e.path();
            let meta =
                std::fs::symlink_metadata(&path).map_err(PackageError::io("inspect", &path))?;
            if rules.own_files_only && meta.uid() != uid && meta.uid() != 0 {
                return Err(PackageError::unsafe_entry(
                    &path,
                    format!("owned by uid {}, not by this user (uid {uid})", meta.uid()),
                ));
            }
            let key = rel_key(&rel);
            let entry = if meta.is_dir() {
                stack.push(rel.clone());
                Entry::Dir
            } else if meta.is_file() {
                total = total.saturating_add(meta.len());
                if total > MAX_PACKAGE_BYTES {
                    return Err(too_large(&path));
                }
                Entry::File {
                    exec: meta.permissions().mode() & 0o111 != 0,
                    sha256: sha256_file(&path)?,
                    size: meta.len(),
                }
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).map_err(PackageError::io("read", &path))?;
                check_link(&rel, &target).map_err(|r| PackageError::unsafe_entry(&path, r))?;
                links.insert(rel.clone(), target.clone());
                Entry::Link(target.to_string_lossy().into_owned())
            } else {
                return Err(PackageError::unsafe_entry(
                    &path,
                    "a special file (device, socket or pipe)",
                ));
            };
            tree.insert(key, entry);
            if tree.len() > MAX_PACKAGE_ENTRIES {
                return Err(PackageError::unsafe_entry(
                    top,
                    format!("more than {MAX_PACKAGE_ENTRIES} entries"),
                ));
            }
        }
    }
    check_link_chains(&links)
        .map_err(|(rel, why)| PackageError::unsafe_entry(top.join(rel), why))?;
    Ok(tree)
}

/// The refusal for a package over [`MAX_PACKAGE_BYTES`].
pub fn too_large(path: &Path) -> PackageError {
    PackageError::unsafe_entry(
        path,
        format!(
            "the package is larger than the limit of {} MiB",
            MAX_PACKAGE_BYTES / (1024 * 1024)
        ),
    )
}

fn unsafe_free_euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn rel_key(rel: &Path) -> String {
    rel.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// A relative path inside the tree: only normal components (no `..`, not absolute).
pub fn check_relative(rel: &Path) -> Result<(), String> {
    if rel.as_os_str().is_empty() {
        return Err("an empty path".into());
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err("the path contains `..`".into()),
            Component::RootDir | Component::Prefix(_) => {
                return Err("an absolute path".into());
            }
        }
    }
    Ok(())
}

/// A link at `rel` (relative to the tree's top) pointing at `target` must stay inside the
/// tree: a relative target whose `..` never climb above the top.
pub fn check_link(rel: &Path, target: &Path) -> Result<(), String> {
    if target.is_absolute() {
        return Err(format!(
            "a symbolic link to the absolute path {}",
            target.display()
        ));
    }
    let mut depth: i64 = rel.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            _ => {}
        }
        if depth < 0 {
            return Err(format!(
                "a symbolic link to {} points outside the hook directory",
                target.display()
            ));
        }
    }
    Ok(())
}

/// How many links one chain may pass through (the kernel's own limit).
const MAX_LINK_HOPS: usize = 40;

/// Every link of a tree (`links`: its path relative to the top, and its target) resolved the
/// way the kernel would, through the other links of the tree, must land inside the tree:
/// [`check_link`] alone reads one link's text, and `up -> ../..` placed deep enough makes
/// `manual -> a/b/up/../../../x` leave it. The first link that leaves, and why.
pub fn check_link_chains(links: &BTreeMap<PathBuf, PathBuf>) -> Result<(), (PathBuf, String)> {
    // Keys as the walk below builds paths: names only (`./a` is `a`).
    let normal: BTreeMap<PathBuf, PathBuf> = links
        .iter()
        .map(|(k, v)| {
            let k: PathBuf = k
                .components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .collect();
            (k, v.clone())
        })
        .collect();
    for (link, target) in &normal {
        resolve_in_tree(&normal, link, target).map_err(|why| {
            (
                link.clone(),
                format!(
                    "a symbolic link to {} that leaves the hook directory through its other \
                     links ({why}); make it point inside, without passing through a link to \
                     a parent",
                    target.display()
                ),
            )
        })?;
    }
    Ok(())
}

/// One step of a link's target: a name, or `..`.
enum Step {
    Name(std::ffi::OsString),
    Up,
}

fn steps(target: &Path) -> Result<Vec<Step>, String> {
    target
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(Step::Name(n.to_os_string()))),
            Component::ParentDir => Some(Ok(Step::Up)),
            Component::CurDir => None,
            Component::RootDir | Component::Prefix(_) => Some(Err("an absolute path".into())),
        })
        .collect()
}

/// Where `link -> target` lands, as a path under the tree's top, or why it leaves.
fn resolve_in_tree(
    links: &BTreeMap<PathBuf, PathBuf>,
    link: &Path,
    target: &Path,
) -> Result<PathBuf, String> {
    let mut cur: Vec<std::ffi::OsString> = link
        .parent()
        .map(|p| p.iter().map(|c| c.to_os_string()).collect())
        .unwrap_or_default();
    let mut todo = steps(target)?;
    todo.reverse();
    let mut hops = 0;
    while let Some(step) = todo.pop() {
        match step {
            Step::Up => {
                if cur.pop().is_none() {
                    return Err("it climbs above the top".into());
                }
            }
            Step::Name(n) => {
                cur.push(n);
                let here: PathBuf = cur.iter().collect();
                if let Some(next) = links.get(&here) {
                    hops += 1;
                    if hops > MAX_LINK_HOPS {
                        return Err("too many levels of links".into());
                    }
                    cur.pop();
                    let mut more = steps(next)?;
                    more.reverse();
                    todo.extend(more);
                }
            }
        }
    }
    Ok(cur.iter().collect())
}

/// SHA-256 of a file's content, hex.
pub fn sha256_file(path: &Path) -> Result<String, PackageError> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).map_err(PackageError::io("read", path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf).map_err(PackageError::io("read", path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// One hash for a whole tree: every path with its type, execute bit and content hash (or
/// link target), in path order. `sha256:` and hex.
pub fn tree_hash(tree: &Tree) -> String {
    let mut h = Sha256::new();
    for (path, entry) in tree {
        let line = match entry {
            Entry::Dir => format!("d {path}\n"),
            Entry::File { exec, sha256, .. } => {
                format!("{} {sha256} {path}\n", if *exec { "x" } else { "f" })
            }
            Entry::Link(t) => format!("l {t} {path}\n"),
        };
        h.update(line.as_bytes());
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// The entries of `tree` (walked from hook directory `dir`) its HOOK.yaml declares as data
/// (`data:` and the defaults, [`crate::trust::data`]): files the hook may write while it runs.
pub fn data_only(dir: &Path, tree: &Tree, want_data: bool) -> Tree {
    let declared = std::fs::read_to_string(dir.join("HOOK.yaml"))
        .ok()
        .and_then(|t| crate::manifest::parse_manifest(&t).ok())
        .map(|m| m.data)
        .unwrap_or_default();
    let rules = crate::trust::data::DataRules::new(&declared);
    let is_data = |path: &str, is_dir: bool| {
        rules.is_data(path, is_dir)
            || path
                .match_indices('/')
                .any(|(i, _)| rules.is_data(&path[..i], true))
    };
    tree.iter()
        .filter(|(p, e)| is_data(p, **e == Entry::Dir) == want_data)
        .map(|(p, e)| (p.clone(), e.clone()))
        .collect()
}

/// The tree hash of a hook directory's `tree` as the lock file records it: its data
/// ([`data_only`]) left out.
pub fn hook_hash(dir: &Path, tree: &Tree) -> String {
    tree_hash(&data_only(dir, tree, false))
}

/// What differs between two versions of a tree (directories left out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diff {
    /// In the new version only.
    pub added: Vec<String>,
    /// In the old version only.
    pub removed: Vec<String>,
    /// In both, with other content, mode or target.
    pub changed: Vec<String>,
}

impl Diff {
    /// True when nothing differs.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

/// Compares `old` with `new`.
pub fn diff(old: &Tree, new: &Tree) -> Diff {
    let mut d = Diff::default();
    for (p, e) in new {
        match old.get(p) {
            _ if *e == Entry::Dir => {}
            None => d.added.push(p.clone()),
            Some(o) if o != e => d.changed.push(p.clone()),
            Some(_) => {}
        }
    }
    for (p, e) in old {
        if *e != Entry::Dir && !new.contains_key(p) {
            d.removed.push(p.clone());
        }
    }
    d
}

/// Copies the walked `tree` of `from` into `to` (created): files with their mode bits (write
/// for group and others dropped), links as they are.
pub fn copy(from: &Path, tree: &Tree, to: &Path) -> Result<(), PackageError> {
    std::fs::create_dir_all(to).map_err(PackageError::io("create", to))?;
    set_mode(to, 0o755)?;
    for (rel, entry) in tree {
        let (src, dst) = (from.join(rel), to.join(rel));
        match entry {
            Entry::Dir => {
                std::fs::create_dir_all(&dst).map_err(PackageError::io("create", &dst))?;
                set_mode(&dst, 0o755)?;
            }
            Entry::File { exec, .. } => {
                if let Some(parent) = dst.parent() {
                    std::fs::create_dir_all(parent).map_err(PackageError::io("create", parent))?;
                }
                std::fs::copy(&src, &dst).map_err(PackageError::io("copy", &src))?;
                set_mode(&dst, if *exec { 0o755 } else { 0o644 })?;
            }
            Entry::Link(target) => {
                std::os::unix::fs::symlink(target, &dst)
                    .map_err(PackageError::io("create the link", &dst))?;
            }
        }
    }
    Ok(())
}

/// Sets exactly `mode` on `path`.
pub fn set_mode(path: &Path, mode: u32) -> Result<(), PackageError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(PackageError::io("set the mode of", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_must_stay_inside() {
        assert!(check_link(Path::new("a"), Path::new("b")).is_ok());
        assert!(check_link(Path::new("d/a"), Path::new("../b")).is_ok());
        assert!(check_link(Path::new("a"), Path::new("../b")).is_err());
        assert!(check_link(Path::new("d/a"), Path::new("x/../../../b")).is_err());
        assert!(check_link(Path::new("a"), Path::new("/etc/passwd")).is_err());
        // Issue 46 row 8: each link's text stays inside; the chain does not.
        let deep = Path::new("a/b/c/d/e/f/g/h/up");
        let mut links = BTreeMap::new();
        links.insert(deep.to_path_buf(), PathBuf::from("../../../../../../../.."));
        links.insert(
            PathBuf::from("manual"),
            PathBuf::from("a/b/c/d/e/f/g/h/up/../../../tmp/secret"),
        );
        for (l, t) in &links {
            assert!(check_link(l, t).is_ok(), "{}", l.display());
        }
        let (bad, why) = check_link_chains(&links).unwrap_err();
        assert_eq!(bad, PathBuf::from("manual"));
        assert!(why.contains("leaves the hook directory"), "{why}");
        links.insert(
            PathBuf::from("manual"),
            PathBuf::from("a/b/c/d/e/f/g/h/up/x"),
        );
        assert!(check_link_chains(&links).is_ok());
        let mut lp = BTreeMap::new();
        lp.insert(PathBuf::from("x"), PathBuf::from("y"));
        lp.insert(PathBuf::from("y"), PathBuf::from("x"));
        assert!(check_link_chains(&lp).is_err());
        assert!(check_relative(Path::new("a/../../b")).is_err());
        assert!(check_relative(Path::new("/a")).is_err());
        assert!(check_relative(Path::new("a/b")).is_ok());
    }
}
