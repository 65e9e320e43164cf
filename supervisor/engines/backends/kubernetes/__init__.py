"""Sandboxes as Kubernetes pods: the installation's CA and the certificates it issues
(pki.py), the objects a sandbox is made of as plain dicts (manifests.py), and the backend that
creates them through the API."""
