"""Handlers: one module per event family, and the one pipeline their state changes take.

- ``pipeline``  transact -> send the outbox -> mark done -> log, for every family; a family
  module declares a table from payload type to its :class:`pipeline.Step` (what the
  transaction is about, how it decides) and its ``handle`` runs the pipeline over it:
  ``lifecycle`` (workspaces), ``sandboxes``, ``jobs``.
- ``commands``  the one table from command type to what carries it out once committed.
- ``idle``, ``janitor``, ``reconciler``, ``cost``: scheduled sweeps and the handlers of
  what they publish; they decide with the pure domain and change state only through
  events (or, for the janitor's expiry, one transaction of the fleet store).

Handlers are plain functions ``handle(event, deps, consumer)``; they depend on the ports
(functions.ports, ``deps``) only, never on a concrete adapter.
"""
