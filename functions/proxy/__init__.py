"""The access proxy for agent links, and the function that issues and revokes links.

Two HTTP functions (mounted by the local function host at ``/proxy`` and ``/links``):

- ``links`` (:mod:`functions.proxy.issuer`): create, list and revoke links for an
  authenticated user (IAP in a deployment, an explicit dev identity locally). It generates
  the token, stores only its SHA-256 in ``links/{hash}`` with the audit entry in one write,
  publishes link.created / link.revoked (which never carry the token) and answers the link
  URL once.
- ``proxy`` (:mod:`functions.proxy.access`): every request carries ``Authorization: Bearer
  <token>`` and is checked (:mod:`functions.domain.links` decides); then it runs code in the
  workspace's kernel, streaming NDJSON, or forwards the Jupyter REST API.

Both depend on :mod:`functions.proxy.ports` only; :mod:`functions.proxy.wiring` picks the
adapters (Firestore, Pub/Sub, the Jupyter kernel client, IAP), lazily, from ``bootstrap``.
"""
