"""The Hooks tab's backend proves the service before its token leaves (issue 46, row 5).

Run by .ci/dashboard.sh with the Python of the dashboard's venv (it has FastAPI, which the
plugin's backend imports, and our client installed):

    python tests/dashboard/impostor.py --bin target/debug/hermes-hooks

1. An impostor listens on a loopback port and answers every request like a service would
   (200, the protocol header, `{"hooks": []}`), recording what it was sent. With
   `HERMES_HOOKS_ADDRESS` pointing there and a token set, the backend's `/state` must say the
   service is not running (not "running") and the impostor must never see the token.
2. The real service with that token on another port: `/state` says running, and an action
   (`reload`) goes through, the proof first.
"""

import argparse
import os
import shutil
import socket
import subprocess
import tempfile
import threading

from procs import free_port, stop, wait_for

TOKEN = "impostor-test-token-0123456789abcdef"


def say(msg):
    print("impostor: %s" % msg, flush=True)


class Impostor:
    """Answers every request with 200 and a plausible body; keeps the raw requests."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.seen = []
        self.stop = False
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn):
        conn.settimeout(5)
        buf = b""
        try:
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                buf += chunk
                self.seen.append(chunk)
                while b"\r\n\r\n" in buf:
                    head, _, rest = buf.partition(b"\r\n\r\n")
                    length = 0
                    for line in head.split(b"\r\n"):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":", 1)[1])
                    if len(rest) < length:
                        break
                    buf = rest[length:]
                    body = b'{"hooks": [], "skipped": [], "proof": "00", "status": "ok", "version": "x"}'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nHermes-Hooks-Protocol: 1\r\n"
                                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                                 % len(body) + body)
        except OSError:
            pass
        finally:
            conn.close()




def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args = ap.parse_args()
    impostor = Impostor()
    os.environ["HERMES_HOOKS_ADDRESS"] = "http://127.0.0.1:%d" % impostor.port
    os.environ["HERMES_HOOKS_TOKEN"] = TOKEN
    # The file `hermes-hooks dashboard install` ships, loaded by path as the dashboard does.
    import importlib.util
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "clients", "python", "hermes_hooks", "dashboard_plugin",
                        "plugin_api.py")
    spec = importlib.util.spec_from_file_location("hermes_hooks_plugin_api", path)
    plugin_api = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin_api)
    state = plugin_api.state()
    assert state.get("running") is False, "the tab would show an impostor as running: %r" % state
    assert "prove" in state.get("problem", ""), state
    seen = b"".join(impostor.seen)
    assert TOKEN.encode() not in seen, "the token reached the impostor: %r" % seen[:400]
    assert b"POST /v1/proof" in seen, "no proof was asked: %r" % seen[:400]
    say("an impostor on the port got no token and the tab says: %s" % state["problem"])

    tmp = tempfile.mkdtemp(prefix="hermes-hooks-impostor-")
    home = os.path.join(tmp, "home")
    os.makedirs(os.path.join(home, "hooks"), mode=0o700)
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    port = free_port()
    env = dict(os.environ, HERMES_HOME=home, HOME=tmp)
    service = subprocess.Popen([args.bin, "serve", "--listen", "127.0.0.1:%d" % port,
                                "--token-file", token_file], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.environ["HERMES_HOOKS_ADDRESS"] = "http://127.0.0.1:%d" % port
        wait_for("the real service in the tab's state", lambda: plugin_api.state().get("running"))
        answer = plugin_api.reload()
        assert "loaded" in answer or "hooks" in answer or answer, answer
        say("the real service proved itself and took a reload")
    finally:
        impostor.stop = True
        impostor.sock.close()
        stop(service)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
