"""Baseline for the benchmarks: the ORIGINAL in-gateway hook host, re-created (stdlib only).

The gateway's HookRegistry discovers $HERMES_HOME/hooks/*/HOOK.yaml + handler.py, imports each
handler, and `emit` awaits every matching handler inline, in sequence, on the gateway's own event
loop. Whatever the handlers do is therefore time the gateway spends inside `await hooks.emit(...)`.
This script rebuilds that class faithfully (discovery, exact-then-`ns:*` resolution, sync/async
handlers, errors caught and printed; PyYAML replaced by a minimal HOOK.yaml reader), writes generated
hook directories to a temporary root, and measures the per-emit time the gateway would see:

  trivial_10      10 hooks whose handler is `async def handle(e, c): return None`
  one_slow_200ms  10 hooks, one of which awaits asyncio.sleep(0.2)
  ten_sleep_50ms  10 hooks that each await asyncio.sleep(0.05)

Usage: python3 benches/baseline_host.py [--json] [--quick]
Prints one JSON object on stdout; without --json a readable summary also goes to stderr.
"""
import argparse
import asyncio
import importlib.util
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path


def read_hook_yaml(text):
    """The HOOK.yaml subset the original hooks use: `key: scalar`, `key: [a, b]`, `key:` + `- item`."""
    data, last_key = {}, None
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.lstrip().startswith("- ") and last_key is not None:
            data.setdefault(last_key, []).append(line.lstrip()[2:].strip().strip("\"'"))
            continue
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if value.startswith("[") and value.endswith("]"):
            data[key] = [v.strip().strip("\"'") for v in value[1:-1].split(",") if v.strip()]
        elif value:
            data[key] = value.strip("\"'")
        last_key = key
    return data


class HookRegistry:
    """The original host: discover_and_load(), emit(), emit_collect(); handlers run inline."""

    def __init__(self, hooks_dir):
        self.hooks_dir = Path(hooks_dir)
        self._handlers = {}  # event pattern -> [handle, ...]
        self._loaded_hooks = []

    @property
    def loaded_hooks(self):
        return list(self._loaded_hooks)

    def discover_and_load(self):
        if not self.hooks_dir.exists():
            return
        for hook_dir in sorted(self.hooks_dir.iterdir()):
            manifest_path, handler_path = hook_dir / "HOOK.yaml", hook_dir / "handler.py"
            if not hook_dir.is_dir() or not manifest_path.exists() or not handler_path.exists():
                continue
            try:
                manifest = read_hook_yaml(manifest_path.read_text(encoding="utf-8"))
                hook_name = manifest.get("name", hook_dir.name)
                events = manifest.get("events", [])
                if not events:
                    print("[hooks] Skipping %s: no events declared" % hook_name, flush=True)
                    continue
                module_name = "hermes_hook_%s" % hook_name
                spec = importlib.util.spec_from_file_location(module_name, handler_path)
                module = importlib.util.module_from_spec(spec)
                sys.modules[module_name] = module
                try:
                    spec.loader.exec_module(module)
                except Exception:
                    sys.modules.pop(module_name, None)
                    raise
                handle_fn = getattr(module, "handle", None)
                if handle_fn is None:
                    print("[hooks] Skipping %s: no 'handle' function found" % hook_name, flush=True)
                    continue
                for event in events:
                    self._handlers.setdefault(event, []).append(handle_fn)
                self._loaded_hooks.append({"name": hook_name, "events": events, "path": str(hook_dir)})
            except Exception as e:
                print("[hooks] Error loading hook %s: %s" % (hook_dir.name, e), flush=True)

    def _resolve_handlers(self, event_type):
        handlers = list(self._handlers.get(event_type, []))
        if ":" in event_type:
            handlers.extend(self._handlers.get(event_type.split(":")[0] + ":*", []))
        return handlers

    async def emit(self, event_type, context=None):
        if context is None:
            context = {}
        for fn in self._resolve_handlers(event_type):
            try:
                result = fn(event_type, context)
                if asyncio.iscoroutine(result):
                    await result
            except Exception as e:
                print("[hooks] Error in handler for '%s': %s" % (event_type, e), flush=True)

    async def emit_collect(self, event_type, context=None):
        if context is None:
            context = {}
        results = []
        for fn in self._resolve_handlers(event_type):
            try:
                result = fn(event_type, context)
                if asyncio.iscoroutine(result):
                    result = await result
                if result is not None:
                    results.append(result)
            except Exception as e:
                print("[hooks] Error in handler for '%s': %s" % (event_type, e), flush=True)
        return results


TRIVIAL = "async def handle(event_type, context):\n    return None\n"
SLEEPER = "import asyncio\n\nasync def handle(event_type, context):\n    await asyncio.sleep(%r)\n"
CONTEXT = {"platform": "telegram", "user_id": "42", "chat_id": "42", "thread_id": "", "chat_type": "dm",
           "session_id": "s-1", "message": "hello " * 20}


def write_hooks(root, sources):
    """One hook directory per handler source, all subscribed to agent:start."""
    for i, source in enumerate(sources):
        d = Path(root) / ("hook-%02d" % i)
        d.mkdir(parents=True)
        (d / "HOOK.yaml").write_text("name: bench-%s-%02d\nevents: [\"agent:start\"]\n" % (Path(root).name, i))
        (d / "handler.py").write_text(source)


def percentile(sorted_values, p):
    """Nearest-rank percentile."""
    return sorted_values[max(0, math.ceil(p / 100.0 * len(sorted_values)) - 1)]


async def measure(registry, n, warmup):
    for _ in range(warmup):
        await registry.emit("agent:start", CONTEXT)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await registry.emit("agent:start", CONTEXT)
        samples.append(time.perf_counter_ns() - t0)
    return sorted(samples)


def run_case(root, name, sources, n, warmup, unit):
    case_root = Path(root) / name
    write_hooks(case_root, sources)
    registry = HookRegistry(case_root)
    registry.discover_and_load()
    assert len(registry.loaded_hooks) == len(sources), registry.loaded_hooks
    loop = asyncio.new_event_loop()
    try:
        samples = loop.run_until_complete(measure(registry, n, warmup))
    finally:
        loop.close()
    scale, suffix = (1e3, "us") if unit == "us" else (1e6, "ms")
    return {"p50_" + suffix: round(percentile(samples, 50) / scale, 3),
            "p99_" + suffix: round(percentile(samples, 99) / scale, 3),
            "n": n}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON object")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    args = ap.parse_args()
    n_trivial, n_slow, warmup = (2000, 5, 200) if args.quick else (10000, 20, 1000)
    with tempfile.TemporaryDirectory(prefix="hermes-baseline-") as root:
        out = {
            "trivial_10": run_case(root, "trivial", [TRIVIAL] * 10, n_trivial, warmup, "us"),
            "one_slow_200ms": run_case(root, "oneslow", [SLEEPER % 0.2] + [TRIVIAL] * 9, n_slow, 1, "ms"),
            "ten_sleep_50ms": run_case(root, "tensleep", [SLEEPER % 0.05] * 10, n_slow, 1, "ms"),
        }
    if not args.json:
        sys.stderr.write("original HookRegistry, Python %s: time the gateway spends in `await emit()`\n"
                         % platform.python_version())
        for name, r in out.items():
            sys.stderr.write("  %-15s %s\n" % (name, "  ".join("%s=%s" % kv for kv in r.items())))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
