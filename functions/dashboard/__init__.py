"""The admin dashboard: the platform team's read-only view of the fleet (an HTTP function).

Pages: fleet, snapshots, cost, latency, links, sandboxes, audit. Server-rendered HTML
(Jinja2) with charts as inline SVG drawn in Python: no JavaScript, no CDN, nothing fetched
from elsewhere, so it works on a cluster without internet and its Content-Security-Policy
can forbid every script.

Contract of this package:

- **Read-only.** It never writes to Firestore and publishes no event.
- **Bounded reads.** Every page load issues a fixed number of queries, each with a limit
  (at most :data:`reads.MAX_PAGE` documents), paginated with a cursor; counts and sums are
  Firestore aggregation queries (or rollup documents), never a scan of a collection.
- **No SDK here.** Firestore is reached only through the :class:`reads.Reader` port
  (``functions/adapters/dashboard_reader.py``); the IAP JWT is verified by
  ``functions/adapters/iap.py``. ``pages``, ``stats``, ``charts`` and ``access`` are
  plain Python over plain data; ``web`` adds Jinja2 and the request.
- **Admins only.** In a deployment the IAP JWT is verified (audience from the
  environment); on the local stack an explicit dev identity is used. See ``access``.
"""
