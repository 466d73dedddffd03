// The Hooks tab of the Hermes dashboard (hermes-hooks). A plain script, no build step: it
// renders with the React and the components the dashboard exposes on
// window.__HERMES_PLUGIN_SDK__, and talks only to this plugin's backend
// (/api/plugins/hermes-hooks-dashboard/, see plugin_api.py) through the SDK's authenticated fetchJSON.
(function () {
  "use strict";
  var SDK = window.__HERMES_PLUGIN_SDK__;
  var PLUGINS = window.__HERMES_PLUGINS__;
  if (!SDK || !PLUGINS) return;

  var React = SDK.React;
  var h = React.createElement;
  var useState = SDK.hooks.useState;
  var useEffect = SDK.hooks.useEffect;
  var useCallback = SDK.hooks.useCallback;
  var useRef = SDK.hooks.useRef;
  var C = SDK.components;
  var API = "/api/plugins/hermes-hooks-dashboard";
  var STATE_EVERY_MS = 3000;
  var TAIL_EVERY_MS = 2000;
  var TAIL_KEEP = 100;

  function get(path) {
    return SDK.fetchJSON(API + path);
  }

  function post(path, body) {
    return SDK.fetchJSON(API + path, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body || {}),
    });
  }

  // fetchJSON's errors carry the answer's body; show its `detail` when there is one.
  function why(err) {
    var text = (err && err.message) || String(err);
    var brace = text.indexOf("{");
    if (brace >= 0) {
      try {
        var body = JSON.parse(text.slice(brace));
        if (body && body.detail) return String(body.detail);
      } catch (e) { /* not JSON: the text as it is */ }
    }
    return text;
  }

  function when(iso) {
    if (!iso) return "";
    try {
      return SDK.utils.isoTimeAgo ? SDK.utils.isoTimeAgo(iso) : iso;
    } catch (e) {
      return iso;
    }
  }

  function ms(v) {
    if (v === null || v === undefined) return "–";
    return v < 10 ? v.toFixed(2) + " ms" : Math.round(v) + " ms";
  }

  function badge(text, tone) {
    return h("span", { className: "hh-badge hh-" + (tone || "plain") }, text);
  }

  function stateTone(status) {
    if (status === "running" || status === "idle" || status === "ready" || status === "in_gateway") return "ok";
    if (status === "failed" || status === "crashed" || status === "backoff") return "bad";
    return "warn";
  }

  // A hook's health (the service's `health`, from its last minutes) as a badge's tone.
  function healthTone(state) {
    if (state === "ok") return "ok";
    // Events that simply have not happened yet are no trouble (issue 60 row 5).
    if (state === "idle" || state === "never_matched") return "plain";
    if (state === "failing" || state === "dropping") return "bad";
    return "warn";
  }

  var HEALTH_TEXT = { ok: "healthy", idle: "idle", degraded: "degraded", failing: "failing",
    dropping: "dropping", slow: "slow", never_matched: "never matched" };

  // "1 event", "3 events".
  function plural(n, word) {
    return n + " " + word + (n === 1 ? "" : "s");
  }

  // Trouble first (issue 60 row 6): the worst health on top, then by name.
  var SEVERITY = { failing: 0, dropping: 1, degraded: 2, slow: 3, ok: 4, never_matched: 5, idle: 6 };

  function severity(hk) {
    var s = hk.recent ? SEVERITY[(hk.health || {}).state] : 7;
    return s === undefined ? 4 : s;
  }

  function bySeverity(a, b) {
    return severity(a) - severity(b) || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);
  }

  // A time of day, HH:MM on this browser's clock (with the date when not today).
  function clock(iso) {
    var d = new Date(iso);
    if (isNaN(d.getTime())) return iso;
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    var hm = pad(d.getHours()) + ":" + pad(d.getMinutes());
    return d.toDateString() === new Date().toDateString() ? hm : d.toISOString().slice(0, 10) + " " + hm;
  }

  // What to do about a hook in trouble, in a sentence (issue 60 row 6).
  function todo(hk, state) {
    var err = hk.last_error;
    if (state === "degraded" && err && err.ok_since > 0) {
      return "Recovering: " + plural(err.ok_since, "call") + " succeeded since its last error; nothing to do unless it fails again.";
    }
    if (state === "failing" || state === "degraded") {
      return "Fix its handler (its last error says why; a reload runs the fix) or disable it.";
    }
    if (state === "slow") {
      return "Make the handler faster or raise `timeout:` (" + hk.timeout_s + " s now) in its HOOK.yaml.";
    }
    if (state === "dropping") {
      return "Make the handler faster, or raise `queue: {capacity: N}` or `concurrency:` in its HOOK.yaml.";
    }
    return "";
  }

  // The line above the table: how many hooks are fine, how many are in trouble and which.
  function Summary(props) {
    var counts = {}, total = 0;
    props.hooks.forEach(function (hk) {
      var st = hk.recent ? (hk.health || {}).state || "ok" : "remote";
      counts[st] = (counts[st] || 0) + 1;
      total++;
    });
    var trouble = ["failing", "dropping", "degraded", "slow"].filter(function (k) { return counts[k]; });
    var inTrouble = trouble.reduce(function (a, k) { return a + counts[k]; }, 0);
    var parts = [h("strong", { key: "ok", className: "hh-ok" }, (counts.ok || 0) + " healthy"),
      h("strong", { key: "bad", className: inTrouble ? "hh-bad" : "hh-muted" }, inTrouble + " in trouble" +
        (inTrouble ? " (" + trouble.map(function (k) { return counts[k] + " " + HEALTH_TEXT[k]; }).join(", ") + ")" : ""))];
    [["idle", "idle"], ["never_matched", "never matched"], ["remote", "on the fleet's workers"]].forEach(function (kv) {
      if (counts[kv[0]]) parts.push(h("span", { key: kv[0], className: "hh-muted" }, counts[kv[0]] + " " + kv[1]));
    });
    var sep = [];
    parts.forEach(function (p, i) { if (i) sep.push(h("span", { key: "s" + i, className: "hh-muted" }, " · ")); sep.push(p); });
    return h("p", { className: "hh-summary", "data-summary": "1", "data-healthy": String(counts.ok || 0),
      "data-trouble": String(inTrouble), "data-total": String(total) }, sep);
  }

  // A count over the seconds the window covers, per minute.
  function perMin(n, seconds) {
    if (n === undefined || n === null || !seconds || seconds < 1) return "";
    var r = n * 60 / seconds;
    return (r >= 10 ? Math.round(r) : Math.round(r * 10) / 10) + "/min";
  }

  function Section(props) {
    return h(C.Card, { className: "hh-card", "data-section": props.id },
      h(C.CardHeader, null, h(C.CardTitle, null, props.title)),
      h(C.CardContent, null, props.children));
  }

  // The last hour as a small chart: twelve bars of five minutes each (issue 60 row 6: sixty
  // one-minute bars were 1-2 px lines), the events offered in grey, failures and drops in red
  // on top, the newest on the right. Drawn as SVG, no library.
  var SPAN = 5, BARS = 12;

  function buckets(trend) {
    var out = [];
    for (var i = 0; i < BARS; i++) out.push({ accepted: 0, bad: 0 });
    if (!trend.length) return out;
    var last = Math.floor(Date.parse(trend[trend.length - 1].at) / 60000);
    trend.forEach(function (m) {
      var ago = last - Math.floor(Date.parse(m.at) / 60000);
      var b = BARS - 1 - Math.floor(ago / SPAN);
      if (isNaN(ago) || b < 0 || b >= BARS) return;
      out[b].accepted += m.accepted || 0;
      out[b].bad += (m.failed || 0) + (m.dropped || 0);
    });
    return out;
  }

  function Sparkline(props) {
    var trend = props.trend || [];
    var W = 120, H = 28, GAP = 2;
    if (!trend.length) return h("span", { className: "hh-muted" }, "–");
    var bs = buckets(trend);
    var top = 1;
    bs.forEach(function (b) { top = Math.max(top, b.accepted, b.bad); });
    var bw = W / BARS;
    var bars = bs.map(function (b, i) {
      var x = i * bw;
      var ev = b.accepted ? Math.max(3, Math.round((b.accepted / top) * H)) : 1;
      var bh = b.bad ? Math.max(3, Math.round((Math.min(b.bad, b.accepted || b.bad) / top) * H)) : 0;
      return h("g", { key: i },
        h("rect", { x: x, y: H - ev, width: bw - GAP, height: ev, className: b.accepted ? "hh-spark-ev" : "hh-spark-none" }),
        bh ? h("rect", { x: x, y: H - bh, width: bw - GAP, height: bh, className: "hh-spark-bad" }) : null);
    });
    var total = bs.reduce(function (a, b) { return a + b.accepted; }, 0);
    var bad = bs.reduce(function (a, b) { return a + b.bad; }, 0);
    var label = "last hour, 5 minutes a bar: " + plural(total, "event") + ", " + bad + " failed or dropped";
    return h("svg", { className: "hh-spark", viewBox: "0 0 " + W + " " + H, width: W, height: H,
      role: "img", "aria-label": label }, h("title", null, label), bars);
  }

  // The last error, aged: when, and how many calls succeeded since (then it is history).
  function LastError(props) {
    var err = props.err;
    if (!err) return h("span", { className: "hh-muted" }, "none");
    var stale = err.ok_since > 0;
    return h("div", { className: "hh-lasterr" + (stale ? " hh-stale" : ""), title: err.message },
      h("div", { className: "hh-clamp" }, err.message),
      h("div", { className: "hh-muted" }, when(err.time) + (stale ? " · " + err.ok_since + " ok since" : " · current")));
  }

  function sandboxText(sb) {
    if (!sb) return "–";
    return sb.mode + (sb.enforced ? " (" + sb.enforced + ")" : "");
  }

  // Issue 49: which of Hermes's event families a hook takes: the agent's (pre_tool_call...,
  // forwarded by the Hermes plugin), the gateway's (agent:start...), or both; a shell hook of
  // config.yaml's hooks: block is named as such.
  var AGENT_EVENTS = ["pre_tool_call", "post_tool_call", "transform_terminal_output",
    "transform_tool_result", "transform_llm_output", "pre_llm_call", "post_llm_call",
    "pre_verify", "pre_api_request", "post_api_request", "api_request_error",
    "on_session_start", "on_session_end", "on_session_finalize", "on_session_reset",
    "subagent_start", "subagent_stop", "pre_gateway_dispatch", "pre_approval_request",
    "post_approval_response", "kanban_task_claimed", "kanban_task_completed",
    "kanban_task_blocked"];

  function globRegex(pattern) {
    var out = "", depth = 0;
    for (var i = 0; i < pattern.length; i++) {
      var ch = pattern[i];
      if (ch === "*") out += ".*";
      else if (ch === "?") out += ".";
      else if (ch === "{") { depth++; out += "(?:"; }
      else if (ch === "}" && depth) { depth--; out += ")"; }
      else if (ch === "," && depth) out += "|";
      else if (ch === "[" || ch === "]") out += ch;
      else out += ch.replace(/[.+^$()|\\]/g, "\\$&");
    }
    try { return new RegExp("^" + out + "$"); } catch (e) { return null; }
  }

  function family(hk) {
    if (/(^|\/)config-hooks\/?$/.test(hk.root || "")) return "shell hook (config.yaml)";
    var agent = false, gateway = false;
    (hk.events || []).forEach(function (p) {
      var rx = globRegex(String(p));
      if (rx && AGENT_EVENTS.some(function (e) { return rx.test(e); })) agent = true;
      if (String(p).indexOf(":") >= 0 || p === "*") gateway = true;
    });
    return agent && gateway ? "agent + gateway" : agent ? "agent" : "gateway";
  }

  function HookRow(props) {
    var hk = props.hook;
    var open = props.open;
    var fleet = Array.isArray(hk.workers);
    if (!hk.recent) return h(RemoteRow, { hook: hk, open: open, toggle: props.toggle });
    var r = hk.recent;
    var w = r.window || {};
    var health = hk.health || { state: "ok", reason: "" };
    return h("tr", { "data-hook": hk.name, "data-health": health.state, className: open ? "hh-open" : "" },
      h("td", { "data-label": "Hook", className: "hh-name" },
        h("button", { className: "hh-link", "aria-expanded": open ? "true" : "false", "data-action": "details",
          onClick: function () { props.toggle(hk.name); } }, h("strong", null, hk.name)),
        h("div", { className: "hh-muted" }, hk.kind + " · " + (hk.runs || (fleet ? "fleet" : "service")) +
          " · sandbox " + ((hk.sandbox && hk.sandbox.mode) || "none")),
        h("div", { className: "hh-muted hh-small", "data-family": family(hk) }, family(hk) + " events"),
        (hk.warnings || []).length ? h("div", { className: "hh-warn hh-small", "data-warnings": String(hk.warnings.length) },
          "⚠ " + hk.warnings.length + " warning" + (hk.warnings.length === 1 ? "" : "s")) : null),
      h("td", { "data-label": "Health", className: "hh-health" },
        h("div", { className: "hh-row" }, badge(HEALTH_TEXT[health.state] || health.state, healthTone(health.state)),
          health.since ? h("span", { className: "hh-small", "data-since": health.since, title: health.since },
            "since " + clock(health.since)) : null,
          hk.status !== "ready" && hk.status !== "busy" ? badge(hk.status, stateTone(hk.status)) : null),
        health.reason ? h("div", { className: "hh-muted hh-clamp", title: health.reason }, health.reason) : null,
        todo(hk, health.state) ? h("div", { className: "hh-todo hh-small", "data-todo": /^Recovering/.test(todo(hk, health.state))
          ? "recovering" : health.state }, todo(hk, health.state)) : null),
      h("td", { "data-label": "Last " + (r.window_minutes || 5) + " min", className: "hh-num" },
        h("div", { title: "over the last " + Math.round(r.window_s || 0) + " s" }, plural(w.accepted || 0, "event")),
        w.accepted ? h("div", { className: "hh-muted" }, perMin(w.accepted, r.window_s)) : null,
        h("div", { className: w.failed ? "hh-bad" : "hh-muted" }, w.failed + " failed"),
        w.timeouts ? h("div", { className: "hh-bad" }, "(" + w.timeouts + " timed out)") : null,
        h("div", { className: w.dropped ? "hh-bad" : "hh-muted" }, w.dropped + " dropped")),
      h("td", { "data-label": "Latency p50 / p95", className: "hh-num" },
        r.p50_ms === null || r.p50_ms === undefined ? h("span", { className: "hh-muted" }, "no call lately")
          : [h("div", { key: "p50" }, h("span", { className: "hh-muted" }, "p50 "), ms(r.p50_ms)),
            h("div", { key: "p95" }, h("span", { className: "hh-muted" }, "p95 "), ms(r.p95_ms))]),
      h("td", { "data-label": "Last hour" }, h(Sparkline, { trend: r.trend })),
      h("td", { "data-label": "Last error", className: "hh-error" }, h(LastError, { err: hk.last_error })),
      // A hook the fleet's workers run is theirs: disabling it here would act on this edge's
      // own hook folders, not on the workers, so the tab says where to do it instead.
      h("td", { "data-label": "", className: "hh-act" }, fleet
        ? h("span", { className: "hh-muted" }, "disable it on its workers")
        : h(C.Button, { size: "sm", variant: "outline", disabled: props.busy, "data-action": "disable",
          onClick: function () { props.askDisable(hk.name); } }, "Disable")));
  }

  // A hook the fleet's workers run: the edge has its totals, not its recent past, so the row
  // says so instead of a health it cannot know (the Fleet section has its lag and dead letters).
  function RemoteRow(props) {
    var hk = props.hook;
    var c = hk.counters || {};
    return h("tr", { "data-hook": hk.name, "data-health": "remote" },
      h("td", { "data-label": "Hook", className: "hh-name" }, h("strong", null, hk.name),
        h("div", { className: "hh-muted" }, hk.kind + " · fleet · on " + (hk.workers || []).join(", "))),
      h("td", { "data-label": "Health" }, badge("on the workers", "plain"),
        h("div", { className: "hh-muted" }, "see Fleet below")),
      h("td", { "data-label": "Since start", className: "hh-num" },
        h("div", null, count(c.ok) + " ok"),
        h("div", { className: c.failed ? "hh-bad" : "hh-muted" }, count(c.failed) + " failed"),
        h("div", { className: c.dropped ? "hh-bad" : "hh-muted" }, count(c.dropped) + " dropped")),
      h("td", { "data-label": "Latency p50 / p95", className: "hh-num" }, h("span", { className: "hh-muted" }, "–")),
      h("td", { "data-label": "Last hour" }, h("span", { className: "hh-muted" }, "–")),
      h("td", { "data-label": "Last error", className: "hh-error" }, h(LastError, { err: hk.last_error })),
      h("td", { "data-label": "", className: "hh-act" }, h("span", { className: "hh-muted" }, "disable it on its workers")));
  }

  // Everything about one hook, under its row: patterns, warnings, sandbox, counters since it
  // was first loaded, the queue, the whole last error, the last hour by minute.
  function Detail(props) {
    var hk = props.hook;
    var c = hk.counters || {};
    var q = hk.queue || {};
    var sb = hk.sandbox || {};
    var trend = ((hk.recent || {}).trend || []).slice(-15).reverse();
    // An entry of config.yaml's hooks: block shows what was written there, not the directory
    // the service made from it (issue 58).
    // One hook runs every entry of a command (issue 58 row 1): each is shown.
    var ces = hk.config_entries || (hk.config_entry ? [hk.config_entry] : []);
    var where = ces.length ? ces.map(function (ce) {
      return ["config.yaml", "hooks." + ce.event + "[" + ce.index + "]" +
        (ce.matcher === null || ce.matcher === undefined ? "" : " (matcher " + ce.matcher + ")")];
    }).concat([["command", ces[0].command]]) : [["handler", hk.handler], ["directory", hk.path]];
    var facts = [
      ["events", (hk.events || []).join(", ") + " (" + family(hk) + ")"],
    ].concat(where, [
      ["sandbox", sandboxText(sb)],
      ["timeout", hk.timeout_s + " s"],
      ["queue", q.depth + " of " + q.capacity + " (" + q.overflow + ")"],
      ["since first loaded", c.accepted + " offered, " + c.ok + " ok, " + c.failed + " failed (" + c.timeouts +
        " timed out), " + c.dropped + " dropped, " + c.restarts + " restarts"],
    ]);
    return h("tr", { className: "hh-detail", "data-detail": hk.name }, h("td", { colSpan: 7 },
      h("div", { className: "hh-grid" },
        h("ul", { className: "hh-facts" }, facts.map(function (kv, i) {
          return h("li", { key: kv[0] + i }, h("span", { className: "hh-muted" }, kv[0] + ": "), h("span", null, String(kv[1])));
        })),
        (hk.warnings || []).length ? h("div", { "data-detail-warnings": "1" }, h("strong", null, "Warnings"),
          h("ul", { className: "hh-list" }, hk.warnings.map(function (t, i) { return h("li", { key: i, className: "hh-warn" }, t); }))) : null,
        hk.last_error ? h("div", null, h("strong", null, "Last error"),
          h("pre", { className: "hh-pre hh-wrap" }, hk.last_error.message),
          h("div", { className: "hh-muted" }, hk.last_error.time + " · " + hk.last_error.ok_since + " ok since")) : null,
        trend.length ? h("div", null, h("strong", null, "Last minutes"),
          table(["Minute", "Events", "ok", "Failed", "Dropped", "p50 / p95"], trend.map(function (m) {
            return h("tr", { key: m.at },
              cell("Minute", (m.at || "").slice(11, 16)), cell("Events", String(m.accepted), "hh-num"),
              cell("ok", String(m.ok), "hh-num"), cell("Failed", String(m.failed), "hh-num"),
              cell("Dropped", String(m.dropped), "hh-num"),
              cell("p50 / p95", m.p50_ms === null ? "–" : ms(m.p50_ms) + " / " + ms(m.p95_ms), "hh-num"));
          }))) : null)));
  }

  // Asks before a hook is disabled: it stops, and a decision it gave is missing after.
  function DisableConfirm(props) {
    return h("tr", { className: "hh-detail", "data-confirm-disable": props.name }, h("td", { colSpan: 7 },
      h("div", { className: "hh-review" },
        h("p", null, "Disable ", h("strong", null, props.name), "? It stops receiving events now; if it gives ",
          "decisions, callers that fail closed will deny in its place. Its counters are kept."),
        h("div", { className: "hh-actions" },
          h(C.Button, { size: "sm", disabled: props.busy, "data-action": "confirm-disable",
            onClick: function () { props.confirm(props.name); } }, "Disable " + props.name),
          h(C.Button, { size: "sm", variant: "outline", onClick: props.cancel }, "Cancel")))));
  }

  function HooksTable(props) {
    if (!props.hooks.length) return h("p", { className: "hh-muted" }, "No hook is loaded.");
    var rows = [];
    props.hooks.slice().sort(bySeverity).forEach(function (hk) {
      rows.push(h(HookRow, { key: hk.name, hook: hk, busy: props.busy, open: props.open === hk.name,
        toggle: props.toggle, askDisable: props.askDisable }));
      if (props.disabling === hk.name) {
        rows.push(h(DisableConfirm, { key: hk.name + "-confirm", name: hk.name, busy: props.busy,
          confirm: props.confirmDisable, cancel: props.cancelDisable }));
      }
      if (props.open === hk.name) rows.push(h(Detail, { key: hk.name + "-detail", hook: hk }));
    });
    return h("div", null, h(Summary, { hooks: props.hooks }), h("div", { className: "hh-scroll" },
      h("table", { className: "hh-table hh-hooks" },
        h("colgroup", null, ["hh-c-name", "hh-c-health", "hh-c-rate", "hh-c-lat", "hh-c-trend", "hh-c-err", "hh-c-act"]
          .map(function (c) { return h("col", { key: c, className: c }); })),
        h("thead", null, h("tr", null,
          ["Hook", "Health", "Last 5 min", "Latency", "Last hour", "Last error", ""].map(function (t, i) { return h("th", { key: i }, t); }))),
        h("tbody", null, rows))));
  }

  // The code an approval lets run: every file, a diff for what changed since the recorded
  // approval (when its text was kept), the whole text of new files, unchanged ones folded.
  function Code(props) {
    if (!props.files.length) return null;
    return h("div", { className: "hh-code", "data-review-code": "1" }, props.files.map(function (f) {
      var tone = f.status === "unchanged" ? "plain" : f.status === "removed" ? "bad" : "warn";
      var body;
      if (f.diff) {
        body = h("pre", { className: "hh-pre", "data-diff": f.path }, f.diff.split("\n").map(function (line, i) {
          var c = line[0] === "+" ? "hh-add" : line[0] === "-" ? "hh-del" : line[0] === "@" ? "hh-muted" : "";
          return h("span", { key: i, className: c }, line + "\n");
        }));
      } else if (f.text !== null && f.text !== undefined) {
        body = h("pre", { className: "hh-pre", "data-text": f.path }, f.text);
      } else {
        body = h("p", { className: "hh-muted" }, f.status === "removed" ? "removed since the approval" : (f.note || ""));
      }
      return h("details", { key: f.path, open: f.status !== "unchanged", "data-file": f.path },
        h("summary", null, h("code", null, f.path), " ", badge(f.status, tone),
          f.status === "changed" && !f.diff ? h("span", { className: "hh-muted" }, " (the approved text was not kept: no diff)") : null),
        body);
    }));
  }

  function settingsOf(r) {
    return Object.keys(r.settings || {}).filter(function (k) { return k !== "sandbox"; });
  }

  // A config.yaml hook's entry (issue 60 row 2): the command the approval covers and the
  // script it names, shown before the handler hermes-hooks wrote for it.
  function ConfigEntry(props) {
    var e = props.entry;
    var sc = e.script;
    // Every entry of the command (issue 58 row 1: one hook runs them, in the order they came).
    var all = e.entries || [{ event: e.event, matcher: e.matcher, timeout: e.timeout_s }];
    return h("div", { "data-review-entry": e.at },
      h("p", null, "From ", h("code", null, e.at), " of config.yaml: ",
        all.map(function (x, i) {
          return h("span", { key: "e" + i }, i ? "; " : "", "on ", h("strong", null, x.event),
            x.matcher ? [" for tools matching ", h("code", { key: "m" }, x.matcher)] : null,
            " within " + x.timeout + " s");
        }), ", it runs:"),
      h("pre", { className: "hh-pre hh-wrap", "data-review-command": "1" }, e.command),
      sc ? h("div", { "data-review-script": sc.path },
        h("p", null, "The script it runs, ", h("code", null, sc.path), " (sha256 ", h("code", null, sc.sha256), "):"),
        h("pre", { className: "hh-pre" }, sc.text),
        sc.note ? h("p", { className: "hh-muted" }, sc.note) : null)
        : h("p", { className: "hh-muted" }, "The command names no script this service can read."));
  }

  function Review(props) {
    var r = props.review;
    var files = Object.keys(r.files || {});
    var entry = r.config_entry;
    var fileList = [h("div", { key: "files", className: "hh-scroll" }, h("table", { className: "hh-table hh-files" },
        h("thead", null, h("tr", null, h("th", null, "File"), h("th", null, "SHA-256"))),
        h("tbody", null, files.map(function (f) {
          return h("tr", { key: f }, h("td", { "data-label": "File" }, f),
            h("td", { "data-label": "SHA-256" }, h("code", null, r.files[f])));
        })))),
      h(Code, { key: "code", files: r.code || [] })];
    return h("div", { className: "hh-review", "data-review": r.name },
      entry ? h("p", null, "Approving ", h("strong", null, r.name), " lets this command of config.yaml run for the agent's ",
        h("strong", null, (entry.entries || [entry]).map(function (x) { return x.event; })
          .filter(function (v, i, a) { return a.indexOf(v) === i; }).join(", ")),
        " events; the approval records sha256 ", h("code", null, r.sha256),
        " (the handler hermes-hooks wrote for it, with the command).")
        : h("p", null, "Approving ", h("strong", null, r.name), " (", r.kind, ") lets these files run; ",
          "the approval records sha256 ", h("code", null, r.sha256), "."),
      entry ? h(ConfigEntry, { entry: entry }) : null,
      r.syntax_error ? h("p", { className: "hh-bad", role: "alert", "data-review-syntax": "1" },
        "This version would not load: " + r.syntax_error) : null,
      r.approved ? h("p", { className: "hh-muted" }, "Approved before: sha256 ", h("code", null, r.approved.sha256),
        " (", when(r.approved.approved_at), ")") : null,
      h("p", { "data-review-sandbox": r.sandbox || "" }, "Sandbox: ", h("strong", null, r.sandbox || "unknown"),
        /^none\b/.test(r.sandbox || "") ? " (nothing confined: the hook can do whatever this user can)" : null),
      settingsOf(r).length ? h("div", { className: "hh-scroll" }, h("table", { className: "hh-table hh-files" },
        h("thead", null, h("tr", null, h("th", null, "Setting (covered by the approval)"), h("th", null, "Value"))),
        h("tbody", null, settingsOf(r).map(function (k) {
          return h("tr", { key: k }, h("td", { "data-label": "Setting" }, k),
            h("td", { "data-label": "Value" }, h("code", null, r.settings[k])));
        })))) : null,
      entry ? h("details", { "data-review-made": "1" }, h("summary", null,
        "The files hermes-hooks wrote for it (the same handler for every config.yaml hook; entry.py holds the command)"),
        fileList) : fileList,
      h("div", { className: "hh-actions" },
        h(C.Button, { size: "sm", disabled: props.busy, onClick: props.approve }, entry ? "Approve this command" : "Approve these files"),
        h(C.Button, { size: "sm", variant: "outline", onClick: props.cancel }, "Cancel")));
  }

  function Skipped(props) {
    if (!props.skipped.length) return h("p", { className: "hh-muted" }, "Every hook directory loaded.");
    return h("ul", { className: "hh-list" }, props.skipped.map(function (s) {
      var name = s.name || s.dir;
      var canApprove = (s.code === "not_approved" || s.code === "revoked") && s.name;
      var canEnable = s.code === "disabled" && s.name;
      var review = props.review && props.review.name === s.name ? props.review : null;
      return h("li", { key: s.dir, "data-skipped": name },
        h("div", { className: "hh-row" }, h("strong", null, name), badge(s.code, "bad"),
          canApprove && !review ? h(C.Button, { size: "sm", disabled: props.busy,
            onClick: function () { props.showReview(s.name); } }, "Review and approve") : null,
          canEnable ? h(C.Button, { size: "sm", disabled: props.busy,
            onClick: function () { props.act("enable", s.name); } }, "Enable") : null),
        h("div", { className: "hh-reason" }, s.reason),
        h("div", { className: "hh-muted" }, s.file || s.dir),
        review ? h(Review, { review: review, busy: props.busy, approve: props.approve, cancel: props.cancel }) : null);
    }));
  }

  // What a notice says happened, in words: its tone, its label and the detail.
  function describe(n) {
    var t = n.type;
    if (t === "handler_timeout") {
      return ["bad", "timed out", (n.event ? n.event + ": " : "") + "no answer within " + n.timeout_s + " s; the call was stopped"];
    }
    if (t === "handler_error") {
      return ["bad", "failed", (n.event ? n.event + ": " : "") + (n.error || "") +
        (n.events > 1 ? " (" + n.events + " waiting events)" : "")];
    }
    if (t === "hook_reloaded" && (n.error || n.kept_previous)) {
      return ["bad", "reload failed", "the new version did not load: " + (n.error || "") +
        (n.kept_previous ? "; the previous version keeps running" : "")];
    }
    if (t === "hook_reloaded") return ["ok", "reloaded", "the new version runs" + (n.kind ? " (" + n.kind + ")" : "")];
    if (t === "hook_loaded") return ["ok", "loaded", (n.kind || "") + (n.events ? " on " + n.events.join(", ") : "")];
    if (t === "hook_unloaded") return ["plain", "unloaded", n.queued ? n.queued + " queued event(s) drain first" : ""];
    if (t === "hook_skipped") return ["bad", "not loaded", n.reason || ""];
    if (t === "queue_overflow") {
      return ["bad", "dropping", n.dropped + " event(s) dropped: the queue of " + n.capacity + " is full (" +
        n.overflow + "); " + n.total_dropped + " in all"];
    }
    if (t === "worker_restart") return ["warn", "restarted", "its worker was restarted (" + n.restarts + " restarts in all)"];
    if (t === "host_start") return ["ok", "service started", n.address || ""];
    return [/fail|skip|error|timeout|drop/.test(t) ? "bad" : "plain", t.replace(/_/g, " "),
      n.reason || n.error || n.message || ""];
  }

  function Tail(props) {
    if (!props.notices.length) return h("p", { className: "hh-muted" }, "Nothing yet.");
    return h("ol", { className: "hh-tail" }, props.notices.slice().reverse().map(function (n) {
      var what = n.name || n.hook || "";
      var d = describe(n);
      return h("li", { key: n.seq, "data-notice": n.type },
        h("span", { className: "hh-muted" }, (n.time || "").replace("T", " ").replace("Z", "")), " ",
        badge(d[1], d[0]), " ",
        what ? h("strong", null, what) : null, d[2] ? " " + d[2] : "");
    }));
  }

  function table(heads, rows) {
    return h("div", { className: "hh-scroll" }, h("table", { className: "hh-table" },
      h("thead", null, h("tr", null, heads.map(function (t, i) { return h("th", { key: i }, t); }))),
      h("tbody", null, rows)));
  }

  function cell(label, content, className) {
    return h("td", { "data-label": label, className: className }, content);
  }

  function count(n) {
    return n === null || n === undefined ? "–" : String(n);
  }

  // The workers that report to the edge (each one's hooks, when it was last heard from).
  function Workers(props) {
    if (!props.workers.length) return h("p", { className: "hh-muted" }, "No worker reports to this edge.");
    return table(["Worker", "Host", "PID", "Last seen", "Hooks"], props.workers.map(function (w) {
      return h("tr", { key: w.worker, "data-worker": w.worker },
        cell("Worker", h("strong", null, w.worker)), cell("Host", w.host), cell("PID", count(w.pid), "hh-num"),
        cell("Last seen", (w.last_seen_ms / 1000).toFixed(1) + " s ago", "hh-num"),
        cell("Hooks", (w.hooks || []).join(", ")));
    }));
  }

  // The fleet's hooks: who serves each, how far behind the stream it is, what went dead.
  function Lag(props) {
    if (!props.hooks.length) return null;
    return table(["Hook", "Workers", "Lag (events)", "Acked", "Retried", "Dead"], props.hooks.map(function (hk) {
      var f = hk.fleet || {};
      return h("tr", { key: hk.name, "data-fleet-hook": hk.name },
        cell("Hook", h("strong", null, hk.name)), cell("Workers", (hk.workers || []).join(", ") || "none"),
        cell("Lag (events)", count(hk.lag), "hh-num"), cell("Acked", count(f.acked), "hh-num"),
        cell("Retried", count(f.retried), "hh-num"), cell("Dead", count(f.dead), "hh-num"));
    }));
  }

  // Asks before a replay, as the approval does: what will be queued again, for which hook.
  function Confirm(props) {
    var c = props.confirm;
    return h("div", { className: "hh-review", "data-confirm": c.hook },
      h("p", null, "Queue ", h("strong", null, c.count + " dead letter" + (c.count === 1 ? "" : "s")),
        " of ", h("strong", null, c.hook), " again? The hook runs ", c.count === 1 ? "it" : "them",
        " again (its workers take ", c.count === 1 ? "it" : "them", " from the stream), and ",
        c.count === 1 ? "it leaves" : "they leave", " this list."),
      h("div", { className: "hh-actions" },
        h(C.Button, { size: "sm", disabled: props.busy, onClick: props.replay }, "Replay"),
        h(C.Button, { size: "sm", variant: "outline", onClick: props.cancel }, "Cancel")));
  }

  // The dead letters, one group per hook, each with its Replay buttons.
  function DeadLetters(props) {
    var d = props.dead;
    if (!d) return h("p", { className: "hh-muted" }, "Loading the dead letters…");
    if (d.error) return h("p", { className: "hh-bad", role: "alert" }, "The dead letters cannot be read: " + d.error);
    var letters = d.letters || [];
    if (!letters.length) return h("p", { className: "hh-muted", "data-dead-empty": "1" }, "No dead letters.");
    var groups = [], byHook = {};
    letters.forEach(function (l) {
      if (!byHook[l.hook]) { byHook[l.hook] = []; groups.push(l.hook); }
      byHook[l.hook].push(l);
    });
    function ask(hook, seqs) {
      var n = seqs ? seqs.length : byHook[hook].length;
      props.ask({ hook: hook, count: n, body: seqs ? { seqs: seqs } : { hook: hook, all: true } });
    }
    return h("div", { className: "hh-grid" }, groups.map(function (hook) {
      var list = byHook[hook];
      var c = props.confirm && props.confirm.hook === hook ? props.confirm : null;
      return h("div", { key: hook, "data-dead-hook": hook },
        h("div", { className: "hh-row" }, h("strong", null, hook), badge(list.length + " dead", "bad"),
          h(C.Button, { size: "sm", disabled: props.busy, "data-action": "replay-all",
            onClick: function () { ask(hook, null); } }, "Replay all " + list.length)),
        c ? h(Confirm, { confirm: c, busy: props.busy, replay: props.replay, cancel: props.cancel }) : null,
        table(["Seq", "Event", "Error", "When", "Deliveries", "Worker", ""], list.map(function (l) {
          return h("tr", { key: l.seq, "data-dead-seq": String(l.seq) },
            cell("Seq", String(l.seq), "hh-num"), cell("Event", l.event), cell("Error", l.error, "hh-error"),
            cell("When", h("span", { title: l.time }, when(l.time))), cell("Deliveries", count(l.deliveries), "hh-num"),
            cell("Worker", l.worker),
            cell("", h(C.Button, { size: "sm", variant: "outline", disabled: props.busy, "data-action": "replay",
              onClick: function () { ask(hook, [l.seq]); } }, "Replay")));
        })));
    }), d.more ? h("p", { className: "hh-muted" }, "More dead letters follow the ones shown: `hermes-hooks dead list` shows them all.") : null);
  }

  // Fleet mode (the service is a fleet edge): the edge's own state, its workers, the lag of
  // each hook, and the dead letters with their replay (the service's /v1/dead routes).
  function Fleet(props) {
    var f = props.state.fleet;
    if (!f || typeof f !== "object") return null;
    var facts = [["state", f.state + (f.degraded_reason ? " (" + f.degraded_reason + ")" : "")],
      ["broker", f.broker], ["buffered", f.buffered + " / " + f.buffer_capacity],
      ["published", f.published], ["dead letters", count(f.dead_letters)]];
    var fleetHooks = (props.state.hooks || []).filter(function (hk) { return Array.isArray(hk.workers); });
    return h(Section, { id: "fleet", title: "Fleet" },
      h("div", { className: "hh-grid" },
        h("ul", { className: "hh-list" }, facts.map(function (kv) {
          return h("li", { key: kv[0] }, h("span", { className: "hh-muted" }, kv[0] + ": "), String(kv[1]));
        })),
        h("div", { "data-fleet": "workers" }, h("strong", null, "Workers (" + (f.workers || []).length + ")"),
          h(Workers, { workers: f.workers || [] })),
        fleetHooks.length ? h("div", { "data-fleet": "lag" }, h("strong", null, "Hooks on the workers"),
          h(Lag, { hooks: fleetHooks })) : null,
        h("div", { "data-fleet": "dead" }, h("strong", null, "Dead letters"),
          h(DeadLetters, { dead: props.dead, busy: props.busy, confirm: props.confirm, ask: props.ask,
            replay: props.replay, cancel: props.cancel }))));
  }

  function HooksPage() {
    var _s = useState(null), state = _s[0], setState = _s[1];
    var _e = useState(null), loadError = _e[0], setLoadError = _e[1];
    var _n = useState([]), notices = _n[0], setNotices = _n[1];
    var _m = useState(null), message = _m[0], setMessage = _m[1];
    var _b = useState(false), busy = _b[0], setBusy = _b[1];
    var _r = useState(null), review = _r[0], setReview = _r[1];
    var _d = useState(null), dead = _d[0], setDead = _d[1];
    var _c = useState(null), confirm = _c[0], setConfirm = _c[1];
    var _o = useState(null), open = _o[0], setOpen = _o[1];
    var _x = useState(null), disabling = _x[0], setDisabling = _x[1];
    var last = useRef(0);

    // The dead letters are read only from a fleet edge (any other service has none), and not
    // while the edge counts none in the stream (each read walks the stream's messages).
    var refresh = useCallback(function () {
      return get("/state").then(function (s) {
        setState(s); setLoadError(null);
        if (!s.running || !s.fleet) { setDead(null); return; }
        if (s.fleet.dead_letters === 0) { setDead({ letters: [], more: false }); return; }
        return get("/dead").then(setDead).catch(function (e) { setDead({ error: why(e) }); });
      }).catch(function (e) { setLoadError(why(e)); });
    }, []);

    var tail = useCallback(function () {
      return get("/notices?after=" + last.current).then(function (r) {
        if (r.last < last.current) last.current = 0; // the service restarted: start again
        if (!r.notices || !r.notices.length) { last.current = r.last; return; }
        last.current = r.last;
        setNotices(function (old) { return old.concat(r.notices).slice(-TAIL_KEEP); });
      }).catch(function () { /* the state says when the service is down */ });
    }, []);

    useEffect(function () {
      refresh(); tail();
      var a = setInterval(refresh, STATE_EVERY_MS);
      var b = setInterval(tail, TAIL_EVERY_MS);
      return function () { clearInterval(a); clearInterval(b); };
    }, [refresh, tail]);

    function done(p, what) {
      setBusy(true);
      return p.then(function (r) {
        setMessage({ ok: true, text: (r && r.message) || what });
      }).catch(function (e) {
        setMessage({ ok: false, text: why(e) });
      }).then(function () { setBusy(false); refresh(); tail(); });
    }

    function act(verb, name) {
      if (verb === "enable") {
        // An enable carries the digest of what it enables (the backend refuses one without).
        return done(get("/review/" + encodeURIComponent(name)).then(function (r) {
          return post("/hooks/" + encodeURIComponent(name) + "/enable", { reviewed: r.digest });
        }), "enable " + name);
      }
      return done(post("/hooks/" + encodeURIComponent(name) + "/" + verb), verb + " " + name);
    }

    function reload() {
      return done(post("/reload").then(function (r) {
        return { message: "reloaded: " + (r.loaded || []).length + " loaded, " + (r.skipped || []).length + " not loaded" };
      }), "reloaded");
    }

    function showReview(name) {
      setBusy(true);
      get("/review/" + encodeURIComponent(name)).then(setReview)
        .catch(function (e) { setMessage({ ok: false, text: why(e) }); })
        .then(function () { setBusy(false); });
    }

    function approve() {
      var r = review;
      setReview(null);
      return done(post("/hooks/" + encodeURIComponent(r.name) + "/enable", { reviewed: r.digest }), "approved " + r.name);
    }

    function replay() {
      var c = confirm;
      setConfirm(null);
      return done(post("/dead/replay", c.body).then(function (r) {
        var n = (r.replayed || []).length;
        return { message: "replayed " + n + " dead letter" + (n === 1 ? "" : "s") + " of " + c.hook };
      }), "replayed");
    }

    var header = h("div", { className: "hh-head" },
      h("h1", { className: "hh-title" }, "Hooks"),
      state && state.running ? badge("service running · " + state.address + " · trust " + state.trust, "ok") : null,
      h(C.Button, { size: "sm", disabled: busy || !(state && state.running), onClick: reload, "data-action": "reload" }, "Reload"));

    var body;
    if (loadError) {
      body = h("div", { className: "hh-down", role: "alert" }, "The dashboard cannot reach the Hooks backend: " + loadError);
    } else if (!state) {
      body = h("p", { className: "hh-muted" }, "Loading…");
    } else if (!state.running) {
      body = h("div", { className: "hh-down", role: "alert", "data-down": "1" },
        h("strong", null, "The hermes-hooks service is not running."), h("div", null, state.problem),
        h("div", { className: "hh-muted" }, "Start it with `hermes-hooks serve` (or start the gateway with the hermes-hooks client, which starts it)."));
    } else {
      body = h("div", { className: "hh-grid" },
        h(Section, { id: "hooks", title: "Loaded hooks (" + (state.hooks || []).length + ")" },
          h(HooksTable, { hooks: state.hooks || [], busy: busy, open: open,
            toggle: function (name) { setOpen(open === name ? null : name); },
            disabling: disabling, askDisable: setDisabling, cancelDisable: function () { setDisabling(null); },
            confirmDisable: function (name) { setDisabling(null); act("disable", name); } })),
        h(Section, { id: "skipped", title: "Not loaded (" + (state.skipped || []).length + ")" },
          h(Skipped, { skipped: state.skipped || [], act: act, busy: busy, review: review,
            showReview: showReview, approve: approve, cancel: function () { setReview(null); } })),
        h(Section, { id: "roots", title: "Hook roots" },
          h("ul", { className: "hh-list" }, (state.roots || []).map(function (r) { return h("li", { key: r }, h("code", null, r)); }))),
        h(Fleet, { state: state, dead: dead, busy: busy, confirm: confirm, ask: setConfirm, replay: replay,
          cancel: function () { setConfirm(null); } }),
        h(Section, { id: "tail", title: "Live tail" }, h(Tail, { notices: notices })));
    }

    return h("div", { className: "hh-page" }, header,
      message ? h("div", { className: "hh-message hh-" + (message.ok ? "ok" : "bad"), role: "status" }, message.text) : null,
      body);
  }

  PLUGINS.register("hermes-hooks-dashboard", HooksPage);
})();
