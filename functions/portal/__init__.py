"""The researcher's portal (an HTTP function): a user's workspaces with their state, live
progress, cost, idle badge and snapshot; the new-workspace form; pause, resume (also on
another profile) and delete; agent links; sandboxes; a workspace's snapshots. Server-
rendered (Jinja2, the dashboard's look), working without JavaScript; ``static/portal.js``
only refreshes the progress line and copies a link. No CDN: Stasis serves every asset.

Contract of this package:

- **Changes go through the front doors' events.** Workspaces change only by publishing
  workspace.requested / pause / resume / delete requested, as the CLI and chat do; links
  only through the links function's issuer (``functions/proxy/issuer.py``). The one
  document it writes itself is the one-time sign-in record (``signin``).
- **The domain decides.** What may be shown and done (``functions/domain/rights.py``),
  every refusal and its words (``functions/domain/frontdoor.py``, shared with the CLI and
  chat: the lifecycle's and admission's own rules), cost, idle outlook and progress
  (``functions/domain``). ``views`` is pure.
- **No SDK here.** Firestore and Cloud Storage through the ``ports.PortalStore`` port
  (``functions/adapters/portal_store.py``), the IAP JWT through ``functions/adapters/iap.py``;
  ``web`` adds Jinja2, werkzeug and the request.
- **One browser session.** ``session`` is the signed cookie the IDE access proxy verifies
  too; ``signin`` the rules of the one-time local sign-in link.
"""
