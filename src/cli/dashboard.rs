//! `hermes-hooks dashboard install|uninstall`: the Hooks tab of the Hermes dashboard. Install
//! writes the plugin (carried inside this binary; the same files are in the wheel under
//! `hermes_hooks/dashboard_plugin/`) into `$HERMES_HOME/plugins/hermes-hooks-dashboard/` and adds
//! its name to `plugins.enabled` of `$HERMES_HOME/config.yaml`, the list the dashboard loads user
//! plugins from; uninstall removes both. The config is edited as text, one list item, so the
//! rest of the file stays as it was (comments included); the edit is checked by parsing the file
//! before and after: nothing else may change, or nothing is written.
//!
//! The tab and the agent plugin (`plugin install`, [`PLUGIN`]) have an entry each (issue 58 row
//! 10): removing the tab never turns the agent's gates off. Before, both were `hermes-hooks`,
//! the tab in `plugins/hermes-hooks/`: [`install`] moves such a tab to its own name and leaves
//! the shared entry to the agent plugin, and `plugin uninstall` moves it before it removes that
//! entry.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use serde_json::Value;

use crate::cli::exit::fail;

/// The agent plugin's name (its `hermes_agent.plugins` entry point): its entry in
/// `plugins.enabled`, which the Hooks tab shared before issue 58.
pub const PLUGIN: &str = "hermes-hooks";

/// The Hooks tab's name (its manifest's `name`, the API's `/api/plugins/NAME/`): its directory
/// under `plugins/` and its entry in `plugins.enabled`.
pub const TAB: &str = "hermes-hooks-dashboard";

/// The plugin's files, relative to `plugins/hermes-hooks-dashboard/`.
const FILES: &[(&str, &str)] = &[
    (
        "dashboard/manifest.json",
        include_str!("../../clients/python/hermes_hooks/dashboard_plugin/manifest.json"),
    ),
    (
        "dashboard/dist/index.js",
        include_str!("../../clients/python/hermes_hooks/dashboard_plugin/dist/index.js"),
    ),
    (
        "dashboard/dist/style.css",
        include_str!("../../clients/python/hermes_hooks/dashboard_plugin/dist/style.css"),
    ),
    (
        "dashboard/plugin_api.py",
        include_str!("../../clients/python/hermes_hooks/dashboard_plugin/plugin_api.py"),
    ),
];

/// `dashboard install` or `dashboard uninstall`.
#[derive(Debug, Subcommand)]
pub enum DashboardCommand {
    /// Write the Hooks tab into $HERMES_HOME/plugins/hermes-hooks-dashboard and enable it in
    /// config.yaml.
    Install,
    /// Remove the Hooks tab and its entry in plugins.enabled of config.yaml (the agent plugin's
    /// entry, hermes-hooks, stays).
    Uninstall,
}

/// Runs `dashboard install|uninstall` against `$HERMES_HOME`; prints what was done.
pub fn dashboard(command: DashboardCommand) -> i32 {
    let home = crate::layout::hermes_home();
    print_lines(match command {
        DashboardCommand::Install => install(&home),
        DashboardCommand::Uninstall => uninstall(&home),
    })
}

/// The exit code of an install or uninstall: its lines printed (0), or its error (1).
pub(crate) fn print_lines(result: Result<Vec<String>, String>) -> i32 {
    match result {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            0
        }
        Err(e) => fail(e),
    }
}

/// `$HERMES_HOME/config.yaml` and its text, unless it lists the plugin `name` under
/// `plugins.disabled` (the operator's choice, which install does not override).
pub(crate) fn config_allowing(home: &Path, name: &str) -> Result<(PathBuf, String), String> {
    let config = home.join("config.yaml");
    let text = read_config(&config)?;
    if list_of(&parse(&config, &text)?, "disabled")
        .iter()
        .any(|p| p == name)
    {
        return Err(format!(
            "{name} is in plugins.disabled of {}: remove it there (or run `hermes plugins enable {name}`), then install again",
            config.display()
        ));
    }
    Ok((config, text))
}

/// Adds `name` to `plugins.enabled` of `config` (whose text is `text`); says what it did.
pub(crate) fn enable_in_config(config: &Path, text: &str, name: &str) -> Result<String, String> {
    Ok(match add_enabled(text, name) {
        None => format!(
            "{name} was already in plugins.enabled of {}",
            config.display()
        ),
        Some(new) => {
            write_checked(config, text, &new, name, true)?;
            format!("added {name} to plugins.enabled of {}", config.display())
        }
    })
}

