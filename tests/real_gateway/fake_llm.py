"""A stand-in model provider for the real-gateway test: a stdlib OpenAI-compatible server.

``python3 fake_llm.py PORT_FILE`` binds 127.0.0.1:0, writes its port to PORT_FILE and answers
``POST .../chat/completions`` (streamed or not) and ``GET .../models``. A turn whose last message
is the user's gets a tool call (``hh_probe``, a tool no gateway has: the agent answers it with an
error and asks again, so the turn takes two steps and ``agent:step`` fires); a turn after a tool
result gets a plain answer naming the user's message. Every request body is appended to
``PORT_FILE.requests`` (one JSON object a line), its arrival time to
``PORT_FILE.requests.times``.

``HH_FAKE_TOOL`` and ``HH_FAKE_ARGS`` (JSON) name another tool call to make (issue 49's tests:
``terminal`` with a command); the plain answer after it then quotes the tool's result.
"""

import os

import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL = "hh-fake-model"


def reply_for(messages):
    """``(content, tool_calls)`` for a conversation so far."""
    last = messages[-1] if messages else {}
    users = [m for m in messages if m.get("role") == "user"]
    said = users[-1].get("content") if users else ""
    if isinstance(said, list):  # content parts
        said = " ".join(p.get("text", "") for p in said if isinstance(p, dict))
    tool = os.environ.get("HH_FAKE_TOOL")
    if last.get("role") == "tool":
        if tool:
            return "fake answer; the tool said: %s" % str(last.get("content"))[:400], None
        return "fake answer to: %s" % str(said)[-80:], None
    args = os.environ.get("HH_FAKE_ARGS") if tool else None
    call = {"id": "call_hh_1", "type": "function",
            "function": {"name": tool or "hh_probe", "arguments": args or json.dumps({"q": "x"})}}
    return None, [call]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.rstrip("/").endswith("/models"):
            self._json(200, {"object": "list", "data": [
                {"id": MODEL, "object": "model", "created": 0, "owned_by": "hh",
                 "context_length": 128000}]})
        else:
            self._json(404, {"error": {"message": "not found"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        with open(self.server.requests_path, "a") as f:
            f.write(json.dumps(body) + "\n")
        with open(self.server.requests_path + ".times", "a") as f:
            f.write("%.6f\n" % time.time())
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._json(404, {"error": {"message": "only chat/completions here"}})
            return
        content, calls = reply_for(body.get("messages", []))
        finish = "tool_calls" if calls else "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        base = {"id": "chatcmpl-hh", "created": int(time.time()), "model": MODEL}
        if not body.get("stream"):
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            self._json(200, dict(base, object="chat.completion", usage=usage, choices=[
                {"index": 0, "message": message, "finish_reason": finish}]))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        delta = {"role": "assistant"}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = [dict(c, index=i) for i, c in enumerate(calls)]
        chunks = [
            dict(base, object="chat.completion.chunk",
                 choices=[{"index": 0, "delta": delta, "finish_reason": None}]),
            dict(base, object="chat.completion.chunk",
                 choices=[{"index": 0, "delta": {}, "finish_reason": finish}]),
            dict(base, object="chat.completion.chunk", choices=[], usage=usage),
        ]
        for chunk in chunks:
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


def main():
    port_file = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.requests_path = port_file + ".requests"
    with open(port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
