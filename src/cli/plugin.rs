//! `hermes-hooks plugin install|uninstall`: the Hermes plugin that forwards the agent's hook
//! events to the service (issue 49; `hermes_hooks.agent_plugin` of the client, declared in the
//! `hermes_agent.plugins` entry-point group as `hermes-hooks`). Hermes loads an entry-point
//! plugin only when its name is in `plugins.enabled` of `$HERMES_HOME/config.yaml`: install adds
//! it there, uninstall removes it, with the checked one-line edit of `dashboard install` (the
//! Hooks tab has the same name, so the one entry enables both).

use std::path::Path;

use clap::Subcommand;

use crate::cli::dashboard::{
    PLUGIN, config_allowing, enable_in_config, read_config, remove_enabled, write_checked,
};

/// `plugin install` or `plugin uninstall`.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Enable the Hermes plugin (plugins.enabled of $HERMES_HOME/config.yaml).
    Install,
    /// Remove hermes-hooks from plugins.enabled (the dashboard's Hooks tab goes with it).
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
    let (config, text) = config_allowing(home)?;
    let mut out = vec![enable_in_config(&config, &text)?];
    out.push(
        "Hermes loads it from the hermes-hooks client installed in its Python environment \
         (the wheel from `maturin build --release`, or `pip install ./clients/python`, there); restart `hermes gateway run`, and `hermes chat` \
         picks it up on its next start"
            .to_string(),
    );
    Ok(out)
}

/// Removes the plugin from `plugins.enabled`; returns what it did, a line each.
pub fn uninstall(home: &Path) -> Result<Vec<String>, String> {
    let config = home.join("config.yaml");
    let text = read_config(&config)?;
    Ok(match remove_enabled(&text) {
        None => vec![format!(
            "{PLUGIN} was not in plugins.enabled of {}",
            config.display()
        )],
        Some(new) => {
            write_checked(&config, &text, &new, false)?;
            vec![format!(
                "removed {PLUGIN} from plugins.enabled of {} (the dashboard's Hooks tab, if \
                 installed, is not loaded either now)",
                config.display()
            )]
        }
    })
}
