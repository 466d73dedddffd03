//! What SOURCE names: the forms `hermes plugins install` accepts (an `owner/repo[/subdir]`
//! shorthand, git URLs of every scheme with an optional `#subdir`, a browser URL
//! `.../owner/repo/tree/REF/PATH`), a local directory, or a `.tar.gz`/`.zip` archive.
//! Shorthands are resolved against `$HERMES_HOOKS_GIT_BASE` (default `https://github.com/`).

use std::path::{Component, Path, PathBuf};

use crate::package::error::PackageError;

/// The variable naming the base URL `owner/repo` shorthands are resolved against.
pub const GIT_BASE_ENV: &str = "HERMES_HOOKS_GIT_BASE";

/// The default shorthand base.
pub const DEFAULT_GIT_BASE: &str = "https://github.com/";

/// Where a package comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A git repository: its URL, the directory inside it, the ref the SOURCE itself named
    /// (a browser URL's `tree/REF`).
    Git {
        /// What `git clone` is given.
        url: String,
        /// The package's directory inside the repository.
        subdir: Option<String>,
        /// A ref named by the SOURCE (`--ref` wins over it).
        reference: Option<String>,
    },
    /// A local directory (copied; used in place with `--link`).
    Dir(PathBuf),
    /// A local archive.
    Archive(PathBuf),
}

impl Origin {
    /// `git`, `dir`, `archive` (the lock file's `kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Origin::Git { .. } => "git",
            Origin::Dir(_) => "dir",
            Origin::Archive(_) => "archive",
        }
    }

    /// The warning Hermes gives for `http://` and `file://` repositories, if it applies.
    pub fn warning(&self) -> Option<String> {
        match self {
            Origin::Git { url, .. } if url.starts_with("http://") || url.starts_with("file://") => {
                Some(format!(
                    "warning: {url} uses an insecure or local URL scheme; consider https:// or git@ for production installs"
                ))
            }
            _ => None,
        }
    }
}

/// True for the file names of the archives that can be installed.
pub fn is_archive_name(path: &Path) -> bool {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    name.ends_with(".tar.gz") || name.ends_with(".tgz") || name.ends_with(".zip")
}

/// Parses SOURCE. A path that exists locally wins over a shorthand of the same spelling.
pub fn parse_source(text: &str) -> Result<Origin, PackageError> {
    let err = |reason: String| PackageError::Source {
        source_text: text.to_string(),
        reason,
    };
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(err("empty SOURCE".into()));
    }
    const SCHEMES: [&str; 6] = ["https://", "http://", "git@", "ssh://", "file://", "git://"];
    if SCHEMES.iter().any(|s| trimmed.starts_with(s)) {
        return parse_url(trimmed).map_err(err);
    }
    let path = Path::new(trimmed);
    if path.is_dir() {
        return Ok(Origin::Dir(path.to_path_buf()));
    }
    if path.is_file() {
        if is_archive_name(path) {
            return Ok(Origin::Archive(path.to_path_buf()));
        }
        return Err(err(
            "a file that is not a .tar.gz, .tgz or .zip archive".into()
        ));
    }
    let looks_local = trimmed.starts_with('/')
        || trimmed.starts_with("./")
        || trimmed.starts_with("../")
        || trimmed.starts_with('~')
        || is_archive_name(path);
    if looks_local {
        return Err(err("no such file or directory".into()));
    }
    shorthand(trimmed, &git_base()).map_err(err)
}

/// `$HERMES_HOOKS_GIT_BASE` with a trailing `/`, or [`DEFAULT_GIT_BASE`].
pub fn git_base() -> String {
    let mut base = std::env::var(GIT_BASE_ENV)
        .ok()
        .filter(|b| !b.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_GIT_BASE.to_string());
    if !base.ends_with('/') {
        base.push('/');
    }
    base
}

/// `owner/repo[/subdir...]` against `base`.
fn shorthand(text: &str, base: &str) -> Result<Origin, String> {
    let parts: Vec<&str> = text.split('/').filter(|p| !p.is_empty()).collect();
    if parts.len() < 2 || parts.iter().any(|p| *p == "." || *p == "..") {
        return Err(
            "not a directory, an archive, a git URL or an owner/repo[/subdir] shorthand".into(),
        );
    }
    let repo = parts[1].trim_end_matches(".git");
    let subdir = (parts.len() > 2).then(|| parts[2..].join("/"));
    Ok(Origin::Git {
        url: format!("{base}{}/{repo}.git", parts[0]),
        subdir: subdir.map(check_subdir).transpose()?,
        reference: None,
    })
}

