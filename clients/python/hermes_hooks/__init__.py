"""Gateway-side client of the hermes-hooks service: a drop-in ``HookRegistry``.

Swap one import in the gateway::

    # from gateway.hooks import HookRegistry
    from hermes_hooks import HookRegistry

    registry = HookRegistry()          # or HookRegistry(address="http://127.0.0.1:8787")
    registry.discover_and_load()

    # then, in the gateway's coroutines, with the event's context dict:
    async def on_message(ctx):
        await registry.emit("agent:start", ctx)
        decisions = await registry.emit_collect("message:pre_route", ctx)

The hooks themselves run in the ``hermes-hooks`` service (``hermes-hooks serve``), found at the
``address`` argument, else ``$HERMES_HOOKS_ADDRESS``, else the Unix socket
``$HERMES_HOME/hooks.sock`` (``HERMES_HOME`` defaults to ``~/.hermes``). An address is a socket
path or ``http://host:port``; a bearer token comes from ``token=`` or ``$HERMES_HOOKS_TOKEN``.
Standard library only; CPython 3.9+.

Guarantees
----------
* **emit never raises and never blocks.** ``await registry.emit(...)`` (and the synchronous
  ``emit_nowait``) validates the event name, copies the context dict (a shallow copy: nested
  objects the gateway mutates later may be seen mutated) and appends it to an in-memory buffer;
  it does no encoding and no I/O and completes without suspending. A background daemon thread
  encodes the events a few at a time, pausing between chunks so that it never keeps the event
  loop waiting for the GIL (the interpreter's switch interval is left alone), and sends them in
  batches (``POST /v1/events/batch``) over one keep-alive connection. Waking that thread
  when it is idle is scheduled on the event loop (``call_soon``), so it happens when the
  calling task next yields, not inside ``emit`` (``emit_nowait`` wakes it directly).
* **Bounded buffer.** At most ``queue_size`` events (default 10,000) and ``queue_bytes`` bytes
  of JSON (default 32 MiB; for events not encoded yet, the average encoded size so far) wait for
  the service, counting the batch in flight. When full, the oldest waiting events are dropped
  and counted in ``dropped`` (events in the batch being sent are kept; that batch takes at most
  half of either bound). Memory stays bounded however long the service is down.
* **Service down or restarting.** Events wait in the buffer while the sender reconnects with
  exponential backoff (``backoff_initial`` 50 ms doubling to ``backoff_max`` 5 s). A batch
  leaves the buffer only when the service answered 202, so nothing is lost unless the bound
  forced a drop. If a connection breaks after the service received a batch but before its
  answer arrived, that batch is sent again: across a crash or restart the client may deliver
  an event twice (at-least-once from client to service); order is kept. On each new
  connection the sender waits for ``GET /readyz`` to say 200 before sending, so events do not
  reach a service that is still loading its hooks (they would match nothing).
* **Bad data is not retried forever.** An event the service refuses (400, 413) is isolated by
  halving the batch and counted in ``rejected`` alone; the rest of its batch is delivered. Other
  refusals (401 wrong token, 404, 415) reject the batch, logged as errors. Contexts are made
  JSON-safe first (datetime -> ISO text, set -> list, NaN -> null, other objects -> ``str()``).
* **On the service side**, each handler runs each event at most once (a handler that crashes or
  times out is not re-run), and a hook sees its events in emit order.
* **emit_collect never raises.** It calls ``POST /v1/collect`` on its own short-lived
  connection with asyncio streams (the event loop is never blocked), waits as long as the
  matching hooks' own timeouts allow (the original host awaited every handler, so a decision
  never fails open by default; ``collect_timeout=`` or ``timeout=`` give a shorter deadline),
  and returns the non-None handler results in match order (exact-pattern hooks, then wildcard
  hooks), or ``[]`` when the service is down or the call
  failed (logged, rate-limited). ``emit_collect_detailed`` returns the per-hook results and
  errors as well.
* **discover_and_load never raises.** It lists the service's hooks into ``loaded_hooks`` and
  starts the sender; with the service down it logs a warning and leaves the list empty. With
  ``autostart=True`` (the default under the shim) it starts the bundled ``hermes-hooks serve``
  (detached, one per socket, stopping after the last gateway) when nobody answers: see
  ``hermes_hooks._autostart``. A service of another protocol version is refused.
* **Exit and fork.** At interpreter exit the buffer gets ``exit_flush_timeout`` (1 s) to drain;
  ``close()``/``aclose()`` flush explicitly. A forked child starts with an empty buffer and its
  own sender (the parent delivers what it had buffered).

Hooks that run inside the gateway
---------------------------------
Hooks the service lists with ``"runs": "gateway"`` (they import the gateway's own modules) are
imported by ``discover_and_load`` in this process, after a SHA-256 check, as the original host
did, and called off the message path: ``emit`` starts them and returns (async handlers as tasks
under the hook's timeout, sync handlers on the hook's own thread), ``emit_collect`` awaits them
and merges their results with the service's in match order; their errors are logged, never
raised. See ``hermes_hooks._ingateway``. ``ProfileHookRegistries`` keeps one registry per profile
home (``hermes_hooks.profiles``); ``hermes_hooks.shim`` makes ``gateway.hooks`` hand out these
classes without editing the gateway.

Logging goes to the ``hermes_hooks`` logger. The only exception raised anywhere is
``ValueError`` from the constructor for a malformed address or a nonsensical setting.
"""

from ._transport import Address, parse_address, resolve_address
from .registry import HookRegistry, check_event_name
from .profiles import ProfileHookRegistries

__all__ = ["HookRegistry", "ProfileHookRegistries", "Address", "parse_address",
           "resolve_address", "check_event_name"]
__version__ = "0.1.0"
