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
horizontal overflow. Issue 60: the health states slow (`sluggish`), failing after a timeout
(`sleepy`) and recovering (`recovers`); the summary line, trouble first, since when and what to
do; no text of the hooks table spilling out of its cell or overlapping another at 1280 and
390 px, measured from the browser's boxes; readable trend bars; no pill cut off at 390 px; and
a shell hook of config.yaml (`sh gate.sh`, accepted by `hooks_auto_accept`) reviewed by its
command and script, approved in the tab, then run. Screenshots go to --out (desktop and phone); --docs-image copies the
desktop one there.

Then the Fleet section against a real fleet (skipped, with a message, when no nats-server is
found on PATH, in /usr/sbin or in $HERMES_NATS_SERVER, unless CI is set): nats-server with
JetStream on a free port, `serve --fleet` in the service's place (the socket the dashboard's
backend talks to), and one `worker --fleet` with its own $HERMES_HOME holding `poison` (raises
until a flag file exists; `retries: 0`, so its events go to the dead letters at once) and
`healthy`. Events are emitted through the edge; the page must show the worker, each hook's lag
and the dead letters with poison's error; the flag file is created and Replay clicked (and
confirmed); the edge's own API must then list no dead letters and count poison's replayed
events as ok. The fleet page is screenshotted at desktop and phone width (no overflow).
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import http.client
import socket
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

from playwright.sync_api import sync_playwright

import procs

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
DEADLINE_S = 60.0
LONG_ERROR = ("ValueError: the upstream answered 502 Bad Gateway while delivering the summary; "
              "payload=" + "abcdefghij" * 30 + " (retrying would not help: the token expired at "
              "2026-12-05T00:00:00Z and no refresh token was configured)")
CONFIG_BEFORE = "# the operator's own settings\nmodel:\n  default: some-model  # kept\n%splugins:\n  disabled: [other]\n"
#: Issue 60 row 2: a shell hook of config.yaml, accepted by `hooks_auto_accept` (so under
#: --trust explicit it waits for an approval, given in the tab), running a script of its own.
CONFIG_HOOKS = "hooks_auto_accept: true\nhooks:\n  pre_tool_call:\n    - command: %s\n"
GATE = "#!/bin/sh\n# the tab's gate: keeps what it was given\ncat > %s\n"


def host_own(url):
    """The one error the dashboard itself logs on every page, with or without plugins: on a
    loopback bind there is no login, and its `GET /api/auth/me` answers 401."""
    return bool(url) and url.split("?")[0].endswith("/api/auth/me")


def say(msg):
    print("check_tab: %s" % msg, flush=True)


def wait_for(what, probe, timeout=DEADLINE_S, every=0.1):
    return procs.wait_for(what, probe, timeout, every)


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
        procs.stop(p)

    def close(self):
        for p in reversed(self.procs):
            self.stop(p)
        shutil.rmtree(self.tmp, ignore_errors=True)


def set_up_config_hook(run):
    """config.yaml with a shell hook (`sh GATE`) and the operator's own settings."""
    script = os.path.join(run.tmp, "gate.sh")
    run.gate_out = os.path.join(run.tmp, "gate.out")
    with open(script, "w") as f:
        f.write(GATE % run.gate_out)
    run.gate_command = "sh %s" % script
    run.config_before = CONFIG_BEFORE % (CONFIG_HOOKS % json.dumps(run.gate_command))
    with open(os.path.join(run.home, "config.yaml"), "w") as f:
        f.write(run.config_before)


