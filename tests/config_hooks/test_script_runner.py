"""Issue 58: `script_runner.run_command` (src/config_hooks/) against `subprocess.run`.

Each case runs the same command both ways, with the same stdin, timeout and directory, and
compares returncode, stdout and stderr (or the exception): a Python script run by the fork
server must be what a fresh interpreter gives. Every script also prints its parent's pid on a
line of its own (`PPID n`), left out of the comparison and checked apart: the fork server's
pid when the fast path ran it, this process's when it ran as a process (a comparison that
passed on the slow path would prove nothing).

Run by tests/it/script_runner.rs (`python3 -m unittest -v test_script_runner` here); standard
library only.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "src", "config_hooks"))

import script_runner  # noqa: E402

PYTHON = os.path.realpath(sys.executable)
# The fork server stands in for CPython 3.11+ only; below, every script runs as a process (and
# the comparisons still hold).
FORKS = sys.version_info >= (3, 11)

REPORT = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv, "name": __name__, "file": __file__, "path": sys.path,
    "cwd": os.getcwd(), "executable": sys.executable,
    "orig_argv": getattr(sys, "orig_argv", None), "globals": sorted(globals()),
    "loader": type(__loader__).__name__, "spec": __spec__, "cached": __cached__,
    "main_is_us": sys.modules["__main__"].__dict__ is globals(),
    "env": os.environ.get("HH_RUNNER_VAR"), "stdin": sys.stdin.read(),
    "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
    "stdio": [(s.name, s.mode, s.encoding, s.errors, s.line_buffering, s.write_through)
              for s in (sys.stdin, sys.stdout, sys.stderr)],
    "flags": list(sys.flags), "umask": os.umask(0o22),
    "atexit": __import__("atexit")._ncallbacks(),
    "modules_we_never_import": [m for m in ("_socket", "gc", "select") if m in sys.modules],
}, sort_keys=True))
"""