/// Removes `name` from `plugins.enabled` of `$HERMES_HOME/config.yaml`; says what it did.
pub(crate) fn disable_in_config(home: &Path, name: &str) -> Result<String, String> {
    let config = home.join("config.yaml");
    let text = read_config(&config)?;
    Ok(match remove_enabled(&text, name) {
        None => format!("{name} was not in plugins.enabled of {}", config.display()),
        Some(new) => {
            write_checked(&config, &text, &new, name, false)?;
            format!(
                "removed {name} from plugins.enabled of {}",
                config.display()
            )
        }
    })
}

/// Whether `plugins.enabled` of `$HERMES_HOME/config.yaml` lists `name` (false when unreadable).
pub(crate) fn is_enabled(home: &Path, name: &str) -> bool {
    let config = home.join("config.yaml");
    read_config(&config)
        .and_then(|t| parse(&config, &t))
        .is_ok_and(|v| list_of(&v, "enabled").iter().any(|p| p == name))
}

fn plugin_dir(home: &Path) -> PathBuf {
    home.join("plugins").join(TAB)
}

/// Where a Hooks tab written before issue 58 is, under the agent plugin's shared name.
fn shared_dir(home: &Path) -> PathBuf {
    home.join("plugins").join(PLUGIN)
}

/// Removes the Hooks tab in `dir` (when its manifest is there); says what it did.
fn remove_tab(dir: &Path) -> Result<Option<String>, String> {
    if !dir.join("dashboard/manifest.json").is_file() {
        return Ok(None);
    }
    std::fs::remove_dir_all(dir).map_err(|e| format!("cannot remove {}: {e}", dir.display()))?;
    Ok(Some(format!("removed {}", dir.display())))
}

/// The line saying that the agent plugin's entry stays, when it is there.
fn agent_entry_stays(home: &Path) -> Option<String> {
    is_enabled(home, PLUGIN).then(|| {
        format!(
            "{PLUGIN} stays in plugins.enabled: it is the agent plugin's entry (the agent's events, \
             pre_tool_call gates); `hermes-hooks plugin uninstall` removes it"
        )
    })
}

/// Writes the plugin and enables it, moving a tab installed under the shared name to its own;
/// what it did, a line each, and whether it moved one.
fn write_tab(home: &Path) -> Result<(Vec<String>, bool), String> {
    let (config, text) = config_allowing(home, TAB)?;
    let dir = plugin_dir(home);
    for (rel, content) in FILES {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        crate::atomic::write(&path, content.as_bytes(), 0o644).map_err(|e| e.to_string())?;
    }
    let mut out = vec![format!("wrote the Hooks tab into {}", dir.display())];
    let moved = remove_tab(&shared_dir(home))?;
    out.extend(moved.iter().map(|line| {
        format!("{line}: the Hooks tab installed there shared {PLUGIN} with the agent plugin")
    }));
    out.push(enable_in_config(&config, &text, TAB)?);
    Ok((out, moved.is_some()))
}

const RESTART: &str = "restart `hermes dashboard` to see the Hooks tab";

/// Writes the plugin and enables it (moving a tab installed under the shared name to its own);
/// returns what it did, a line each.
pub fn install(home: &Path) -> Result<Vec<String>, String> {
    let (mut out, moved) = write_tab(home)?;
    if moved {
        out.extend(agent_entry_stays(home));
    }
    out.push(RESTART.to_string());
    Ok(out)
}

/// Gives a Hooks tab installed under the agent plugin's name an entry of its own (before that
/// entry is removed); what it did, a line each (none without such a tab).
pub(crate) fn move_shared_tab(home: &Path) -> Result<Vec<String>, String> {
    if !shared_dir(home).join("dashboard/manifest.json").is_file() {
        return Ok(Vec::new());
    }
    let (mut out, _) = write_tab(home)?;
    out.push(RESTART.to_string());
    Ok(out)
}

/// Removes the plugin and its `plugins.enabled` entry, never the agent plugin's; returns what it
/// did, a line each.
pub fn uninstall(home: &Path) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let removed = [
        remove_tab(&plugin_dir(home))?,
        remove_tab(&shared_dir(home))?,
    ];
    if removed.iter().all(Option::is_none) {
        out.push(format!("no Hooks tab in {}", plugin_dir(home).display()));
    }
    out.extend(removed.into_iter().flatten());
    out.push(disable_in_config(home, TAB)?);
    out.extend(agent_entry_stays(home));
    Ok(out)
}

pub(crate) fn read_config(path: &Path) -> Result<String, String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