def set_up_hooks(run):
    set_up_config_hook(run)
    write_hook(run.roots, "greeter", "name: greeter\ndescription: Says hello\nevents: [\"agent:*\"]\n",
               "def handle(event_type, context):\n    return None\n")
    write_hook(run.roots, "flaky", "name: flaky\ndescription: Fails on purpose\nevents: [\"agent:start\"]\n",
               "def handle(event_type, context):\n    raise RuntimeError('flaky fails on purpose')\n")
    pending = write_hook(run.roots, "pending", "name: pending\nevents: [\"agent:start\"]\nsandbox: strict\n",
                         "def handle(event_type, context):\n    return None\n")
    write_hook(run.roots, "broken", "name: broken\nevents: agent:start\n",
               "def handle(event_type, context):\n    return None\n")
    # Issue 50's hooks: one that cannot keep up (a queue of 2, 0.4 s a call), one whose pattern
    # matches nothing, one that failed once and recovered, one that times out, one with an
    # unknown HOOK.yaml key (a warning) and a long error, one whose next version fails to start.
    write_hook(run.roots, "slow", "name: slow\nevents: [\"slow:*\"]\nqueue: {capacity: 2}\n",
               "import time\n\ndef handle(event_type, context):\n    time.sleep(0.4)\n")
    write_hook(run.roots, "nomatch", "name: nomatch\nevents: [\"nothing:ever\"]\n",
               "def handle(event_type, context):\n    return None\n")
    write_hook(run.roots, "recovers", "name: recovers\nevents: [\"agent:start\"]\n",
               "calls = []\n\ndef handle(event_type, context):\n    calls.append(1)\n"
               "    if len(calls) == 1:\n        raise RuntimeError('first call fails')\n")
    write_hook(run.roots, "sleepy", "name: sleepy\nevents: [\"sleepy:*\"]\ntimeout: 1\n",
               "import time\n\ndef handle(event_type, context):\n    time.sleep(3)\n")
    # Issue 60 row 5: a hook that answers, but in more than half its timeout, is slow.
    write_hook(run.roots, "sluggish", "name: sluggish\nevents: [\"sluggish:*\"]\ntimeout: 2\n",
               "import time\n\ndef handle(event_type, context):\n    time.sleep(1.2)\n")
    write_hook(run.roots, "wordy", "name: wordy\nevents: [\"agent:start\"]\ncolour: blue\n",
               "def handle(event_type, context):\n    raise RuntimeError(%r)\n" % LONG_ERROR)
    write_hook(run.roots, "upgraded", "name: upgraded\nevents: [\"agent:end\"]\n",
               "def handle(event_type, context):\n    return None\n")
    # Issue 60 row 6: not approved, and its handler does not compile: the review says so.
    write_hook(run.roots, "typo", "name: typo\nevents: [\"agent:start\"]\n",
               "def handle(event_type, context)\n    return None\n")
    # Issue 49: a hook on the agent's events shows that family.
    write_hook(run.roots, "toolgate", "name: toolgate\nevents: [\"pre_tool_call\"]\n",
               "def handle(event_type, context):\n    return None\n")
    for name in ("greeter", "flaky", "slow", "nomatch", "recovers", "sleepy", "sluggish", "wordy",
                 "upgraded", "toolgate"):
        run.cli("enable", name, "--trust", "explicit")
    with open(os.path.join(pending, "handler.py"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def start_service(run):
    run.service = run.spawn([run.args.bin, "serve", "--trust", "explicit", "--no-watch"], "service.log")
    wait_for("the service to load greeter and flaky", lambda: {"greeter", "flaky", "slow"} <= {
        h["name"] for h in (run.live() or {}).get("hooks", [])})
    for _ in range(3):
        run.cli("emit", "agent:start", "--context", "{\"user_id\": \"42\"}")
    for n in range(12):
        run.cli("emit", "slow:tick", "--context", json.dumps({"n": n}))
    run.cli("emit", "sleepy:go")
    for _ in range(2):
        run.cli("emit", "sluggish:go")
    wait_for("flaky's failures to be counted", lambda: any(
        h["name"] == "flaky" and h["counters"]["failed"] >= 3 for h in run.live()["hooks"]))


def install_plugin(run):
    config = os.path.join(run.home, "config.yaml")
    with open(config, "w") as f:
        f.write(run.config_before)
    say(run.cli("dashboard", "install").stdout.strip())
    with open(config) as f:
        after = f.read()
    assert after.startswith(run.config_before.replace("  disabled: [other]\n", "")), after
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
    req = urllib.request.Request(base + "/api/plugins/hermes-hooks-dashboard/reload", data=b"{}",
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=10)
    except urllib.error.HTTPError as e:
        assert e.code == 401, "an unauthenticated reload got %d" % e.code
        return
    raise AssertionError("an unauthenticated reload was accepted")


def row_text(page, selector):
    return page.locator(selector).first.inner_text(timeout=DEADLINE_S * 1000)


def health_of(page, name):
    row = page.locator("tr[data-hook='%s']" % name)
    return row.get_attribute("data-health") if row.count() else None


def check_page(run, page, pending_sha):
    hooks_link = page.locator("a[href='/hooks']").first
    hooks_link.wait_for(timeout=DEADLINE_S * 1000)
    hooks_link.click()
    page.wait_for_url("**/hooks", timeout=DEADLINE_S * 1000)
    page.locator("tr[data-hook='greeter']").wait_for(timeout=DEADLINE_S * 1000)
    # Each hook's health at a glance, from its last minutes (issue 50).
    # Issue 60 row 5: sleepy's one call timed out and none succeeded: failing (it stays so once
    # the window passes), not degraded; sluggish answers in over half its timeout: slow.
    want = {"greeter": "ok", "flaky": "failing", "slow": "dropping", "nomatch": "never_matched",
            "recovers": "degraded", "wordy": "failing", "sluggish": "slow", "sleepy": "failing"}
    wait_for("every hook's health on the page (%r)" % want, lambda: all(
        health_of(page, n) == st for n, st in want.items()))
    check_summary(run, page)
    greeter = row_text(page, "tr[data-hook='greeter']")
    assert "healthy" in greeter and "python · service · sandbox none" in greeter, greeter
    assert "none" in greeter, "greeter has no error: %r" % greeter
    flaky = row_text(page, "tr[data-hook='flaky']")
    assert "failing" in flaky and "3 of 3 calls failed" in flaky, flaky
    assert "flaky fails on purpose" in flaky and "current" in flaky, flaky
    slow = row_text(page, "tr[data-hook='slow']")
    assert "dropping" in slow and "events dropped in the last 5 min" in slow, slow
    nomatch = row_text(page, "tr[data-hook='nomatch']")
    assert "never matched" in nomatch and "matched its `events:`" in nomatch, nomatch
    # Issue 60 row 5: events that have not happened are no trouble: a neutral badge, not orange.
    tone = page.locator("tr[data-hook='nomatch'] .hh-health .hh-badge").first.get_attribute("class")
    assert "hh-plain" in tone, tone
    sluggish = row_text(page, "tr[data-hook='sluggish']")
    assert "slow" in sluggish and "half its 2s timeout or more" in sluggish, sluggish
    sleepy = row_text(page, "tr[data-hook='sleepy']")
    assert re.search(r"\b1 event\b(?!s)", sleepy) and "none has succeeded since" in sleepy, sleepy
    recovers = row_text(page, "tr[data-hook='recovers']")
    assert "first call fails" in recovers and "2 ok since" in recovers, "an aged error: %r" % recovers
    # Recovering (issue 60 row 6): its failure is in the window, its last calls succeeded.
    todo = page.locator("tr[data-hook='recovers'] [data-todo]")
    assert todo.get_attribute("data-todo") == "recovering", todo.inner_text()
    assert "2 calls succeeded since its last error" in todo.inner_text(), todo.inner_text()
    wordy = row_text(page, "tr[data-hook='wordy']")
    assert "1 warning" in wordy, wordy
    assert "gateway events" in greeter, greeter
    toolgate = row_text(page, "tr[data-hook='toolgate']")
    assert "agent events" in toolgate, toolgate
    pending = row_text(page, "li[data-skipped='pending']")
    assert "not approved" in pending and "hermes-hooks enable pending --trust explicit" in pending, pending
    broken = row_text(page, "li[data-skipped='broken']")
    assert "is a single string, not a list: write `events: [" in broken, broken
    roots = row_text(page, "[data-section='roots']")
    assert run.roots in roots, roots
    # Issue 60 row 6: config.yaml's shell hooks have a root of their own, listed too.
    assert os.path.join(run.home, "config-hooks") in roots, roots
    tail = page.locator("[data-section='tail'] li").first
    tail.wait_for(timeout=DEADLINE_S * 1000)
    timeout = page.locator("[data-notice='handler_timeout']").first
    timeout.wait_for(timeout=DEADLINE_S * 1000)
    assert "timed out" in timeout.inner_text() and "no answer within 1 s" in timeout.inner_text(), \
        timeout.inner_text()
    return pending


def check_summary(run, page):
    """Issue 60 row 6: a summary line, trouble first, since when, and what to do."""
    summary = page.locator("[data-summary]")
    wait_for("the summary to count 6 hooks in trouble", lambda: summary.get_attribute("data-trouble") == "6")
    text = summary.inner_text()
    assert "1 healthy" in text and "6 in trouble (3 failing, 1 dropping, 1 degraded, 1 slow)" in text, text
    assert "3 never matched" in text, text
    rank = {"failing": 0, "dropping": 1, "degraded": 2, "slow": 3, "ok": 4, "never_matched": 5, "idle": 6}
    order = page.evaluate("""() => Array.from(document.querySelectorAll("table.hh-hooks tr[data-hook]"))
        .map(r => [r.getAttribute("data-health"), r.getAttribute("data-hook")])""")
    keys = [(rank.get(st, 7), name) for st, name in order]
    assert keys == sorted(keys), "not trouble first, then by name: %r" % order
    flaky = page.locator("tr[data-hook='flaky']")
    since = flaky.locator("[data-since]").inner_text()
    assert re.fullmatch(r"since \d\d:\d\d", since), since
    todo = flaky.locator("[data-todo='failing']").inner_text()
    assert "Fix its handler" in todo and "disable it" in todo, todo
    todo = page.locator("tr[data-hook='sluggish'] [data-todo='slow']").inner_text()
    assert "raise `timeout:` (2 s now)" in todo, todo
    assert page.locator("tr[data-hook='sluggish'] [data-since]").count() == 1


#: Every text of the hooks table, as boxes: each text node's line boxes (clipped by any element
#: that hides its overflow), the cell it belongs to; what spills out of its cell or overlaps
#: another text. Measured by the browser, not guessed from the CSS (issue 60 row 4).
OVERLAPS_JS = """() => {
  const found = [];
  const texts = [];
  for (const tr of document.querySelectorAll("table.hh-hooks tr[data-hook]")) {
    const walker = document.createTreeWalker(tr, NodeFilter.SHOW_TEXT);
    let n;
    while ((n = walker.nextNode())) {
      if (!n.textContent.trim() || n.parentElement.closest("svg")) continue;
      const td = n.parentElement.closest("td");
      const cell = td.getBoundingClientRect();
      let clip = [-1e9, -1e9, 1e9, 1e9];
      for (let e = n.parentElement; e && e !== td; e = e.parentElement) {
        const cs = getComputedStyle(e);
        if (cs.overflowX !== "visible" || cs.overflowY !== "visible") {
          const r = e.getBoundingClientRect();
          clip = [Math.max(clip[0], r.left), Math.max(clip[1], r.top), Math.min(clip[2], r.right), Math.min(clip[3], r.bottom)];
        }
      }
      const range = document.createRange();
      range.selectNodeContents(n);
      for (const r of range.getClientRects()) {
        const box = [Math.max(r.left, clip[0]), Math.max(r.top, clip[1]), Math.min(r.right, clip[2]), Math.min(r.bottom, clip[3])];
        if (box[2] - box[0] < 0.5 || box[3] - box[1] < 0.5) continue;
        const what = tr.getAttribute("data-hook") + " / " + (td.getAttribute("data-label") || "actions") + ": " + n.textContent.trim().slice(0, 40);
        if (box[0] < cell.left - 1 || box[2] > cell.right + 1) {
          found.push("spills out of its cell (" + Math.round(box[0]) + "-" + Math.round(box[2]) + " px, the cell " +
            Math.round(cell.left) + "-" + Math.round(cell.right) + "): " + what);
        }
        texts.push([box, what, n]);
      }
    }
  }
  for (let i = 0; i < texts.length; i++) {
    for (let j = i + 1; j < texts.length; j++) {
      const [a, wa, na] = texts[i], [b, wb, nb] = texts[j];
      if (na === nb) continue;
      const w = Math.min(a[2], b[2]) - Math.max(a[0], b[0]), h = Math.min(a[3], b[3]) - Math.max(a[1], b[1]);
      if (w > 1 && h > 1) found.push("overlap: " + wa + " | " + wb);
    }
  }
  return [texts.length, found];
}"""


def no_overlap(page, width):
    """No text of the hooks table spills out of its cell or overlaps another, at `width`."""
    count, found = page.evaluate(OVERLAPS_JS)
    assert count > 50, "only %d text boxes measured at %d px" % (count, width)
    assert not found, "at %d px:\n%s" % (width, "\n".join(found[:20]))
    say("%d text boxes of the hooks table measured at %d px: none spills out of its cell or overlaps" % (
        count, width))


def check_layout(run, page):
    """At 1280 px with a long error: no sideways scroll, every Disable button whole and in
    view, no row taller than a few lines; the detail row holds the whole error."""
    page.set_viewport_size({"width": 1280, "height": 900})
    page.locator("tr[data-hook='wordy']").wait_for(timeout=DEADLINE_S * 1000)
    fits(page, "the page at 1280 px")
    boxes = page.evaluate("""() => Array.from(document.querySelectorAll(
        "tr[data-hook] button[data-action='disable']")).map(b => {
          const r = b.getBoundingClientRect(); return [r.left, r.right, b.innerText]; })""")
    assert boxes, "no Disable button"
    for left, right, text in boxes:
        assert right <= 1280 and text.strip() == "Disable", (left, right, text)
    table = page.evaluate("""() => { const t = document.querySelector("table.hh-hooks");
        const s = t.closest(".hh-scroll"); return [s.scrollWidth, s.clientWidth]; }""")
    assert table[0] <= table[1] + 1, "the hooks table scrolls sideways at 1280 px: %r" % table
    height = page.locator("tr[data-hook='wordy']").bounding_box()["height"]
    assert height < 220, "the row with a long error is %d px tall" % height
    no_overlap(page, 1280)
    # The last hour reads as bars (issue 60 row 6: sixty 1-2 px lines were not readable).
    widths = page.evaluate("""() => Array.from(document.querySelectorAll(
        "tr[data-hook='flaky'] svg.hh-spark rect")).map(r => r.getBoundingClientRect().width)""")
    assert widths and min(widths) >= 6, "the trend's bars: %r px" % widths
    page.locator("tr[data-hook='wordy'] button[data-action='details']").click()
    detail = page.locator("[data-detail='wordy']")
    detail.wait_for(timeout=DEADLINE_S * 1000)
    text = detail.inner_text()
    assert "colour" in text and LONG_ERROR[-40:] in text and "agent:start" in text, text
    assert "sandbox" in text, text
    shot = os.path.join(run.args.out, "hooks-tab-1280.png")
    page.screenshot(path=shot, full_page=True)
    if run.args.docs_dir:
        shutil.copyfile(shot, os.path.join(run.args.docs_dir, "dashboard-hooks-1280.png"))
    page.locator("tr[data-hook='wordy'] button[data-action='details']").click()
    detail.wait_for(state="detached", timeout=DEADLINE_S * 1000)
    page.set_viewport_size({"width": 1360, "height": 900})


def live_hook(run, name):
    return next((h for h in (run.live() or {}).get("hooks", []) if h["name"] == name), None)


def check_disable(run, page):
    """Disable asks first; disable then enable keeps the counters."""
    before = live_hook(run, "greeter")["counters"]
    page.locator("tr[data-hook='greeter'] button[data-action='disable']").click()
    confirm = page.locator("[data-confirm-disable='greeter']")
    confirm.wait_for(timeout=DEADLINE_S * 1000)
    assert live_hook(run, "greeter") is not None, "disabled before the confirmation"
    confirm.locator("button", has_text="Cancel").click()
    confirm.wait_for(state="detached", timeout=DEADLINE_S * 1000)
    assert live_hook(run, "greeter") is not None, "disabled after Cancel"
    page.locator("tr[data-hook='greeter'] button[data-action='disable']").click()
    confirm.locator("button[data-action='confirm-disable']").click()
    wait_for("greeter to be disabled", lambda: live_hook(run, "greeter") is None)
    run.cli("enable", "greeter", "--trust", "explicit")
    page.locator("button[data-action='reload']").click()
    page.locator("tr[data-hook='greeter']").wait_for(timeout=DEADLINE_S * 1000)
    after = live_hook(run, "greeter")["counters"]
    assert after["accepted"] >= before["accepted"] and after["ok"] >= before["ok"], (before, after)
    assert before["accepted"] > 0, before


def check_reload_failed(run, page):
    """A new version that fails to start: the tail says the reload failed and the old one runs."""
    with open(os.path.join(run.roots, "upgraded", "handler.py"), "w") as f:
        f.write("import no_such_module_for_this_test\n\ndef handle(event_type, context):\n    return None\n")
    run.cli("enable", "upgraded", "--trust", "explicit")
    page.locator("button[data-action='reload']").click()
    entry = page.locator("[data-notice='hook_reloaded']", has_text="reload failed").first
    entry.wait_for(timeout=DEADLINE_S * 1000)
    assert "previous version keeps running" in entry.inner_text(), entry.inner_text()


#: The (status, URL) of the requests a check makes to see them refused.
REFUSED_ON_PURPOSE = set()


def check_enable_needs_digest(run, page):
    """Issue 57 row 4: the dashboard's session token is in the page it serves to anyone who can
    reach its port (a hook granted `connect: [...:9119]`, another local user); with it, an
    enable without the review's digest approved a hook. Now the backend refuses it (400) and
    nothing is approved."""
    url = page.url.split("/", 3)[:3]
    REFUSED_ON_PURPOSE.add((400, "/".join(url) + "/api/plugins/hermes-hooks-dashboard/hooks/pending/enable"))
    answer = page.evaluate("""async () => {
        const r = await fetch("/api/plugins/hermes-hooks-dashboard/hooks/pending/enable", {
            method: "POST",
            headers: {"Content-Type": "application/json",
                      "X-Hermes-Session-Token": window.__HERMES_SESSION_TOKEN__ || ""},
            body: "{}"});
        return [r.status, await r.text()];
    }""")
    assert answer[0] == 400 and "reviewed" in answer[1], "an enable without a digest: %r" % answer
    with open(os.path.join(run.home, "hooks-trust.json")) as f:
        assert '"pending"' not in f.read(), "approved without a digest"


def check_approve(run, page, pending_sha):
    page.locator("li[data-skipped='pending'] button", has_text="Review and approve").click()
    review = page.locator("[data-review='pending']")
    review.wait_for(timeout=DEADLINE_S * 1000)
    text = review.inner_text()
    assert "handler.py" in text and pending_sha in text, "the review shows %r" % text
    # The sandbox is shown before Approve (issue 46): the approval covers it.
    assert "Sandbox: strict" in text, "the review does not show the sandbox: %r" % text
    # And the code itself (issue 50).
    assert "def handle(event_type, context):" in text, "the review shows no code: %r" % text
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
    message = page.locator(".hh-message").inner_text()
    assert "runs now" in message and "SIGHUP" not in message, message
    # Changed since its approval: the review shows what changed, as a diff.
    with open(os.path.join(run.roots, "pending", "handler.py"), "a") as f:
        f.write("# changed by the test\n")
    page.locator("button[data-action='reload']").click()
    page.locator("li[data-skipped='pending'] button", has_text="Review and approve").click()
    diff = page.locator("[data-review='pending'] [data-diff='handler.py']")
    diff.wait_for(timeout=DEADLINE_S * 1000)
    assert "+# changed by the test" in diff.inner_text(), diff.inner_text()
    page.locator("[data-review='pending'] button", has_text="Approve these files").click()
    page.locator("tr[data-hook='pending']").wait_for(timeout=DEADLINE_S * 1000)


def check_config_hook(run, page):
    """Issue 60 row 2: under --trust explicit, a shell hook of config.yaml is reviewed (its
    command and the script it runs, not only the handler hermes-hooks wrote) and approved in
    the tab, and then it runs."""
    item = page.locator("li[data-skipped^='shell-']")
    item.wait_for(timeout=DEADLINE_S * 1000)
    name = item.get_attribute("data-skipped")
    assert "not_approved" in item.inner_text(), item.inner_text()
    item.locator("button", has_text="Review and approve").click()
    review = page.locator("[data-review='%s']" % name)
    review.wait_for(timeout=DEADLINE_S * 1000)
    command = review.locator("[data-review-command]").inner_text()
    assert command.strip() == run.gate_command, command
    script = review.locator("[data-review-script]").inner_text()
    assert "# the tab's gate" in script and "covers the command, not this file" in script, script
    text = review.inner_text()
    assert "hooks.pre_tool_call[0]" in text and "Sandbox: none" in text, text
    # The generated handler is there, folded: the approval covers it (and entry.py, the command).
    assert review.locator("[data-review-made] > summary").count() == 1, text
    page.screenshot(path=os.path.join(run.args.out, "hooks-tab-config-review.png"), full_page=True)
    review.locator("button", has_text="Approve this command").click()
    page.locator("tr[data-hook='%s']" % name).wait_for(timeout=DEADLINE_S * 1000)
    assert "shell hook (config.yaml)" in row_text(page, "tr[data-hook='%s']" % name)
    run.cli("emit", "pre_tool_call", "--context", json.dumps({"tool_name": "terminal", "tool_input": {}}))
    wait_for("the approved config hook to run its script", lambda: os.path.exists(run.gate_out)
             and "terminal" in open(run.gate_out).read())


def check_syntax_review(page):
    """Issue 60 row 6: an unapproved hook whose handler does not compile read only
    `not_approved`; its review says it would not load, and why, before Approve."""
    page.locator("li[data-skipped='typo'] button", has_text="Review and approve").click()
    said = page.locator("[data-review='typo'] [data-review-syntax]")
    said.wait_for(timeout=DEADLINE_S * 1000)
    assert "would not load" in said.inner_text() and "SyntaxError" in said.inner_text(), said.inner_text()
    page.locator("[data-review='typo'] button", has_text="Cancel").click()
    page.locator("[data-review='typo']").wait_for(state="detached", timeout=DEADLINE_S * 1000)


def check_reload(run, page):
    write_hook(run.roots, "late", "name: late\nevents: [\"agent:end\"]\n",
               "def handle(event_type, context):\n    return None\n")
    run.cli("enable", "late", "--trust", "explicit")
    assert not any(h["name"] == "late" for h in run.live()["hooks"]), "loaded before the reload"
    page.locator("button[data-action='reload']").click()
    page.locator("tr[data-hook='late']").wait_for(timeout=DEADLINE_S * 1000)
    assert any(h["name"] == "late" for h in run.live()["hooks"])


def fits(page, what):
    """No horizontal overflow at the viewport's width."""
    sizes = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert sizes[0] <= sizes[1] + 1, "horizontal overflow of %s at phone width: %r" % (what, sizes)


def check_phone(page, out, docs_dir=None):
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    page.locator("tr[data-hook='greeter']").wait_for(timeout=DEADLINE_S * 1000)
    fits(page, "the page")
    assert page.locator("tr[data-hook='greeter']").is_visible()
    no_overlap(page, 390)
    # Issue 60 row 6: no pill is cut off at phone width (the service's one in the header was).
    cut = page.evaluate("""() => Array.from(document.querySelectorAll(".hh-page .hh-badge"))
        .filter(b => b.scrollWidth > b.clientWidth + 1 || b.getBoundingClientRect().right > window.innerWidth)
        .map(b => b.innerText)""")
    assert not cut, "pills cut off at 390 px: %r" % cut
    heights = [page.locator("tr[data-hook='%s']" % n).bounding_box()["height"] for n in ("greeter", "flaky")]
    say("cards at 390 px: greeter %d px, flaky %d px tall" % tuple(heights))
    page.locator("tr[data-hook='wordy'] button[data-action='details']").click()
    page.locator("[data-detail='wordy']").wait_for(timeout=DEADLINE_S * 1000)
    fits(page, "the page with a detail open")
    shot = os.path.join(out, "hooks-tab-phone.png")
    page.screenshot(path=shot, full_page=True)
    if docs_dir:
        shutil.copyfile(shot, os.path.join(docs_dir, "dashboard-hooks-390.png"))


POISON = """import os

def handle(event_type, context):
    if not os.path.exists(%r):
        raise RuntimeError('poison fails until fixed (n=%%s)' %% context.get('n'))
    return None
"""


def nats_server():
    """The nats-server binary, or None (the fleet scenario is skipped outside CI)."""
    found = os.environ.get("HERMES_NATS_SERVER") or shutil.which("nats-server")
    for p in [found, "/usr/sbin/nats-server", "/usr/local/sbin/nats-server"]:
        if p and os.path.isfile(p):
            return p
    if os.environ.get("CI"):
        raise AssertionError("nats-server is not installed (CI is set: the fleet scenario must run)")
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UnixHTTP(http.client.HTTPConnection):
    """HTTP over the service's Unix socket."""

    def __init__(self, path):
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def service_get(run, path):
    """The service's own API (not the dashboard's): (status, JSON)."""
    conn = UnixHTTP(os.path.join(run.home, "hooks.sock"))
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def start_fleet(run, nats):
    """A broker, the edge in the service's place, and a worker with `poison` and `healthy`."""
    port = free_port()
    store = os.path.join(run.tmp, "jetstream")
    broker = run.spawn([nats, "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store], "nats.log")

    def listening():
        if broker.poll() is not None:
            raise AssertionError("nats-server exited: %s" % open(os.path.join(run.args.out, "nats.log")).read())
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    wait_for("nats-server to listen", listening)
    url = "nats://127.0.0.1:%d" % port
    whome = os.path.join(run.tmp, "worker-home")
    roots = os.path.join(whome, "hooks")
    os.makedirs(roots, mode=0o700)
    run.fixed = os.path.join(run.tmp, "poison.fixed")
    write_hook(roots, "poison", "name: poison\ndescription: Fails until fixed\n"
               "events: [\"agent:*\"]\nretries: 0\n", POISON % run.fixed)
    write_hook(roots, "healthy", "name: healthy\nevents: [\"agent:*\"]\n",
               "def handle(event_type, context):\n    return None\n")
    worker_env = dict(run.env, HERMES_HOME=whome)
    f = open(os.path.join(run.args.out, "worker.log"), "w")
    run.procs.append(subprocess.Popen(
        [run.args.bin, "worker", "--fleet", url, "--worker-id", "w1", "--status-interval-ms", "200"],
        env=worker_env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
    run.edge = run.spawn([run.args.bin, "serve", "--fleet", url, "--gateway-id", "gw-dash"], "edge.log")

    def serving():
        live = run.live() or {}
        return {"poison", "healthy"} <= {h["name"] for h in live.get("hooks", [])
                                          if "w1" in (h.get("workers") or [])}

    wait_for("the edge to see the worker serve poison and healthy", serving)
    for n in range(3):
        run.cli("emit", "agent:start", "--context", json.dumps({"n": n}))
    wait_for("three dead letters of poison", lambda: len(
        service_get(run, "/v1/dead?hook=poison")[1].get("letters", [])) == 3)
    return url


def fleet_hook(run, name):
    return next((h for h in (run.live() or {}).get("hooks", []) if h["name"] == name), None)


def check_fleet(run, page):
    fleet = page.locator("[data-section='fleet']")
    fleet.wait_for(timeout=DEADLINE_S * 1000)
    page.locator("tr[data-worker='w1']").wait_for(timeout=DEADLINE_S * 1000)
    lag = row_text(page, "tr[data-fleet-hook='poison']")
    assert "w1" in lag and any(c.isdigit() for c in lag), "poison's workers and lag: %r" % lag
    dead = page.locator("[data-dead-hook='poison']")
    dead.wait_for(timeout=DEADLINE_S * 1000)
    wait_for("three dead letters on the page", lambda: page.locator(
        "[data-dead-hook='poison'] tr[data-dead-seq]").count() == 3)
    text = dead.inner_text()
    assert "poison fails until fixed" in text and "agent:start" in text, text
    assert page.locator("[data-dead-hook='healthy']").count() == 0, "healthy has no dead letter"
    # The workers' hooks are disabled on the workers: no Disable button that would act on the
    # edge's own hook folders instead.
    poison = page.locator("tr[data-hook='poison']")
    poison.wait_for(timeout=DEADLINE_S * 1000)
    assert poison.get_by_role("button", name="Disable").count() == 0, poison.inner_text()
    assert "disable it on its workers" in poison.inner_text(), poison.inner_text()
    page.set_viewport_size({"width": 1360, "height": 1600})
    fleet.scroll_into_view_if_needed()
    page.screenshot(path=os.path.join(run.args.out, "hooks-tab-fleet.png"), full_page=True)
    # Fixed, then replayed from the page: one letter, then the rest; each asked first, done
    # only after the confirmation.
    with open(run.fixed, "w") as f:
        f.write("fixed\n")
    ok_before = (fleet_hook(run, "poison").get("counters") or {}).get("ok", 0)
    first = dead.locator("tr[data-dead-seq]").first
    seq = first.get_attribute("data-dead-seq")
    replay_from_page(run, page, first.locator("button[data-action='replay']"), "1 dead letter", 3)
    wait_for("the replayed letter to leave the page", lambda: page.locator(
        "[data-dead-hook='poison'] tr[data-dead-seq]").count() == 2)
    left = service_get(run, "/v1/dead")[1]["letters"]
    assert seq not in [str(x["seq"]) for x in left] and len(left) == 2, left
    # The dead letters at phone width: stacked, nothing wider than the screen.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    page.locator("[data-dead-hook='poison'] tr[data-dead-seq]").first.wait_for(timeout=DEADLINE_S * 1000)
    fits(page, "the fleet page")
    page.locator("[data-fleet='dead']").scroll_into_view_if_needed()
    page.screenshot(path=os.path.join(run.args.out, "hooks-tab-fleet-phone.png"))
    page.set_viewport_size({"width": 1360, "height": 900})
    replay_from_page(run, page, page.locator("[data-dead-hook='poison'] button[data-action='replay-all']"),
                     "2 dead letters", 2)
    page.locator("[data-dead-empty]").wait_for(timeout=DEADLINE_S * 1000)
    status, left = service_get(run, "/v1/dead")
    assert status == 200 and left["letters"] == [], "the edge still lists %r" % left
    wait_for("poison's replayed events counted ok on the service", lambda: (
        fleet_hook(run, "poison").get("counters") or {}).get("ok", 0) >= ok_before + 3)
    page.screenshot(path=os.path.join(run.args.out, "hooks-tab-fleet-replayed.png"), full_page=True)


def replay_from_page(run, page, button, asks, listed):
    """Clicks a Replay button; the confirmation must say `asks` and nothing may be replayed
    (the edge still lists `listed` letters) until its own Replay is clicked."""
    button.click()
    confirm = page.locator("[data-confirm='poison']")
    confirm.wait_for(timeout=DEADLINE_S * 1000)
    assert asks in confirm.inner_text(), confirm.inner_text()
    assert len(service_get(run, "/v1/dead")[1]["letters"]) == listed, "replayed before the confirmation"
    confirm.locator("button", has_text="Replay").click()
    confirm.wait_for(state="detached", timeout=DEADLINE_S * 1000)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--hermes", required=True)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs-image")
    ap.add_argument("--docs-dir", help="also write the 1280 px and 390 px screenshots here")
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
                    and (m.location.get("url") or "").split("?")[0] not in
                    {url for _, url in REFUSED_ON_PURPOSE}
                    and errors.append("console: %s (%s)" % (m.text, m.location.get("url"))))
            page.on("pageerror", lambda e: errors.append("page error: %s" % e))
            page.on("response", lambda r: r.status >= 400 and not host_own(r.url)
                    and (r.status, r.url.split("?")[0]) not in REFUSED_ON_PURPOSE and errors.append(
                "HTTP %d: %s %s" % (r.status, r.request.method, r.url)))
            page.goto(base + "/")
            check_page(run, page, pending_sha)
            check_layout(run, page)
            check_enable_needs_digest(run, page)
            check_approve(run, page, pending_sha)
            check_config_hook(run, page)
            check_syntax_review(page)
            check_reload(run, page)
            check_disable(run, page)
            check_reload_failed(run, page)
            run.cli("emit", "agent:start", "--context", "{\"user_id\": \"42\"}")
            page.locator("tr[data-hook='pending']").wait_for(timeout=DEADLINE_S * 1000)
            page.screenshot(path=os.path.join(args.out, "hooks-tab-after-reload.png"))
            check_phone(page, args.out, args.docs_dir)
            run.stop(run.service)
            page.locator("[data-down]").wait_for(timeout=DEADLINE_S * 1000)
            assert "not running" in page.locator("[data-down]").inner_text()
            nats = nats_server()
            if nats:
                start_fleet(run, nats)
                page.set_viewport_size({"width": 1360, "height": 900})
                check_fleet(run, page)
            else:
                say("SKIPPED the fleet scenario: nats-server is not installed")
            browser.close()
        assert not errors, "the page logged errors:\n" + "\n".join(errors)
        say("ok: tab listed, hooks and states rendered, approve and reload took effect, no console "
            "errors, phone width fits%s; screenshots in %s" % (
                "; fleet: worker, lag and dead letters shown, replay took effect" if nats else "",
                args.out))
        return 0
    finally:
        run.close()


if __name__ == "__main__":
    sys.exit(main())