SCRIPTS = {
    "report.py": REPORT,
    "exit3.py": "import sys\nprint('out before')\nsys.exit(3)\n",
    "exit_none.py": "import sys\nsys.exit()\n",
    "exit_msg.py": "import sys\nprint('partial', end='')\nsys.exit('refused: no rm -rf')\n",
    "exit_big.py": "import sys\nsys.exit(256 + 7)\n",
    "exit_bool.py": "import sys\nsys.exit(True)\n",
    "raises.py": "def f():\n    raise ValueError('bad input')\n\nprint('before')\nf()\n",
    "syntax.py": "print('never'\nx = = 1\n",
    "os_exit.py": "import os, sys\nsys.stdout.write('lost?')\nos._exit(7)\n",
    "killed.py": ("import os, signal\nprint('x', flush=True)\n"
                  "os.kill(os.getpid(), signal.SIGTERM)\n"),
    "interrupt.py": "raise KeyboardInterrupt\n",
    "atexit_.py": ("import atexit, sys\n"
                   "atexit.register(lambda: print('at exit', file=sys.stderr))\n"
                   "atexit.register(lambda: print('at exit out'))\nprint('body')\n"),
    "unclosed.py": ("import sys\nf = open(sys.argv[1], 'w')\nf.write('kept')\nclass D:\n"
                    "    def __del__(self):\n        print('del ran')\nd = D()\n"),
    "thread.py": ("import threading, time\ndef late():\n    time.sleep(0.2)\n    print('thread')\n"
                  "threading.Thread(target=late).start()\nprint('main done')\n"),
    # What a script leaves to its end, after its last line (its fork tells its status before
    # it ends: all of it must have happened by then, and be as a fresh interpreter has it).
    "atexit_late.py": ("import atexit, os, sys, time\n"
                       "def late():\n    time.sleep(0.2)\n    os.write(1, b'raw at exit\\n')\n"
                       "    print('buffered at exit', end='')\n"
                       "    print('stderr at exit', file=sys.stderr)\n"
                       "atexit.register(late)\nprint('body')\n"),
    "thread_late.py": ("import atexit, os, sys, threading, time\n"
                       "def late():\n    time.sleep(0.3)\n"
                       "    os.write(2, b'raw from the thread\\n')\n"
                       "    atexit.register(print, 'registered by the thread')\n"
                       "    print('thread', end='')\n"
                       "threading.Thread(target=late).start()\nsys.exit(4)\n"),
    "thread_os_exit.py": ("import os, threading, time\n"
                          "def late():\n    time.sleep(0.2)\n    print('bye', flush=True)\n"
                          "    os._exit(9)\n"
                          "threading.Thread(target=late).start()\nprint('main done')\n"),
    "killed_hard.py": ("import os, signal, sys\nprint('x', flush=True)\n"
                       "sys.stdout.write('never flushed')\n"
                       "os.kill(os.getpid(), signal.SIGKILL)\n"),
    "killed_at_exit.py": ("import atexit, os, signal\nprint('body')\n"
                          "atexit.register(os.kill, os.getpid(), signal.SIGTERM)\n"),
    "forks.py": ("import os, sys\nprint('before', end='')\npid = os.fork()\n"
                 "if pid == 0:\n    print(' in the fork')\n    sys.exit(7)\n"
                 "print('the fork ended', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"),
    "leaves_a_process.py": ("import subprocess, sys\n"
                            "subprocess.Popen([sys.executable, '-c', 'import time; "
                            "time.sleep(0.3); print(\"late\")'])\nprint('script done')\n"),
    "priority.py": "import os\nprint(os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))\n",
    "echo.py": "import sys\nsys.stdout.write(sys.stdin.read())\n",
    "big.py": ("import sys\nfor i in range(20000):\n    sys.stdout.write('o' * 99 + '\\n')\n"
               "    sys.stderr.write('e' * 99 + '\\n')\n"),
    "deaf.py": "print('not reading stdin')\n",
    "sleep.py": "import sys, time\nprint('start', flush=True)\ntime.sleep(30)\n",
    "latin1.py": "import sys\nsys.stdout.buffer.write(b'caf\\xe9\\n')\n",
    "crlf.py": "import sys\nsys.stdout.write('a\\r\\nb\\rc\\n')\n",
    "excepthook.py": ("import sys\ndef hook(t, v, tb):\n"
                      "    print('hooked', t.__name__, file=sys.stderr)\n"
                      "sys.excepthook = hook\nraise RuntimeError('x')\n"),
    "warns.py": "x = 1\nprint(x is 1, '\\d')\n",
    "nul.py": "print('a')\0\n",
    "stdout_gone.py": "import sys, os\nprint('x' * 10)\nsys.stdout.close()\n",
    # Regular expressions (str and bytes, with flags), one whose compiling warns (a possible
    # nested set): the server keeps what earlier runs compiled (`_learn`).
    "regex.py": ("import re, sys\ndata = sys.stdin.read()\n"
                 "print(re.search(r'\\brm\\s+-[a-z]*r[a-z]*f', data) is not None)\n"
                 "print(re.findall(r'(?m)^git (\\w+)', 'git push\\ngit pull'))\n"
                 "print(re.search('ROOT', data, re.IGNORECASE) is not None)\n"
                 "print(re.match(rb'\\x00[a-f]+', b'\\x00abc').group())\n"
                 "print(re.sub(r'[[]x', '-', '[x'))\n"),
    "regex_cache.py": ("import re\nprint(*[(str, p, 0) in re._cache\n"
                       "         for p in (r'(?m)^git (\\w+)', r'[[]x')])\n"),
}


def with_ppid(body):
    """The script, first printing its parent's pid on a line apart (to stderr: stdout stays
    the script's own)."""
    return "import os as _o, sys as _s\n_s.stderr.write('PPID %d\\n' % _o.getppid())\n" \
        "_s.stderr.flush()\ndel _o, _s\n" + body


