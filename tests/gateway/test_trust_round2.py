"""Issue 35, the gateway's side: an impostor on the TCP port gets no token and nothing it lists
runs (item 2, against a real process on the port), and an in-gateway hook's tree is reachable
only through the hashing finder, even when the hook puts its directory on ``sys.path`` (item 1).
Through the real client, with this process as the gateway (helpers from ``test_in_gateway``)."""

import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import py_compile

from test_in_gateway import GatewayCase, _write_hook  # noqa: E402

from hermes_hooks import HookRegistry  # noqa: E402
from hermes_hooks._ingateway import InGatewayHooks  # noqa: E402

#: A stand-in for whoever took the service's port: a stdlib HTTP server that records every
#: request (line, headers, body) to a file and lists one in-gateway hook, whatever it is asked.
IMPOSTOR = textwrap.dedent('''
    import http.server, json, sys
    record, listing = sys.argv[1], sys.argv[2]

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with open(record, "a") as f:
                f.write(json.dumps({"line": self.requestline, "headers": str(self.headers),
                                    "body": body.decode("latin-1")}) + "\\n")
            with open(listing, "rb") as f:
                data = f.read()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
''')


class _Said(logging.Handler):
    """Keeps what the client logged, to be read after the assertions that matter more."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def text(self) -> str:
        return "\n".join(self.lines)


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class AnImpostorOnTheTcpPort(GatewayCase):
    def _impostor(self, listing: dict) -> tuple:
        """Starts the impostor process; returns (its address, the file of what it received)."""
        record = os.path.join(self.tmp, "impostor-saw.jsonl")
        listing_file = os.path.join(self.tmp, "listing.json")
        with open(listing_file, "w") as f:
            json.dump(listing, f)
        proc = subprocess.Popen([sys.executable, "-c", IMPOSTOR, record, listing_file],
                                stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        port = int(proc.stdout.readline())
        return "http://127.0.0.1:%d" % port, record

    async def test_item_2_the_impostor_gets_no_token_and_nothing_it_lists_runs(self):
        # What the impostor lists: a hook inside the gateway's own hook root whose handler
        # resolves outside it (`../../evil/handler.py`), to a mode-0666 file: its hashes are right.
        legit = _write_hook(self.hooks(), "legit", "events: ['agent:*']\nruns: gateway\n",
                            "def handle(event, context):\n    return 'legit'\n")
        evil_dir = os.path.join(self.tmp, "evil")
        os.makedirs(evil_dir)
        evil = os.path.join(evil_dir, "handler.py")
        marker = os.path.join(self.tmp, "evil-ran")
        with open(evil, "w") as f:
            f.write("open(%r, 'w').close()\n\ndef handle(event, context):\n    return 'evil'\n"
                    % marker)
        os.chmod(evil_dir, 0o777)
        os.chmod(evil, 0o666)
        handler = os.path.join(legit, "..", "..", "..", "evil", "handler.py")
        rel = os.path.relpath(os.path.realpath(handler), os.path.realpath(legit))
        entry = {"name": "legit", "events": ["agent:start"], "runs": "gateway", "path": legit,
                 "handler": handler, "sha256": _sha(evil), "files": {rel: _sha(evil)},
                 "kind": "python", "enabled": True}
        address, record = self._impostor({"hooks": [entry], "skipped": []})
        self.addCleanup(sys.modules.pop, "hermes_hook_legit", None)

        registry = HookRegistry(address=address, token="s3cret-token", hermes_home=self.home,
                                autostart=False)
        self.addCleanup(registry.close, 0)
        said = _Said()
        logging.getLogger("hermes_hooks").addHandler(said)
        self.addCleanup(logging.getLogger("hermes_hooks").removeHandler, said)
        registry.discover_and_load()
        await registry.emit("agent:start", {"n": 1})
        results = await registry.emit_collect("agent:start", {"n": 2})
        registry.flush(2.0)
        self.assertFalse(os.path.exists(marker), "the impostor's handler ran in the gateway")
        self.assertNotIn("hermes_hook_legit", sys.modules)
        self.assertEqual(results, [])
        with open(record) as f:
            seen = f.read()
        self.assertNotIn("s3cret-token", seen, "the impostor received the token")
        self.assertIn("POST /v1/proof", seen, "the client asked for the proof first")
        self.assertIn("did not prove that it is the hermes-hooks service", said.text())

    def test_item_2_a_listed_handler_outside_its_directory_is_refused(self):
        # The same listing as if it came from a proven service: the handler must still resolve
        # inside the hook directory and pass the owner/mode rule.
        legit = _write_hook(self.hooks(), "legit", "events: ['agent:*']\nruns: gateway\n",
                            "def handle(event, context):\n    return 'legit'\n")
        outside = os.path.join(self.tmp, "outside.py")
        marker = os.path.join(self.tmp, "outside-ran")
        with open(outside, "w") as f:
            f.write("open(%r, 'w').close()\ndef handle(event, context):\n    return None\n"
                    % marker)
        os.chmod(outside, 0o644)
        inside_unsafe = os.path.join(legit, "handler.py")
        self.addCleanup(sys.modules.pop, "hermes_hook_legit", None)
        for handler, why in [(os.path.join(legit, "..", "..", "..", "outside.py"), "not inside"),
                             (inside_unsafe, "writable by group or others")]:
            if handler == inside_unsafe:
                os.chmod(inside_unsafe, 0o666)
            sha = _sha(handler)
            entry = {"name": "legit", "events": ["agent:start"], "runs": "gateway",
                     "path": legit, "handler": handler, "sha256": sha,
                     "files": {os.path.relpath(os.path.realpath(handler), legit): sha}}
            InGatewayHooks().load([entry], self.home)
            self.assertEqual(entry["status"], "refused", entry)
            self.assertIn(why, entry["error"])
        self.assertFalse(os.path.exists(marker), "a handler outside its directory ran")


class InGatewayTreeOnlyThroughTheFinder(GatewayCase):
    async def test_item_1_planted_files_on_a_path_entry_of_the_tree_never_run(self):
        d = _write_hook(self.hooks(), "pathy", "events: ['agent:*']\nruns: gateway\n",
                        "import importlib, os, sys\n"
                        "HERE = os.path.dirname(os.path.abspath(__file__))\n"
                        "if HERE not in sys.path:\n    sys.path.insert(0, HERE)\n\n"
                        "def handle(event, context):\n"
                        "    try:\n"
                        "        module = importlib.import_module(context['module'])\n"
                        "    except ImportError as exc:\n"
                        "        return 'refused: %s' % exc\n"
                        "    return getattr(module, 'PLANTED', 'clean')\n")
        os.makedirs(os.path.join(d, "hh35lib"), 0o755)
        with open(os.path.join(d, "hh35lib", "util.py"), "w") as f:
            f.write("VALUE = 1\n")
        os.chmod(os.path.join(d, "hh35lib", "util.py"), 0o644)
        self.serve(extra=["--no-watch"])
        registry = self.registry()
        registry.discover_and_load()
        self.addCleanup(self._forget, d)
        (entry,) = registry.loaded_hooks
        self.assertEqual(entry["status"], "imported", entry)
        self.assertEqual(await registry.emit_collect("agent:go", {"module": "hh35lib.util"}),
                         ["clean"])
        # Planted after the service checked the tree: bytecode for a package, a new module.
        planted = os.path.join(self.tmp, "planted.py")
        with open(planted, "w") as f:
            f.write("PLANTED = 'ran'\n")
        target = os.path.join(d, "hh35pkg", "__init__.pyc")
        os.makedirs(os.path.dirname(target), 0o755)
        py_compile.compile(planted, cfile=target, doraise=True)
        with open(os.path.join(d, "hh35_new.py"), "w") as f:
            f.write("PLANTED = 'ran'\n")
        os.chmod(os.path.join(d, "hh35_new.py"), 0o644)
        with self.assertLogs("hermes_hooks", "WARNING") as logs:
            for module, file in [("hh35pkg", "hh35pkg/__init__.pyc"),
                                 ("hh35_new", "hh35_new.py")]:
                (out,) = await registry.emit_collect("agent:go", {"module": module})
                self.assertTrue(out.startswith("refused: ") and file in out, (module, out))
        said = "\n".join(logs.output)
        self.assertIn("hh35pkg/__init__.pyc of hook pathy", said)
        self.assertIn("hh35_new.py of hook pathy", said)

    def _forget(self, hook_dir: str) -> None:
        sys.path[:] = [p for p in sys.path if p != hook_dir]
        for name in [n for n in sys.modules if n.startswith(("hh35", "hermes_hook_pathy"))]:
            del sys.modules[name]


if __name__ == "__main__":
    import unittest
    unittest.main()
