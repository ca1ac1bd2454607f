"""Handlers: one module per event family. load -> decide (domain) -> persist -> emit.

Handlers are plain functions ``handle(event, deps, consumer)``; they depend on the ports
(functions.ports) only, never on a concrete adapter.
"""