class Scripts(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="hh-runner-")
        cls.sub = os.path.join(cls.dir, "sub")
        os.makedirs(cls.sub)
        for name, body in SCRIPTS.items():
            for prefix, folder in (("#!%s\n" % PYTHON, cls.dir),
                                   ("#!/usr/bin/env python3\n", cls.sub)):
                path = os.path.join(folder, name)
                with open(path, "w") as f:
                    f.write(prefix + with_ppid(body))
                os.chmod(path, 0o755)
        os.environ["HH_RUNNER_VAR"] = "seen"

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def both(self, argv, stdin="", timeout=20, cwd=None, fast=True):
        """Runs argv both ways; asserts the same outcome; returns the fast path's result."""
        outcomes = []
        for run in (self.process, script_runner.run_command):
            try:
                done = run(argv, stdin, timeout, cwd)
            except subprocess.TimeoutExpired as exc:
                outcomes.append(("timeout", exc.cmd, exc.timeout, None))
                continue
            except Exception as exc:  # noqa: B902 (compared: the same exception both ways)
                outcomes.append(("raised", type(exc).__name__, str(exc), None))
                continue
            stderr, ppid = self.split_ppid(done.stderr)
            outcomes.append(("ran", done.returncode, done.stdout, stderr, ppid))
        slow, quick = outcomes
        self.assertEqual(slow[:4], quick[:4], argv)
        if slow[0] == "ran" and slow[4] is not None:
            self.assertEqual(slow[4], os.getpid(), "subprocess.run's child is ours")
            if fast and FORKS:
                self.assertNotEqual(quick[4], os.getpid(), "%s ran as a process" % argv)
            else:
                self.assertEqual(quick[4], os.getpid(), "%s did not fall back" % argv)
        return quick

    @staticmethod
    def process(argv, stdin, timeout, cwd):
        return subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=timeout, cwd=cwd)

    @staticmethod
    def split_ppid(stderr):
        lines = (stderr or "").split("\n")
        for i, line in enumerate(lines):  # (after what compiling the script warned)
            if line.startswith("PPID "):
                return "\n".join(lines[:i] + lines[i + 1:]), int(line[5:])
        return stderr, None

    def path(self, name, sub=False):
        return os.path.join(self.sub if sub else self.dir, name)

    def test_what_the_script_sees(self):
        """argv, __name__, __file__, sys.path (and [0]), cwd, executable, orig_argv, the
        main module's globals, loader, the environment, stdin, open descriptors, stdio."""
        for sub in (False, True):
            for args in ([], ["a b", "--flag", "ünï"]):
                for cwd in (None, self.sub, "/"):
                    with self.subTest(sub=sub, args=args, cwd=cwd):
                        got = self.both([self.path("report.py", sub)] + args,
                                        stdin='{"tool_name": "terminal"}', cwd=cwd)
                        seen = json.loads(got[2])
                        self.assertEqual(seen["name"], "__main__")
                        self.assertEqual(seen["stdin"], '{"tool_name": "terminal"}')
                        self.assertEqual(seen["fds"][:3], [0, 1, 2])

    def test_relative_paths_and_the_python3_form(self):
        """`./script.py` and `sub/script.py` relative to the directory; `python3 script.py`
        and `pythonX.Y path args` (found on PATH)."""
        self.both(["./report.py", "x"], cwd=self.dir)
        self.both(["sub/report.py"], cwd=self.dir)
        self.both(["../report.py"], cwd=self.sub)
        version = "python%d.%d" % sys.version_info[:2]
        for python in ("python3", version, PYTHON):
            with self.subTest(python=python):
                self.both([python, "report.py", "one", "two"], cwd=self.dir)
                self.both([python, self.path("report.py"), "x"], cwd="/")

    def test_found_on_path(self):
        """A bare script name, looked up on PATH as subprocess does."""
        old = os.environ["PATH"]
        os.environ["PATH"] = self.dir + os.pathsep + old
        try:
            self.both(["report.py", "arg"])
        finally:
            os.environ["PATH"] = old

    def test_exit_codes_and_messages(self):
        for name in ("exit3.py", "exit_none.py", "exit_msg.py", "exit_big.py", "exit_bool.py",
                     "raises.py", "syntax.py", "os_exit.py", "killed.py", "interrupt.py",
                     "excepthook.py", "stdout_gone.py", "warns.py", "nul.py"):
            for sub in (False, True):
                with self.subTest(name=name, sub=sub):
                    self.both([self.path(name, sub)], stdin="{}")
        got = self.both([self.path("raises.py")])
        self.assertEqual(got[1], 1)
        self.assertIn("Traceback (most recent call last):", got[3])
        self.assertNotIn("script_server", got[3])
        self.assertEqual(self.both([self.path("killed.py")])[1], -signal.SIGTERM)
        self.assertEqual(self.both([self.path("interrupt.py")])[1], -signal.SIGINT)
        self.assertEqual(self.both([self.path("exit_msg.py")])[3], "refused: no rm -rf\n")
        self.assertIn("SyntaxWarning", self.both([self.path("warns.py")])[3])
        for _ in range(2):  # compiled by the server after a first run: warns all the same
            self.assertIn("SyntaxWarning", self.both([self.path("warns.py")])[3])

    def test_regular_expressions_compiled_by_earlier_runs(self):
        """The fork server keeps the regular expressions a script's runs compiled, for the
        runs after them; each run still sees what a fresh interpreter sees: the same matches,
        and the same warning on stderr every time (a pattern whose compiling warns is never
        kept)."""
        for _ in range(4):
            got = self.both([self.path("regex.py")], stdin="sudo rm -rf / # root")
            self.assertEqual(got[2].split("\n")[:3], ["True", "['push', 'pull']", "True"])
            self.assertIn("FutureWarning: Possible nested set", got[3])
        # Back to back (`both` runs a process between two forks: they come apart), where the
        # server forks the next spare as soon as one takes its request.
        fresh = self.process([self.path("regex.py")], "rm -rf", 20, None)
        fresh = (fresh.returncode, fresh.stdout, self.split_ppid(fresh.stderr)[0])
        for _ in range(6):
            done = script_runner.run_command([self.path("regex.py")], "rm -rf", 20, None)
            self.assertEqual((done.returncode, done.stdout, self.split_ppid(done.stderr)[0]),
                             fresh)
        if FORKS:
            # Not compared with a fresh interpreter: there, re's cache starts empty.
            kept = script_runner.run_command([self.path("regex_cache.py")], "", 20, None)
            self.assertEqual(kept.stdout.split(), ["True", "False"], kept)

    def test_statuses_back_to_back(self):
        """Calls back to back, where the server forks the next spare as a script starts and
        waits for the scripts' ends beside it (a script's process may still be ending when
        the next one runs): each call gets its own script's status and outputs, whether the
        script wrote its status before its end or the server tells it after (`os._exit`, a
        signal), a killed script's status never taken for the next one's."""
        names = ("exit3.py", "os_exit.py", "echo.py", "killed_hard.py", "raises.py",
                 "killed.py", "exit_none.py")
        fresh = {}
        for name in names:
            done = self.process([self.path(name)], "{}", 20, None)
            fresh[name] = (done.returncode, done.stdout, self.split_ppid(done.stderr)[0])
        for round_ in range(3):
            for name in names[round_:] + names[:round_]:
                done = script_runner.run_command([self.path(name)], "{}", 20, None)
                self.assertEqual((done.returncode, done.stdout,
                                  self.split_ppid(done.stderr)[0]), fresh[name], name)

    def test_the_end_of_the_interpreter(self):
        """atexit functions, non-daemon threads joined, the script's objects finalized (an
        unclosed file flushed, __del__)."""
        self.both([self.path("atexit_.py")])
        self.both([self.path("thread.py")])
        # After the last line: atexit functions that write late (raw and buffered), a thread
        # still running (that registers an atexit function, or ends the process), a signal
        # from an atexit function or before, a fork of the script, a process it leaves running
        # with its stdout: the same outputs and status as a fresh interpreter's.
        for name, code in (("atexit_late.py", 0), ("thread_late.py", 4),
                           ("thread_os_exit.py", 9), ("killed_hard.py", -signal.SIGKILL),
                           ("killed_at_exit.py", -signal.SIGTERM), ("forks.py", 0),
                           ("leaves_a_process.py", 0)):
            for sub in (False, True):
                with self.subTest(name=name, sub=sub):
                    self.assertEqual(self.both([self.path(name, sub)], stdin="{}")[1], code)
        got = self.both([self.path("atexit_late.py")])
        self.assertIn("raw at exit\n", got[2])
        self.assertTrue(got[2].endswith("buffered at exit"), got[2])
        self.assertEqual(got[3], "stderr at exit\n")
        self.assertEqual(self.both([self.path("thread_late.py")])[2:4],
                         ("threadregistered by the thread\n", "raw from the thread\n"))
        # ("before" twice when stdout is buffered: the fork's copy of the buffer.)
        got = self.both([self.path("forks.py")])[2]
        self.assertIn("before in the fork\n", got)
        self.assertTrue(got.endswith("the fork ended 7\n"), got)
        self.assertEqual(self.both([self.path("leaves_a_process.py")])[2],
                         "script done\nlate\n")
        for run in (self.process, script_runner.run_command):
            target = os.path.join(self.dir, "unclosed.out")
            done = run([self.path("unclosed.py"), target], "", 20, None)
            self.assertEqual(done.stdout, "del ran\n")
            with open(target) as f:
                self.assertEqual(f.read(), "kept")
            os.unlink(target)

    def test_the_priority_of_the_calling_thread(self):
        """A script runs at the scheduling policy and nice value of the thread that runs it, as
        a process started by that thread would: the service raises a decision's hook to the
        normal class and leaves other events' at SCHED_IDLE, nice +10 (a server started at one
        priority does not run the scripts of the other)."""
        import threading
        seen = {}

        def lowered(name, lower):
            lower()
            seen[name] = [self.both([self.path("priority.py", sub)])[2] for sub in (False, True)]

        self.both([self.path("priority.py")])  # a server at this thread's priority first
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        for name, lower in (
                ("nice", lambda: os.setpriority(os.PRIO_PROCESS, 0, nice + 3)),
                ("idle", lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)))):
            thread = threading.Thread(target=lowered, args=(name, lower))
            thread.start()
            thread.join()
        self.assertEqual(seen["nice"][0], "%d %d\n" % (os.SCHED_OTHER, nice + 3))
        self.assertTrue(seen["idle"][1].startswith("%d " % os.SCHED_IDLE), seen)
        self.assertEqual(self.both([self.path("priority.py")])[2],
                         "%d %d\n" % (os.SCHED_OTHER, nice))

    def test_stdin_and_large_output(self):
        """Stdin read to its end (large too), large stdout and stderr at once (no deadlock), a
        script that never reads a large stdin."""
        big = json.dumps({"tool_input": {"command": "x" * 3_000_000}})
        self.assertEqual(self.both([self.path("echo.py")], stdin=big)[2], big)
        got = self.both([self.path("big.py")])
        self.assertEqual(len(got[2]), 2_000_000)
        self.both([self.path("deaf.py")], stdin=big)
        self.both([self.path("echo.py")], stdin="")
        self.both([self.path("echo.py")], stdin="ünïcödé ✓ \u2028")

    def test_text_decoding(self):
        """Output that is not UTF-8 raises UnicodeDecodeError both ways; newlines translated."""
        self.both([self.path("latin1.py")])
        self.both([self.path("crlf.py")])

    def test_timeout_kills_the_script(self):
        started = time.monotonic()
        got = self.both([self.path("sleep.py")], timeout=1)
        self.assertEqual(got[0], "timeout")
        self.assertLess(time.monotonic() - started, 15)
        # The fast path's child is gone: the server answers the next call at once.
        self.both([self.path("exit3.py")])

    def test_falls_back_where_it_cannot_be_exact(self):
        """Flags, -c, -m, a shebang with a flag, a non-Python script, a missing or unreadable
        file, a missing directory: run as processes, same outcomes."""
        flagged = self.path("flagged.py")
        with open(flagged, "w") as f:
            f.write("#!%s -u\n" % PYTHON + with_ppid(REPORT))
        os.chmod(flagged, 0o755)
        shell = self.path("shell.sh")
        with open(shell, "w") as f:
            f.write("#!/bin/sh\necho PPID $PPID >&2\necho shell\n")
        os.chmod(shell, 0o755)
        unreadable = self.path("unreadable.py")
        shutil.copy(self.path("report.py"), unreadable)
        os.chmod(unreadable, 0o311)
        for argv in ([PYTHON, "-u", self.path("report.py")],
                     [PYTHON, "-c", "import os,sys; sys.stderr.write('PPID %d\\n' % os.getppid())"],
                     [PYTHON, "-I", self.path("report.py")],
                     [flagged], [shell]):
            with self.subTest(argv=argv):
                self.both(argv, fast=False)
        for argv in ([self.path("missing.py")], ["no-such-command-hh"],
                     [PYTHON, self.path("missing.py")], [self.path("exit3.py"), "\0"]):
            with self.subTest(argv=argv):
                self.both(argv)
        self.both([self.path("report.py")], cwd=os.path.join(self.dir, "gone"))
        if os.geteuid() != 0:  # root reads any file
            self.both([PYTHON, unreadable], fast=False)
        os.chmod(self.path("exit3.py"), 0o644)
        try:
            self.both([self.path("exit3.py")])  # PermissionError both ways
        finally:
            os.chmod(self.path("exit3.py"), 0o755)

    def test_an_interpreter_the_server_cannot_stand_for(self):
        """A `#!` interpreter that prints as it starts (its output would be in each run's), or
        one that does not start the server at all: processes, the same outcomes."""
        talks = self.path("python9")
        with open(talks, "w") as f:
            f.write("#!/bin/sh\necho started >&2\nexec %s \"$@\"\n" % PYTHON)
        dead = self.path("python8")
        with open(dead, "w") as f:
            f.write("#!/bin/sh\necho 'PPID '$PPID >&2\nexit 5\n")
        for interpreter in (talks, dead):
            os.chmod(interpreter, 0o755)
            script = interpreter + "-script.py"
            with open(script, "w") as f:
                f.write("#!%s\n" % interpreter + with_ppid(REPORT))
            os.chmod(script, 0o755)
            with self.subTest(interpreter=interpreter):
                for _ in range(2):  # refused once, not tried again
                    self.both([script, "x"], stdin="{}", fast=False)

    def test_concurrent_calls(self):
        """Calls at once from threads: each its own result (a server per call at once)."""
        import threading
        results = {}

        def call(i):
            results[i] = script_runner.run_command([self.path("echo.py")], "n%d" % i, 20, None)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i in range(6):
            self.assertEqual(results[i].stdout, "n%d" % i)
            self.assertEqual(results[i].returncode, 0)


if __name__ == "__main__":
    unittest.main()
