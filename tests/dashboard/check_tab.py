"""The Hooks tab in the real Hermes dashboard, in headless Chromium (issue 39).

Run by .ci/dashboard.sh with the Python of a venv holding hermes-agent (pinned) and Playwright:

    python tests/dashboard/check_tab.py --bin target/debug/hermes-hooks --hermes VENV/bin/hermes \
        --chromium /usr/bin/chromium --out DIR [--docs-image docs/dashboard-hooks.png]

A temporary $HERMES_HOME gets four hooks: `greeter` (approved, works), `flaky` (approved,
raises), `pending` (not approved: refused under --trust explicit) and `broken` (a HOOK.yaml
that does not parse). The service runs with --trust explicit and --no-watch (so only a reload
picks up a change), `hermes-hooks dashboard install` writes the plugin and enables it in a
config.yaml that already has settings of its own, and `hermes dashboard` serves it. Then, in the
browser: the tab is listed, every hook and its state render, the refused hooks show their
reason, the review shows the files and hashes an approval covers, an approve click and a reload
click take effect on the service (asked through its own API), the page says when the service
stops, nothing is written to the console as an error, and a phone-width viewport has no
horizontal overflow. Screenshots go to --out (desktop and phone); --docs-image copies the
desktop one there.
"""

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
DEADLINE_S = 60.0
CONFIG_BEFORE = "# the operator's own settings\nmodel:\n  default: some-model  # kept\nplugins:\n  disabled: [other]\n"


def host_own(url):
    """The one error the dashboard itself logs on every page, with or without plugins: on a
    loopback bind there is no login, and its `GET /api/auth/me` answers 401."""
    return bool(url) and url.split("?")[0].endswith("/api/auth/me")


def say(msg):
    print("check_tab: %s" % msg, flush=True)


def wait_for(what, probe, timeout=DEADLINE_S, every=0.1):
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.0f s waiting for %s" % (timeout, what))
        time.sleep(every)


def write_hook(root, name, yaml, handler=None):
    d = os.path.join(root, name)
    os.makedirs(d, mode=0o755)
    with open(os.path.join(d, "HOOK.yaml"), "w") as f:
        f.write(yaml)
    if handler is not None:
        with open(os.path.join(d, "handler.py"), "w") as f:
            f.write(handler)
    return d


class Run:
    def __init__(self, args):
        self.args = args
        self.tmp = tempfile.mkdtemp(prefix="hermes-hooks-dashboard-")
        self.home = os.path.join(self.tmp, "home")
        os.makedirs(self.home, mode=0o700)
        self.roots = os.path.join(self.home, "hooks")
        os.makedirs(self.roots, mode=0o755)
        self.env = dict(os.environ, HERMES_HOME=self.home, HOME=self.tmp, NO_COLOR="1")
        self.env.pop("HERMES_HOOKS_ADDRESS", None)
        self.env.pop("HERMES_HOOKS_TOKEN", None)
        self.procs = []

    def cli(self, *argv, check=True):
        out = subprocess.run([self.args.bin] + list(argv), env=self.env, capture_output=True,
                             text=True, timeout=120)
        if check and out.returncode != 0:
            raise AssertionError("hermes-hooks %s failed (%d): %s%s" % (
                " ".join(argv), out.returncode, out.stdout, out.stderr))
        return out

    def live(self):
        """The service's own view (`list --live --json`), not the dashboard's."""
        out = self.cli("list", "--live", "--json", check=False)
        if out.returncode != 0:
            return None
        return json.loads(out.stdout)

    def spawn(self, argv, log):
        f = open(os.path.join(self.args.out, log), "w")
        p = subprocess.Popen(argv, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self, p):
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)

    def close(self):
        for p in reversed(self.procs):
            self.stop(p)
        shutil.rmtree(self.tmp, ignore_errors=True)