/// A URL: a browser URL (`BASE/owner/repo/tree/REF[/PATH]`, BASE github.com or the shorthand
/// base), `URL#subdir`, or `URL.git/subdir`.
fn parse_url(text: &str) -> Result<Origin, String> {
    for base in [DEFAULT_GIT_BASE.to_string(), git_base()] {
        if let Some(rest) = text.strip_prefix(&base)
            && let Some(origin) = browser_url(&base, rest)?
        {
            return Ok(origin);
        }
    }
    let (url, subdir) = if let Some((url, frag)) = text.split_once('#') {
        (url.to_string(), Some(frag.trim_matches('/').to_string()))
    } else if let Some(i) = text.find(".git/") {
        let (url, rest) = text.split_at(i + 4);
        (url.to_string(), Some(rest.trim_matches('/').to_string()))
    } else {
        (text.to_string(), None)
    };
    let subdir = subdir.filter(|s| !s.is_empty()).map(check_subdir);
    Ok(Origin::Git {
        url,
        subdir: subdir.transpose()?,
        reference: None,
    })
}

/// `owner/repo/tree/REF[/PATH]` (also `blob`), or `None` when `rest` is not that shape.
fn browser_url(base: &str, rest: &str) -> Result<Option<Origin>, String> {
    let rest = rest.split(['?', '#']).next().unwrap_or("");
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    if parts.len() < 4 || !matches!(parts[2], "tree" | "blob") {
        return Ok(None);
    }
    let repo = parts[1].trim_end_matches(".git");
    let subdir = (parts.len() > 4).then(|| parts[4..].join("/"));
    Ok(Some(Origin::Git {
        url: format!("{base}{}/{repo}.git", parts[0]),
        subdir: subdir.map(check_subdir).transpose()?,
        reference: Some(parts[3].to_string()),
    }))
}

/// A subdirectory must stay inside the repository: relative, without `..`.
fn check_subdir(subdir: String) -> Result<String, String> {
    let ok = Path::new(&subdir)
        .components()
        .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if ok {
        Ok(subdir)
    } else {
        Err(format!(
            "the subdirectory {subdir:?} leaves the repository (absolute or with `..`)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(url: &str, subdir: Option<&str>, reference: Option<&str>) -> Origin {
        Origin::Git {
            url: url.into(),
            subdir: subdir.map(Into::into),
            reference: reference.map(Into::into),
        }
    }

    #[test]
    fn shorthands_and_urls() {
        let b = "https://github.com/";
        assert_eq!(
            shorthand("acme/hooks", b),
            Ok(git("https://github.com/acme/hooks.git", None, None))
        );
        assert_eq!(
            shorthand("acme/hooks/hooks/boot-md", b),
            Ok(git(
                "https://github.com/acme/hooks.git",
                Some("hooks/boot-md"),
                None
            ))
        );
        assert!(shorthand("acme", b).is_err());
        assert!(shorthand("acme/hooks/../x", b).is_err());
        assert_eq!(
            parse_url("https://github.com/acme/hooks/tree/v2/integrations/hermes"),
            Ok(git(
                "https://github.com/acme/hooks.git",
                Some("integrations/hermes"),
                Some("v2")
            ))
        );
        assert_eq!(
            parse_url("ssh://git@example.org/acme/hooks.git#hook"),
            Ok(git(
                "ssh://git@example.org/acme/hooks.git",
                Some("hook"),
                None
            ))
        );
        assert_eq!(
            parse_url("git@example.org:acme/hooks.git/hooks/a"),
            Ok(git("git@example.org:acme/hooks.git", Some("hooks/a"), None))
        );
        assert!(parse_url("file:///srv/r.git#../x").is_err());
        let warn = git("file:///srv/r.git", None, None).warning();
        assert!(warn.is_some_and(|w| w.contains("insecure or local")));
        assert_eq!(git("https://x/r.git", None, None).warning(), None);
    }
}
