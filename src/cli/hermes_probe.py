"""What `hermes-hooks doctor` asks the Python that runs `hermes` (issue 58 row 9).

Run as `PYTHON -c THIS [--reader]` with doctor's environment (so Hermes's HERMES_HOME): it
imports the plugin as Hermes would, looks for its entry point, and with `--reader` reads
`plugins.enabled` with Hermes's own reader (importing it makes Hermes's home folders when they
are missing, as any `hermes` command does: doctor asks only when config.yaml exists); prints one
JSON object. Loads no plugin and starts no service. Standard library only, Python 3.9+.
"""

import json
import sys

out = {"python": sys.executable, "version": sys.version.split()[0]}
try:
    import hermes_hooks.agent_plugin as plugin

    out["plugin"] = plugin.__file__
except Exception as exc:  # what Hermes would meet when it loads the plugin
    out["import_error"] = "%s: %s" % (type(exc).__name__, exc)
try:
    from importlib import metadata

    found = metadata.entry_points()
    if hasattr(found, "select"):
        group = found.select(group="hermes_agent.plugins")
    else:  # Python < 3.10
        group = found.get("hermes_agent.plugins", [])
    out["entry_points"] = {ep.name: ep.value for ep in group}
except Exception as exc:
    out["entry_points_error"] = "%s: %s" % (type(exc).__name__, exc)
try:
    if "--reader" not in sys.argv[1:]:
        raise RuntimeError("not asked: no config.yaml")
    from hermes_cli import plugins as hermes_plugins

    enabled = hermes_plugins._get_enabled_plugins()
    out["enabled"] = None if enabled is None else sorted(enabled)
    out["disabled"] = sorted(hermes_plugins._get_disabled_plugins() or ())
except Exception as exc:
    out["hermes_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(out))
