"""The IDE access proxy: each workspace's whole IDE (JupyterLab or VS Code), HTTP and
WebSocket, at ``/w/<workspace id>/``, for the signed-in browser that may use it.

A long-lived aiohttp server (Cloud Functions serve no WebSockets): one process of the local
stack, a Deployment behind IAP on GKE. It lives beside the links proxy (``functions/proxy``)
because it decides with the same domain rule (``functions.domain.ide``, built on
``functions.domain.links``) on the same cached reads of Firestore (``ReadCache`` and the
link store), and reaches the IDE's server where the runtime says it runs.

- ``access``: who the browser is (the portal's session cookie, or IAP's identity), the
  cached decision, and the watch that closes WebSockets whose access ended;
- ``upstream``: where a workspace's IDE server is, its credentials (injected, never
  shown), the headers that pass, and the redaction of anything that would show them;
- ``app``: the aiohttp application (routes, forwarding, the pages of a paused, starting
  or refused workspace); ``pages``: those pages; ``wiring``: built from the environment.
"""
