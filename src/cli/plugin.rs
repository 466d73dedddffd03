//! `hermes-hooks plugin install|uninstall`: the Hermes plugin that forwards the agent's hook
//! events to the service (issue 49; `hermes_hooks.agent_plugin` of the client, declared in the
//! `hermes_agent.plugins` entry-point group as `hermes-hooks`). Hermes loads an entry-point
//! plugin only when its name is in `plugins.enabled` of `$HERMES_HOME/config.yaml`: install adds
//! it there, uninstall removes it, with the checked one-line edit of `dashboard install`. The
//! Hooks tab has an entry of its own (issue 58 row 10); one installed before, under this
//! plugin's name, is moved to its own by uninstall first, so removing one leaves the other on.

use std::path::Path;

use clap::Subcommand;

use crate::cli::dashboard::{PLUGIN, TAB, config_allowing, disable_in_config, enable_in_config};

/// `plugin install` or `plugin uninstall`.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Enable the Hermes plugin (plugins.enabled of $HERMES_HOME/config.yaml).
    Install,
    /// Remove hermes-hooks from plugins.enabled (the dashboard's Hooks tab, hermes-hooks-dashboard,
    /// stays).
    Uninstall,
}

/// Runs `plugin install|uninstall` against `$HERMES_HOME`; prints what was done.
pub fn plugin(command: PluginCommand) -> i32 {
    let home = crate::layout::hermes_home();
    crate::cli::dashboard::print_lines(match command {
        PluginCommand::Install => install(&home),
        PluginCommand::Uninstall => uninstall(&home),
    })
}

/// Adds the plugin to `plugins.enabled`; returns what it did, a line each.
pub fn install(home: &Path) -> Result<Vec<String>, String> {
    let (config, text) = config_allowing(home, PLUGIN)?;
    let mut out = vec![enable_in_config(&config, &text, PLUGIN)?];
    out.push(
        "Hermes loads it from the hermes-hooks client installed in its Python environment \
         (the wheel from `maturin build --release`, or `pip install ./clients/python`, there); restart `hermes gateway run`, and `hermes chat` \
         picks it up on its next start"
            .to_string(),
    );
    Ok(out)
}

/// Removes the plugin from `plugins.enabled`, after moving a Hooks tab that shared its entry to
/// an entry of its own; returns what it did, a line each.
pub fn uninstall(home: &Path) -> Result<Vec<String>, String> {
    let mut out = crate::cli::dashboard::move_shared_tab(home).unwrap_or_else(|e| {
        vec![format!(
            "the Hooks tab shared {PLUGIN} and could not be given its own entry ({e}): it is not \
             loaded either now"
        )]
    });
    out.push(disable_in_config(home, PLUGIN)?);
    if crate::cli::dashboard::is_enabled(home, TAB) {
        out.push(format!(
            "{TAB} stays in plugins.enabled: it is the dashboard's Hooks tab; `hermes-hooks \
             dashboard uninstall` removes it"
        ));
    }
    Ok(out)
}
