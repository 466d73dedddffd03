//! Safe extraction of `.tar.gz`/`.tgz` and `.zip` archives. Every entry is checked in a first
//! pass that writes nothing: a relative path without `..`, not through a link, a regular file,
//! directory or a link that stays inside, declared sizes within [`MAX_PACKAGE_BYTES`]. Only
//! then is anything written, each file bounded by its declared size.

use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use crate::package::error::PackageError;
use crate::package::tree::{MAX_PACKAGE_BYTES, MAX_PACKAGE_ENTRIES};
use crate::package::tree::{check_link, check_relative};

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Dir,
    File { size: u64, exec: bool },
    Link(PathBuf),
}

/// The checks of the first pass, over entries as they come.
struct Checker<'a> {
    archive: &'a Path,
    total: u64,
    count: usize,
    links: BTreeMap<PathBuf, PathBuf>,
}

impl Checker<'_> {
    fn entry(&mut self, path: &Path, kind: &Kind) -> Result<(), PackageError> {
        let refuse = |reason: String| PackageError::unsafe_entry(self.archive.join(path), reason);
        check_relative(path).map_err(refuse)?;
        if path.ancestors().skip(1).any(|a| self.links.contains_key(a)) {
            return Err(refuse(
                "a path through a symbolic link of the archive".into(),
            ));
        }
        self.count += 1;
        if self.count > MAX_PACKAGE_ENTRIES {
            return Err(refuse(format!("more than {MAX_PACKAGE_ENTRIES} entries")));
        }
        match kind {
            Kind::Dir => {}
            Kind::File { size, .. } => {
                self.total = self.total.saturating_add(*size);
                if *size > MAX_PACKAGE_BYTES || self.total > MAX_PACKAGE_BYTES {
                    return Err(refuse(format!(
                        "declares {size} bytes; a package may hold at most {} MiB",
                        MAX_PACKAGE_BYTES / (1024 * 1024)
                    )));
                }
            }
            Kind::Link(target) => {
                check_link(path, target).map_err(refuse)?;
                self.links.insert(path.to_path_buf(), target.to_path_buf());
            }
        }
        Ok(())
    }
}

/// Extracts `archive` into `dest` (created), after checking every entry.
pub fn extract(archive: &Path, dest: &Path) -> Result<(), PackageError> {
    let name = archive.to_string_lossy().to_ascii_lowercase();
    let mut checker = Checker {
        archive,
        total: 0,
        count: 0,
        links: BTreeMap::new(),
    };
    std::fs::create_dir_all(dest).map_err(PackageError::io("create", dest))?;
    let zip = name.ends_with(".zip");
    if zip {
        zip_entries(archive, &mut |p, k, _| checker.entry(p, k))?;
    } else {
        tar_entries(archive, &mut |p, k, _| checker.entry(p, k))?;
    }
    crate::package::tree::check_link_chains(&checker.links)
        .map_err(|(rel, why)| PackageError::unsafe_entry(archive.join(rel), why))?;
    if zip {
        zip_entries(archive, &mut |p, k, r| write(dest, p, k, r))
    } else {
        tar_entries(archive, &mut |p, k, r| write(dest, p, k, r))
    }
}

type Visit<'a> = dyn FnMut(&Path, &Kind, &mut dyn Read) -> Result<(), PackageError> + 'a;

fn bad(archive: &Path, reason: impl ToString) -> PackageError {
    PackageError::Archive {
        path: archive.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Calls `visit` on every entry of a gzip-compressed tar (its data readable once).
fn tar_entries(archive: &Path, visit: &mut Visit<'_>) -> Result<(), PackageError> {
    let file = std::fs::File::open(archive).map_err(PackageError::io("open", archive))?;
    // Headers and padding on top of the content budget; more decompressed bytes are refused.
    let budget = MAX_PACKAGE_BYTES + 1024 * (MAX_PACKAGE_ENTRIES as u64 + 4);
    let gz = flate2::read::GzDecoder::new(BufReader::new(file)).take(budget);
    let mut tar = tar::Archive::new(gz);
    for entry in tar.entries().map_err(|e| bad(archive, e))? {
        let mut entry = entry.map_err(|e| bad(archive, e))?;
        let path = entry.path().map_err(|e| bad(archive, e))?.into_owned();
        let header = entry.header();
        let kind = match header.entry_type() {
            tar::EntryType::Directory => Kind::Dir,
            tar::EntryType::Regular | tar::EntryType::Continuous => Kind::File {
                size: header.size().map_err(|e| bad(archive, e))?,
                exec: header.mode().map_err(|e| bad(archive, e))? & 0o111 != 0,
            },
            tar::EntryType::Symlink => match entry.link_name().map_err(|e| bad(archive, e))? {
                Some(t) => Kind::Link(t.into_owned()),
                None => {
                    return Err(bad(
                        archive,
                        format!("{}: a link without a target", path.display()),
                    ));
                }
            },
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            other => {
                return Err(PackageError::unsafe_entry(
                    archive.join(&path),
                    format!(
                        "an entry of type {other:?} (only files, directories and symbolic links are installed)"
                    ),
                ));
            }
        };
        visit(&path, &kind, &mut entry)?;
    }
    Ok(())
}

/// Calls `visit` on every entry of a zip archive.
fn zip_entries(archive: &Path, visit: &mut Visit<'_>) -> Result<(), PackageError> {
    let file = std::fs::File::open(archive).map_err(PackageError::io("open", archive))?;
    let mut zip = zip::ZipArchive::new(BufReader::new(file)).map_err(|e| bad(archive, e))?;
    for i in 0..zip.len() {
        let mut f = zip.by_index(i).map_err(|e| bad(archive, e))?;
        let name = f.name().map_err(|e| bad(archive, e))?.into_owned();
        let path = PathBuf::from(name.trim_end_matches('/'));
        let mode = f.unix_mode().unwrap_or(0);
        let kind = if f.is_dir() {
            Kind::Dir
        } else if f.is_symlink() {
            let mut target = String::new();
            (&mut f)
                .take(4096)
                .read_to_string(&mut target)
                .map_err(|e| bad(archive, e))?;
            Kind::Link(PathBuf::from(target))
        } else if mode & 0o170000 == 0 || mode & 0o170000 == 0o100000 {
            Kind::File {
                size: f.size(),
                exec: mode & 0o111 != 0,
            }
        } else {
            return Err(PackageError::unsafe_entry(
                archive.join(&path),
                "a special file (only files, directories and symbolic links are installed)",
            ));
        };
        visit(&path, &kind, &mut f)?;
    }
    Ok(())
}

/// Writes one checked entry under `dest`; a file gets at most its declared size.
fn write(dest: &Path, rel: &Path, kind: &Kind, data: &mut dyn Read) -> Result<(), PackageError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dest.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(PackageError::io("create", parent))?;
    }
    match kind {
        Kind::Dir => std::fs::create_dir_all(&path).map_err(PackageError::io("create", &path)),
        Kind::Link(target) => std::os::unix::fs::symlink(target, &path)
            .map_err(PackageError::io("create the link", &path)),
        Kind::File { size, exec } => {
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(if *exec { 0o755 } else { 0o644 })
                .open(&path)
                .map_err(PackageError::io("create", &path))?;
            let n = std::io::copy(&mut data.take(*size), &mut out)
                .map_err(PackageError::io("write", &path))?;
            if n != *size {
                return Err(PackageError::unsafe_entry(
                    &path,
                    format!("declares {size} bytes but holds {n}"),
                ));
            }
            Ok(())
        }
    }
}
