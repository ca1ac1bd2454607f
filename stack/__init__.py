"""The embedded local deployment of Stasis.

Owns everything `stasis up` needs to run the control plane on one machine, on loopback only:
the settings of the local stack (`stack.settings`: every port and path in one place), the
supervisor of its child services (`stack.processes`: the Firestore and Pub/Sub emulators of
the Google Cloud CLI, fake-gcs-server, the function host and the node agent, each in its own
process group, stopped as a group), the topics and push subscriptions, seeding, and the
`stasis` CLI. Nothing here is imported by `functions/` or `events/`.
"""
