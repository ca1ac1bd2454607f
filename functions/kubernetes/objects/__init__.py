"""Every Kubernetes object Stasis makes, as pure builders: plain values in, dicts out.

Purely data-manipulative: no I/O, no client, no SDK (an import-linter contract keeps it so),
time and tokens passed in. The runtimes (``functions.kubernetes``) only *apply* what these
build, and the cluster monitor (``runtime.kubernetes``) reads objects back with the readings
here, so both sides agree on every name, label and annotation. The tests compare whole
objects (``tests/data/k8s_objects.json``) and validate each against the Kubernetes OpenAPI
schema (``kubernetes-validate``) or the transcribed CRDs.

One module per object family, on shared helpers:

=================== =====================================================================
module              what
=================== =====================================================================
``names``           the one slug helper: a valid, collision-free name for any string
``meta``            every label and annotation key; metadata; reading it back
``security``        the restricted security contexts (Pod Security ``restricted``)
``hardware``        resources from a profile, GKE node placement (accelerators, Spot)
``status``          readings of what the cluster reports: conditions, container states
``kinds``           where each kind lives in the API (both clients route through it)
``settings``        how Stasis uses a cluster (``STASIS_K8S_*``)
``reports``         the source and deterministic ids of events about cluster objects
------------------- ---------------------------------------------------------------------
``team``            per team: Namespace, ServiceAccount (jobs; Workload Identity),
                    ResourceQuota
``rbac``            the control plane's rights: ClusterRoles, per-team RoleBinding
``podsnapshot``     GKE Pod Snapshots: per-team storage config and policy, their progress
``workspace``       per workspace: its own ServiceAccount (its identity), home PVC, token
                    Secret, Pod, Service, NetworkPolicy, and the CMEK StorageClass homes
                    default to
``snapshot``        per snapshot: trigger (method ``pod``), request (``kernel``), record,
                    whether it restores onto a target
``monitor``         the cluster monitor's namespace, identity, rights and Deployment
``ide_proxy``       the IDE access proxy: identity, rights, Deployment, Service, and GKE's
                    Gateway, HTTPRoute, GCPBackendPolicy (IAP), HealthCheckPolicy
``sandbox``         per agent sandbox: Pod, Secret, policies; how its Pod ended
``jobset``          per scale-out job: JobSet and Service; how it ended; its bucket layout
=================== =====================================================================

A new object family (Kueue queues, per-workspace service accounts) is a module of its own
on ``meta``, ``security`` and ``hardware``, and its kind one line in ``kinds`` if the
runtime applies it.
"""