pub(crate) fn parse(path: &Path, text: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Ok(Value::Null);
    }
    serde_saphyr::from_str::<Value>(text).map_err(|e| {
        format!(
            "{} is not YAML this can edit ({e}); fix it, or edit plugins.enabled by hand",
            path.display()
        )
    })
}

/// `plugins.<key>` as a list of strings (empty when absent or not a list).
pub(crate) fn list_of(config: &Value, key: &str) -> Vec<String> {
    config
        .get("plugins")
        .and_then(|p| p.get(key))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `new` over `path` after checking that it says what `old` says with `name` added to (or
/// removed from) `plugins.enabled`, and nothing else changed.
pub(crate) fn write_checked(
    path: &Path,
    old: &str,
    new: &str,
    name: &str,
    add: bool,
) -> Result<(), String> {
    let mut expected = parse(path, old)?;
    if !expected.is_object() {
        expected = Value::Object(Default::default());
    }
    let plugins = expected.as_object_mut().map(|o| {
        o.entry("plugins")
            .or_insert_with(|| Value::Object(Default::default()))
    });
    if let Some(p) = plugins {
        if p.is_null() {
            *p = Value::Object(Default::default());
        }
        if let Some(p) = p.as_object_mut() {
            let list = p
                .entry("enabled")
                .or_insert_with(|| Value::Array(Vec::new()));
            if list.is_null() {
                *list = Value::Array(Vec::new());
            }
            if let Some(items) = list.as_array_mut() {
                if add {
                    items.push(Value::String(name.into()));
                } else {
                    items.retain(|v| v.as_str() != Some(name));
                }
            }
        }
    }
    let got = parse(path, new)?;
    if got != expected {
        return Err(format!(
            "cannot {} {name} in plugins.enabled of {} by editing one line; edit it by hand",
            if add { "add" } else { "remove" },
            path.display()
        ));
    }
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o600);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    crate::atomic::write(path, new.as_bytes(), mode).map_err(|e| e.to_string())
}

/// Indentation of a line (spaces).
fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

/// True for a line that holds no YAML (blank or a comment).
fn is_blank(line: &str) -> bool {
    let t = line.trim();
    t.is_empty() || t.starts_with('#')
}

/// The value after `key:` on `line` at indentation `at`, comment removed, if the line is that key.
fn key_value<'a>(line: &'a str, at: usize, key: &str) -> Option<&'a str> {
    if indent(line) != at {
        return None;
    }
    let rest = line.trim_start().strip_prefix(key)?.strip_prefix(':')?;
    if !(rest.is_empty() || rest.starts_with([' ', '\t'])) {
        return None;
    }
    Some(rest.split(" #").next().unwrap_or("").trim())
}

/// Where `plugins.enabled` is: the line index of `plugins:`, the end of its block, the child
/// indentation, and the `enabled:` line with its value.
struct Place<'a> {
    plugins: Option<usize>,
    end: usize,
    child: usize,
    enabled: Option<(usize, &'a str)>,
}

fn locate<'a>(lines: &[&'a str]) -> Place<'a> {
    let mut place = Place {
        plugins: None,
        end: lines.len(),
        child: 2,
        enabled: None,
    };
    let Some(start) = lines
        .iter()
        .position(|l| key_value(l, 0, "plugins") == Some(""))
    else {
        return place;
    };
    place.plugins = Some(start);
    let end = (start + 1..lines.len())
        .find(|&i| !is_blank(lines[i]) && indent(lines[i]) == 0)
        .unwrap_or(lines.len());
    place.end = end;
    if let Some(first) = (start + 1..end).find(|&i| !is_blank(lines[i])) {
        place.child = indent(lines[first]);
    }
    place.enabled =
        (start + 1..end).find_map(|i| key_value(lines[i], place.child, "enabled").map(|v| (i, v)));
    place
}

/// The block-list items (`- x`) after line `at`, until the block ends: (line index, item text).
fn block_items(lines: &[&str], at: usize, end: usize, child: usize) -> Vec<(usize, String)> {
    let mut items = Vec::new();
    for (i, line) in lines.iter().enumerate().take(end).skip(at + 1) {
        if is_blank(line) {
            continue;
        }
        let t = line.trim_start();
        if indent(line) < child || !t.starts_with('-') {
            if indent(line) <= child && !t.starts_with('-') {
                break;
            }
            continue;
        }
        items.push((i, unquote(t.trim_start_matches('-'))));
    }
    items
}

fn unquote(item: &str) -> String {
    let t = item.split(" #").next().unwrap_or("").trim();
    t.trim_matches(|c| c == '"' || c == '\'').to_string()
}

