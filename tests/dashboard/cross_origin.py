"""A web page cannot drive the service (issue 46, row 6), in headless Chromium.

Run by .ci/dashboard.sh with the Python of the venv that holds Playwright:

    python tests/dashboard/cross_origin.py --bin target/debug/hermes-hooks --chromium /usr/bin/chromium

The service runs as the quick start runs it: `serve --listen 127.0.0.1:PORT`, no token, under
`--trust explicit`, with one hook (`pending`) that is not approved. A page served from another
origin (a second local HTTP server) then does what an attacker's page would:
- `fetch(..., {method: "POST", mode: "no-cors"})` on `/v1/hooks/pending/enable` and
  `/v1/reload` (a "simple" request: no body, no Content-Type, no preflight);
- the same with a `text/plain` body and with a typeless Blob on `/v1/events`;
- a `<form>` POST to `/v1/hooks/pending/enable`;
- the same requests to a name that resolves to 127.0.0.1 (`evil.example`, mapped with
  Chromium's --host-resolver-rules: what DNS rebinding gives a page).
Afterwards `pending` must still be unapproved and not loaded, and `observer` (approved,
`agent:*`) must have been given no event. Last, a request that carries everything a rebound page's own origin would
(`Host: evil.example:PORT`, the same `Origin`, a JSON Content-Type) is refused with 403.
"""

import argparse
import http.client
import http.server
import json
import os
import shutil
import subprocess
import tempfile
import threading

from playwright.sync_api import sync_playwright

from procs import free_port, stop, wait_for



def say(msg):
    print("cross_origin: %s" % msg, flush=True)






def api(port, method, path, headers=None, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        hdrs = {"Content-Type": "application/json"} if method == "POST" else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


ATTACK = """<!doctype html><html><body><form id="f" method="POST" target="sink"
action="http://%(target)s/v1/hooks/pending/enable"><input name="x" value="1"></form>
<iframe name="sink"></iframe><script>
async function attack(base) {
  const tries = [
    fetch(base + "/v1/hooks/pending/enable", {method: "POST", mode: "no-cors"}),
    fetch(base + "/v1/reload", {method: "POST", mode: "no-cors"}),
    fetch(base + "/v1/hooks/pending/enable", {method: "POST", mode: "no-cors", body: "{}"}),
    fetch(base + "/v1/events", {method: "POST", mode: "no-cors",
      body: new Blob([JSON.stringify({event: "agent:start", context: {}})])}),
    fetch(base + "/v1/events", {method: "POST", mode: "no-cors",
      body: JSON.stringify({event: "agent:start", context: {}})}),
  ];
  for (const t of tries) { try { await t; } catch (e) {} }
}
(async () => {
  await attack("http://%(target)s");
  await attack("http://%(rebound)s");
  document.getElementById("f").submit();
  setTimeout(() => { document.title = "done"; }, 1500);
})();
</script></body></html>"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--chromium", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="hermes-hooks-xorigin-")
    home = os.path.join(tmp, "home")
    hook = os.path.join(home, "hooks", "pending")
    os.makedirs(hook, mode=0o755)
    os.chmod(home, 0o700)
    with open(os.path.join(hook, "HOOK.yaml"), "w") as f:
        f.write("name: pending\nevents: [\"agent:start\"]\n")
    with open(os.path.join(hook, "handler.py"), "w") as f:
        f.write("def handle(event_type, context):\n    return None\n")
    observer = os.path.join(home, "hooks", "observer")
    os.makedirs(observer, mode=0o755)
    with open(os.path.join(observer, "HOOK.yaml"), "w") as f:
        f.write("name: observer\nevents: [\"agent:*\"]\n")
    with open(os.path.join(observer, "handler.py"), "w") as f:
        f.write("def handle(event_type, context):\n    return None\n")
    port = free_port()
    env = dict(os.environ, HERMES_HOME=home, HOME=tmp, NO_COLOR="1")
    env.pop("HERMES_HOOKS_TOKEN", None)
    subprocess.run([args.bin, "enable", "observer", "--trust", "explicit"], env=env, check=True,
                   capture_output=True, timeout=60)
    log = open(os.path.join(tmp, "service.log"), "w")
    service = subprocess.Popen([args.bin, "serve", "--trust", "explicit", "--listen",
                                "127.0.0.1:%d" % port], env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    page_port = free_port()
    page = ATTACK % {"target": "127.0.0.1:%d" % port, "rebound": "evil.example:%d" % port}

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            data = page.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    pages = http.server.ThreadingHTTPServer(("127.0.0.1", page_port), Page)
    threading.Thread(target=pages.serve_forever, daemon=True).start()
    try:
        def ready():
            try:
                return api(port, "GET", "/readyz")[0] == 200
            except OSError:
                return False
        wait_for("the service", ready)
        status, hooks = api(port, "GET", "/v1/hooks")
        assert status == 200, hooks
        skipped = {s.get("name"): s.get("code") for s in hooks.get("skipped", [])}
        assert skipped.get("pending") == "not_approved", skipped
        def accepted(hooks):
            return sum(h["counters"]["accepted"] for h in hooks.get("hooks", [])
                       if h["name"] == "observer")
        assert [h["name"] for h in hooks.get("hooks", [])] == ["observer"], hooks
        received_before = accepted(hooks)
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=args.chromium,
                args=["--headless", "--no-sandbox", "--disable-gpu",
                      "--host-resolver-rules=MAP evil.example 127.0.0.1"])
            tab = browser.new_page()
            tab.goto("http://127.0.0.1:%d/" % page_port)
            wait_for("the attack page to finish", lambda: tab.title() == "done")
            browser.close()
        status, hooks = api(port, "GET", "/v1/hooks")
        names = [h["name"] for h in hooks.get("hooks", [])]
        assert "pending" not in names, "a web page approved and loaded `pending`: %s" % names
        trust = os.path.join(home, "hooks-trust.json")
        if os.path.exists(trust):
            with open(trust) as f:
                assert "pending" not in json.load(f).get("hooks", {}), "pending was approved"
        assert accepted(hooks) == received_before, \
            "a web page's events were accepted: %s" % accepted(hooks)
        say("a page on another origin and a rebound name changed nothing")
        # What a rebound page's own origin sends: refused by its Host.
        rebound = "evil.example:%d" % port
        status, answer = api(port, "POST", "/v1/hooks/pending/enable",
                             {"Host": rebound, "Origin": "http://" + rebound}, b"{}")
        assert status == 403 and answer["error"]["code"] == "foreign_host", (status, answer)
        # And a foreign origin with everything else right: refused by its Origin.
        status, answer = api(port, "POST", "/v1/hooks/pending/enable",
                             {"Origin": "http://127.0.0.1:%d" % page_port}, b"{}")
        assert status == 403 and answer["error"]["code"] == "foreign_origin", (status, answer)
        say("ok")
    finally:
        pages.shutdown()
        stop(service)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