def set_up_hooks(run):
    write_hook(run.roots, "greeter", "name: greeter\ndescription: Says hello\nevents: [\"agent:*\"]\n",
               "def handle(event_type, context):\n    return None\n")
    write_hook(run.roots, "flaky", "name: flaky\ndescription: Fails on purpose\nevents: [\"agent:start\"]\n",
               "def handle(event_type, context):\n    raise RuntimeError('flaky fails on purpose')\n")
    pending = write_hook(run.roots, "pending", "name: pending\nevents: [\"agent:start\"]\n",
                         "def handle(event_type, context):\n    return None\n")
    write_hook(run.roots, "broken", "name: broken\nevents: agent:start\n",
               "def handle(event_type, context):\n    return None\n")
    for name in ("greeter", "flaky"):
        run.cli("enable", name, "--trust", "explicit")
    with open(os.path.join(pending, "handler.py"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def start_service(run):
    run.service = run.spawn([run.args.bin, "serve", "--trust", "explicit", "--no-watch"], "service.log")
    wait_for("the service to load greeter and flaky", lambda: {"greeter", "flaky"} <= {
        h["name"] for h in (run.live() or {}).get("hooks", [])})
    for _ in range(3):
        run.cli("emit", "agent:start", "--context", "{\"user_id\": \"42\"}")
    wait_for("flaky's failures to be counted", lambda: any(
        h["name"] == "flaky" and h["counters"]["failed"] >= 3 for h in run.live()["hooks"]))


def install_plugin(run):
    config = os.path.join(run.home, "config.yaml")
    with open(config, "w") as f:
        f.write(CONFIG_BEFORE)
    say(run.cli("dashboard", "install").stdout.strip())
    with open(config) as f:
        after = f.read()
    assert after.startswith(CONFIG_BEFORE.replace("  disabled: [other]\n", "")), after
    assert "hermes-hooks" in after and "disabled: [other]" in after, after


def start_dashboard(run):
    p = run.spawn([run.args.hermes, "dashboard", "--port", "0", "--no-open", "--skip-build"],
                  "dashboard.log")
    log = os.path.join(run.args.out, "dashboard.log")

    def port():
        if p.poll() is not None:
            raise AssertionError("hermes dashboard exited: %s" % open(log).read()[-3000:])
        for line in open(log):
            if line.startswith("HERMES_DASHBOARD_READY port="):
                return int(line.split("=", 1)[1])
        return None

    return "http://127.0.0.1:%d" % wait_for("the dashboard to listen", port, timeout=180)


def check_auth(base):
    """Without the dashboard's session token nothing changes."""
    req = urllib.request.Request(base + "/api/plugins/hermes-hooks/reload", data=b"{}",
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as e:
        assert e.code == 401, "an unauthenticated reload got %d" % e.code
        return
    raise AssertionError("an unauthenticated reload was accepted")


def row_text(page, selector):
    return page.locator(selector).first.inner_text(timeout=DEADLINE_S * 1000)


def check_page(run, page, pending_sha):
    hooks_link = page.locator("a[href='/hooks']").first
    hooks_link.wait_for(timeout=DEADLINE_S * 1000)
    hooks_link.click()
    page.wait_for_url("**/hooks", timeout=DEADLINE_S * 1000)
    page.locator("tr[data-hook='greeter']").wait_for(timeout=DEADLINE_S * 1000)
    greeter = row_text(page, "tr[data-hook='greeter']")
    flaky = row_text(page, "tr[data-hook='flaky']")
    for name, text in (("greeter", greeter), ("flaky", flaky)):
        assert "python" in text and "service" in text and "ready" in text, (name, text)
    assert "agent:*" in greeter and "3 / 0 / 0 / 0" in greeter, greeter
    assert "flaky fails on purpose" in flaky, flaky
    assert "0 / 3 / 0 / 0" in flaky, "flaky's counters (ok / failed / timed out / dropped): %r" % flaky
    pending = row_text(page, "li[data-skipped='pending']")
    assert "not approved" in pending and "hermes-hooks enable pending --trust explicit" in pending, pending
    broken = row_text(page, "li[data-skipped='broken']")
    assert "is a single string, not a list: write `events: [" in broken, broken
    roots = row_text(page, "[data-section='roots']")
    assert run.roots in roots, roots
    tail = page.locator("[data-section='tail'] li").first
    tail.wait_for(timeout=DEADLINE_S * 1000)
    return pending


def check_approve(run, page, pending_sha):
    page.locator("li[data-skipped='pending'] button", has_text="Review and approve").click()
    review = page.locator("[data-review='pending']")
    review.wait_for(timeout=DEADLINE_S * 1000)
    text = review.inner_text()
    assert "handler.py" in text and pending_sha in text, "the review shows %r" % text
    # The picture for the docs: counters, an error, a refused hook with its review open.
    page.set_viewport_size({"width": 1360, "height": 1400})
    shot = os.path.join(run.args.out, "hooks-tab.png")
    page.screenshot(path=shot)
    if run.args.docs_image:
        shutil.copyfile(shot, run.args.docs_image)
    page.set_viewport_size({"width": 1360, "height": 900})
    review.locator("button", has_text="Approve these files").click()
    page.locator("tr[data-hook='pending']").wait_for(timeout=DEADLINE_S * 1000)
    wait_for("the service to run the approved hook", lambda: any(
        h["name"] == "pending" for h in run.live()["hooks"]))
    with open(os.path.join(run.home, "hooks-trust.json")) as f:
        assert pending_sha in f.read(), "the approval does not record the reviewed hash"


def check_reload(run, page):
    write_hook(run.roots, "late", "name: late\nevents: [\"agent:end\"]\n",
               "def handle(event_type, context):\n    return None\n")
    run.cli("enable", "late", "--trust", "explicit")
    assert not any(h["name"] == "late" for h in run.live()["hooks"]), "loaded before the reload"
    page.locator("button[data-action='reload']").click()
    page.locator("tr[data-hook='late']").wait_for(timeout=DEADLINE_S * 1000)
    assert any(h["name"] == "late" for h in run.live()["hooks"])


def check_phone(page, out):
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    page.locator("tr[data-hook='greeter']").wait_for(timeout=DEADLINE_S * 1000)
    sizes = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1] + 1, "horizontal overflow at phone width: %r" % sizes
    assert page.locator("tr[data-hook='greeter']").is_visible()
    page.screenshot(path=os.path.join(out, "hooks-tab-phone.png"), full_page=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--hermes", required=True)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs-image")
    args = ap.parse_args()
    args.bin = os.path.abspath(args.bin)
    os.makedirs(args.out, exist_ok=True)
    run = Run(args)
    errors = []
    try:
        pending_sha = set_up_hooks(run)
        start_service(run)
        install_plugin(run)
        base = start_dashboard(run)
        check_auth(base)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1360, "height": 900})
            page.on("console", lambda m: m.type == "error" and not host_own(m.location.get("url"))
                    and errors.append("console: %s (%s)" % (m.text, m.location.get("url"))))
            page.on("pageerror", lambda e: errors.append("page error: %s" % e))
            page.on("response", lambda r: r.status >= 400 and not host_own(r.url) and errors.append(
                "HTTP %d: %s %s" % (r.status, r.request.method, r.url)))
            page.goto(base + "/")
            check_page(run, page, pending_sha)
            check_approve(run, page, pending_sha)
            check_reload(run, page)
            run.cli("emit", "agent:start", "--context", "{\"user_id\": \"42\"}")
            page.locator("tr[data-hook='pending']").wait_for(timeout=DEADLINE_S * 1000)
            page.screenshot(path=os.path.join(args.out, "hooks-tab-after-reload.png"))
            check_phone(page, args.out)
            run.stop(run.service)
            page.locator("[data-down]").wait_for(timeout=DEADLINE_S * 1000)
            assert "not running" in page.locator("[data-down]").inner_text()
            browser.close()
        assert not errors, "the page logged errors:\n" + "\n".join(errors)
        say("ok: tab listed, hooks and states rendered, approve and reload took effect, no console "
            "errors, phone width fits; screenshots in %s" % args.out)
        return 0
    finally:
        run.close()


if __name__ == "__main__":
    sys.exit(main())