fn joined(lines: &[String], trailing_newline: bool) -> String {
    let mut s = lines.join("\n");
    if trailing_newline || !s.is_empty() {
        s.push('\n');
    }
    s
}

/// The config with `name` added to `plugins.enabled`, or None when it is there already.
pub(crate) fn add_enabled(text: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let place = locate(&lines);
    let pad = " ".repeat(place.child);
    match (place.plugins, place.enabled) {
        (None, _) => {
            while out.last().is_some_and(|l| l.trim().is_empty()) {
                out.pop();
            }
            out.push("plugins:".into());
            out.push(format!("{pad}enabled:"));
            out.push(format!("{pad}- {name}"));
        }
        (Some(p), None) => {
            out.insert(p + 1, format!("{pad}enabled:"));
            out.insert(p + 2, format!("{pad}- {name}"));
        }
        (Some(_), Some((at, value))) if value.starts_with('[') => {
            let inner = value.trim_start_matches('[').trim_end_matches(']').trim();
            if inner.split(',').any(|i| unquote(i) == name) {
                return None;
            }
            let list = if inner.is_empty() {
                format!("[{name}]")
            } else {
                format!("[{inner}, {name}]")
            };
            out[at] = format!("{pad}enabled: {list}");
        }
        (Some(_), Some((at, _))) => {
            let items = block_items(&lines, at, place.end, place.child);
            if items.iter().any(|(_, i)| i == name) {
                return None;
            }
            let (after, item_pad) = match items.last() {
                Some((i, _)) => (*i, indent(lines[*i])),
                None => (at, place.child + 2),
            };
            out[at] = format!("{pad}enabled:");
            out.insert(after + 1, format!("{}- {name}", " ".repeat(item_pad)));
        }
    }
    Some(joined(&out, true))
}

/// The config with `name` removed from `plugins.enabled`, or None when it is not there.
pub(crate) fn remove_enabled(text: &str, name: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    let place = locate(&lines);
    let (at, value) = place.enabled?;
    if value.starts_with('[') {
        let inner = value.trim_start_matches('[').trim_end_matches(']');
        let kept: Vec<&str> = inner
            .split(',')
            .map(str::trim)
            .filter(|i| !i.is_empty())
            .collect();
        if !kept.iter().any(|i| unquote(i) == name) {
            return None;
        }
        let kept: Vec<&str> = kept.into_iter().filter(|i| unquote(i) != name).collect();
        out[at] = format!("{}enabled: [{}]", " ".repeat(place.child), kept.join(", "));
    } else {
        let items = block_items(&lines, at, place.end, place.child);
        let (i, _) = items.iter().find(|(_, i)| i == name)?;
        out.remove(*i);
        if items.len() == 1 {
            // The list is empty now: say so, rather than leave `enabled:` null.
            out[at] = format!("{}enabled: []", " ".repeat(place.child));
        }
    }
    Some(joined(&out, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_to_every_shape_and_keeps_the_rest() {
        let cases = [
            ("", "plugins:\n  enabled:\n  - hermes-hooks\n"),
            (
                "# mine\nmodel: x\n",
                "# mine\nmodel: x\nplugins:\n  enabled:\n  - hermes-hooks\n",
            ),
            (
                "plugins:\n  disabled: [a]\nz: 1\n",
                "plugins:\n  enabled:\n  - hermes-hooks\n  disabled: [a]\nz: 1\n",
            ),
            (
                "plugins:\n  enabled: [a, 'b']  # two\n",
                "plugins:\n  enabled: [a, 'b', hermes-hooks]\n",
            ),
            (
                "plugins:\n    enabled:\n      - a # one\n    other: 2\n",
                "plugins:\n    enabled:\n      - a # one\n      - hermes-hooks\n    other: 2\n",
            ),
            (
                "plugins:\n  enabled:\n  other: 2\n",
                "plugins:\n  enabled:\n    - hermes-hooks\n  other: 2\n",
            ),
        ];
        for (before, after) in cases {
            let got = add_enabled(before, PLUGIN).unwrap_or_default();
            assert_eq!(got, after, "adding to {before:?}");
            assert_eq!(
                add_enabled(&got, PLUGIN),
                None,
                "adding twice to {before:?}"
            );
            assert_eq!(remove_enabled(&got, TAB), None, "{TAB} is another entry");
            let back = remove_enabled(&got, PLUGIN).unwrap_or_default();
            assert!(
                !back.contains(PLUGIN),
                "removing from {got:?} left {back:?}"
            );
        }
    }
}
