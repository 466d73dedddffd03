"""What ``agent:end`` says about how the run ended (issue 50).

The gateway emits ``agent:end`` with the response only. A hook that needs the run's outcome
(failed, interrupted, the error) used to walk its caller's frames (``sys._getframe``) to the
gateway's local ``agent_result``: in the original host its handler runs on the message path, so
that frame is there. Here a hook runs off that path (in the service, or on an in-gateway hook's
own thread), where no such frame exists, and such a hook took every run for answered. So the
client does that walk once, in ``emit``, while the gateway's frame is still its caller's, and
adds the outcome to the context: ``outcome`` (``"answered"``, ``"failed"``, ``"interrupted"``),
``failed``, ``interrupted`` and, when the run has one, ``error`` (at most 500 characters). A run
is ``"failed"`` whenever 0.19.0 would not count it as completed (see :func:`completed`): an
``error`` set, or ``partial``, or ``completed: False``, fails it even with ``failed`` false. A
context that already has an ``outcome`` is left as it is; without an ``agent_result`` within
a few frames (a gateway of another shape) nothing is added.
"""

import sys
from typing import Any, Dict, Optional

#: The event whose context gets the outcome.
EVENT = "agent:end"
#: Frames above ``emit`` looked at (the gateway's method, through a wrapper or two).
MAX_FRAMES = 8
#: Longest ``error`` carried.
MAX_ERROR = 500


def _agent_result(depth: int) -> Optional[Dict[str, Any]]:
    """The nearest ``agent_result`` dict among the caller's frames, ``depth`` above this one."""
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return None
    for _ in range(MAX_FRAMES):
        if frame is None:
            return None
        found = frame.f_locals.get("agent_result")
        if isinstance(found, dict):
            return found
        frame = frame.f_back
    return None


def completed(result: Dict[str, Any]) -> bool:
    """Whether a run completed, as hermes-agent 0.19.0 itself decides it before it clears a
    session's restart-recovery marker (``gateway/run.py``, ``_should_clear_resume_pending_after_
    turn``): not when the run was interrupted, failed, stopped part-way (``partial``), carries an
    ``error`` or says ``completed: False``. ``failed`` alone is not enough: the gateway's result
    for a turn with a final response has no ``failed`` key at all, so a provider's HTTP 400 shows
    there only as ``error`` (issue 58 row 2)."""
    if result.get("interrupted"):
        return False
    if result.get("failed") or result.get("partial") or result.get("error"):
        return False
    return result.get("completed") is not False


def with_outcome(context: Dict[str, Any], depth: int) -> Dict[str, Any]:
    """``context`` with the run's outcome added (a new dict), or ``context`` itself when it has
    one already or no ``agent_result`` is found ``depth`` frames above the caller and up."""
    if "outcome" in context:
        return context
    result = _agent_result(depth + 1)
    if result is None:
        return context
    interrupted = bool(result.get("interrupted"))
    failed = not interrupted and not completed(result)
    added = dict(context)
    added["outcome"] = "interrupted" if interrupted else "failed" if failed else "answered"
    added["failed"] = failed
    added["interrupted"] = interrupted
    error = result.get("error")
    if error:
        added["error"] = str(error)[:MAX_ERROR]
    return added
