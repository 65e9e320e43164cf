"""Sandboxes as pods: the ContainerBackend of engine.kind = "kubernetes".

A sandbox is three objects in kubernetes.namespace, named by its sandbox id:

    stockade-<instance[:8]>-<sid>   the Pod (the container name scheme of the host kinds)
    stockade-agent-<sid>            a Secret: the agent's certificate and key, the CA's cert,
                                    and [sandbox] secrets (the pod references them by key)
    stockade-ws-<sid>               the workspace claim (kubernetes.workspace = "pvc")

A warm-pool pod (housekeeping.warm_pool) is named by its pool id instead (pool-<id> in
place of <sid>), its agent's certificate too, and has a claim of its own; a key claims it by
relabeling (relabel(): the claim, then the pod get the key's labels), and its objects keep
their names. So a key's pod, claim and Secret are found by the sandbox-id
label (the manager's lookups, _claims_of), the Secret through the pod that mounts it: a
re-made pod of the key takes the key's own name and mounts the claim it had.

run() makes the Secret, the claim when there is none yet, and the pod, then waits (a watch,
kubernetes.ready_timeout_s) until the pod is Ready with an IP, which it reports as
ContainerInfo.address: the agent is reached there over TCP with mutual TLS (agent_tls()).
remove() deletes the pod and its Secret and keeps the claim, so a re-created pod (a heal, a
new profile, a restart) finds the key's files; remove_workspace() deletes the claim, which
the manager does when a sandbox is destroyed with its workspace or its retention expires.

The TLS: at start the backend reads the installation's CA from the Secret
kubernetes.ca_secret (tls.crt, tls.key), issues each new pod an agent certificate for its
fixed name, and itself a short-lived client certificate, issued again as it ages.

What a pod cannot do, said plainly: it cannot be frozen through the API (pause is
Unsupported), it has no host process (pid 0) and no bind mounts, and its image is pulled by
the node (image_exists cannot know; a pull that fails shows in run()).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Callable, Mapping

from stockade.supervisor.config.sandbox import KubernetesConfig
from stockade.supervisor.engines.addresses import MutualTls, TcpAddress
from stockade.supervisor.engines.backends.base import (
    LABEL_INSTANCE,
    LABEL_KEY,
    LABEL_MANAGED,
    LABEL_POOL,
    LABEL_REPLICA,
    LABEL_SANDBOX_ID,
    LABEL_TENANT,
    BindMount,
    ContainerInfo,
    ContainerSpec,
    EngineView,
    RuntimeFacts,
)
from stockade.supervisor.engines.backends.kubernetes import manifests
from stockade.supervisor.engines.backends.kubernetes.api import KubeApi, Obj, load_client
from stockade.supervisor.engines.backends.kubernetes.pki import Authority, Issued, supervisor_tls
from stockade.supervisor.engines.backends.kubernetes.views import info_of, view_of
from stockade.supervisor.engines.hosts import KUBERNETES
from stockade.supervisor.engines.userns import IDENTITY, IdMaps
from stockade.supervisor.errors import (
    ConfigError,
    EngineUnavailable,
    SandboxBroken,
    StockadeError,
    Unsupported,
)

log = logging.getLogger("stockade")

CLIENT_DAYS = 30
CLIENT_REISSUE_S = 7 * 86400.0
"""The supervisor's client certificate is issued again when this old (valid CLIENT_DAYS)."""
GONE_POLL_S = 0.5
REPLACED_FLAGS = ("--socket", "--workspace", "--user", "--agent-user")
"""Agent options of the host kinds' command that the pod's own command replaces (it listens
on TCP, and runs as the pod's one uid)."""


class KubernetesBackend:
    engine = "kubernetes"
    tmpfs_inodes = False
    """A pod's /tmp is an emptyDir in memory: its size is capped, its inodes are not."""
    host = KUBERNETES
    """Any supervisor of the instance reaches a pod (its IP, mutual TLS)."""

    def __init__(
        self,
        kube: KubernetesConfig,
        api: KubeApi | None = None,
        *,
        sandbox_uid: int = manifests.SANDBOX_UID,
    ) -> None:
        self._kube = kube
        self._api = api or KubeApi(load_client(kube), kube.namespace)
        self._uid = sandbox_uid
        self._lock = threading.Lock()
        self._authority: Authority | None = None
        self._client: Issued | None = None
        self._client_at = 0.0
        self._workspaces: dict[str, str] = {}
        """sandbox id -> the claim its pod mounts, as last seen (workspace_of names it)."""

    # The agent's TLS.

    def authority(self) -> Authority:
        """The installation's CA, read once from kubernetes.ca_secret."""
        with self._lock:
            if self._authority is None:
                self._authority = self._read_authority()
            return self._authority

    def _read_authority(self) -> Authority:
        name, namespace = self._kube.ca_secret, self._kube.namespace
        secret = self._api.read("secret", name)
        if secret is None:
            raise ConfigError(
                f"the agent CA Secret {namespace}/{name} (kubernetes.ca_secret) does not exist: "
                "create it with the CA's tls.crt and tls.key (deploy/kubernetes)"
            )
        data = secret.get("data") or {}
        try:
            cert, key = (base64.b64decode(data[field]) for field in ("tls.crt", "tls.key"))
            return Authority.load(cert, key)
        except (KeyError, ValueError) as exc:
            raise ConfigError(
                f"the agent CA Secret {namespace}/{name} must hold a CA's certificate and key "
                f"as tls.crt and tls.key: {exc}"
            ) from None

    def _client_cert(self) -> Issued:
        authority = self.authority()
        with self._lock:
            if self._client is None or time.monotonic() - self._client_at > CLIENT_REISSUE_S:
                self._client = authority.issue_supervisor(days=CLIENT_DAYS)
                self._client_at = time.monotonic()
            return self._client

    def agent_tls(self, sandbox_id: str) -> MutualTls:
        """What this supervisor dials sandbox_id's agent with."""
        return supervisor_tls(self.authority(), sandbox_id, self._client_cert())

    def address_of(self, info: ContainerInfo, _paths: object = None) -> TcpAddress:
        """Where a pod's agent is reached (Containers' address_of hook): its IP, the agent
        port, mutual TLS for the name of its sandbox's certificate."""
        ident = identity(info.labels)
        if not info.address or not ident:
            raise SandboxBroken(f"pod {info.name} has no IP or no sandbox id: its agent is unknown")
        return TcpAddress(info.address, self._kube.agent_port, self.agent_tls(ident))

    # The ContainerBackend protocol.

    def ping(self) -> str:
        version = self._api.version()
        self.authority()  # at start: a missing or bad CA is said now, not at the first call
        return version

    def image_exists(self, ref: str) -> bool:
        """Unknown here: each node pulls the image for its pods (kubernetes.image_pull_policy);
        a pod whose image cannot be had fails run() with the kubelet's reason."""
        return True

    def image_id(self, ref: str) -> str | None:
        return None  # no registry is asked: adoption does not compare image ids

    def check_user_namespace(self, wanted: bool) -> IdMaps | None:
        if wanted:
            raise ConfigError(
                "sandbox.user_namespace = true is not supported with engine.kind kubernetes: "
                "pods run as the sandbox uid under the cluster's own user namespace policy"
            )
        return None

    def run(self, spec: ContainerSpec, prepare: Callable[[IdMaps], None]) -> ContainerInfo:
        sid, ident = spec.labels.get(LABEL_SANDBOX_ID, ""), identity(spec.labels)
        if not ident:
            raise ConfigError(f"{spec.name}: a pod needs a sandbox id or a warm-pool id")
        prepare(IdMaps(IDENTITY, IDENTITY))  # no id maps of its own: the pod's uid is the user's
        owned = _owned_labels(spec.labels, sid)
        secret = manifests.secret_name(ident)
        claim = self._claim_for(sid, ident) if self._kube.workspace == "pvc" else None
        pod = manifests.sandbox_pod(
            spec,
            self._kube,
            sandbox_id=sid,
            agent_secret=secret,
            workspace_claim=claim,
            agent_args=pod_agent_args(spec.command),
            sandbox_uid=self._uid,
        )
        self._refuse_foreign(spec.name, spec.labels.get(LABEL_INSTANCE, ""))
        try:
            self._put_secret(secret, ident, owned, manifests.secret_environment(spec))
            if claim is not None:
                self._ensure_claim(claim, owned)
            self._create_pod(pod, spec.labels.get(LABEL_INSTANCE, ""))
            ready = self._api.wait_ready(spec.name, self._kube.ready_timeout_s)
        except BaseException:
            # a pool pod's claim is no one's workspace yet: it goes with the failed pod
            self._undo(spec.name, secret, None if sid else claim)
            raise
        return self._seen(ready)

    def _claim_for(self, sid: str, ident: str) -> str:
        """The claim a key's new pod mounts: the one its sandbox id labels (its first pod's,
        maybe a warm-pool pod's under the pool's name), else a new one of the key's name."""
        found = self._claims_of(sid) if sid else []
        own = manifests.claim_name(ident)
        return own if own in found or not found else found[0]

    def _claims_of(self, sid: str) -> list[str]:
        """The names of the claims labelled with the sandbox id (one, but for a mishap)."""
        items = self._api.list("claim", {LABEL_MANAGED: "1", LABEL_SANDBOX_ID: sid})
        live = [c for c in items if not (c.get("metadata") or {}).get("deletionTimestamp")]
        return sorted(str(c["metadata"]["name"]) for c in live)

    def _seen(self, pod: Obj) -> ContainerInfo:
        """The pod's ContainerInfo; the claim a sandbox's pod mounts noted (workspace_of)."""
        info = info_of(pod)
        sid, claim = info.labels.get(LABEL_SANDBOX_ID, ""), manifests.claim_of(pod)
        if sid and claim:
            self._workspaces[sid] = claim
        return info

    def _refuse_foreign(self, name: str, instance: str) -> None:
        """Names carry only a prefix of the instance id: a pod of that name may be another
        supervisor's, which is left alone (and nothing of its sandbox is touched)."""
        found = self._api.read("pod", name)
        owner = manifests.carried_labels(found["metadata"]).get(LABEL_INSTANCE) if found else None
        if found is not None and owner != instance:
            raise EngineUnavailable(
                f"pod {name} exists and belongs to another supervisor (instance {owner or '?'})"
            )

    def _undo(self, name: str, secret: str, claim: str | None) -> None:
        """After a failed run(): the pod and its Secret go (and `claim`); an error doing so
        is logged, the run's own error is the one raised."""
        try:
            self._remove(name, secret, claim or "")
        except StockadeError as exc:
            log.warning("pod %s: not removed after its failed start: %s", name, exc)

    def _put_secret(
        self, name: str, ident: str, labels: Mapping[str, str], environment: Mapping[str, str]
    ) -> None:
        """A fresh agent certificate for the new pod (one left by an earlier pod is
        replaced: its key is not one this supervisor holds), with the sandbox's secret
        environment, which the pod references."""
        authority = self.authority()
        issued, ca = authority.issue_agent(ident), authority.cert_pem
        body = manifests.agent_secret(name, issued, ca, labels, self._kube.namespace, environment)
        if self._api.create("secret", body) is None:
            self._api.delete("secret", name)
            if self._api.create("secret", body) is None:
                raise EngineUnavailable(f"Secret {name} was made again by someone else meanwhile")

    def _ensure_claim(self, name: str, labels: Mapping[str, str]) -> None:
        """The key's claim: made on its first pod, then kept (it is the workspace)."""
        if self._api.create("claim", manifests.workspace_claim(name, self._kube, labels)):
            return
        found = self._api.read("claim", name)
        if found is not None and manifests.carried_labels(found["metadata"]).get(LABEL_MANAGED):
            return
        raise EngineUnavailable(
            f"a PersistentVolumeClaim {name} exists in namespace {self._kube.namespace} and "
            "is not Stockade's: it is not used as a workspace"
        )

    def _create_pod(self, pod: Obj, instance: str) -> None:
        """Create the pod. One of its name already there (409) is: being deleted, or ended
        (waited for, or deleted, then made anew); this supervisor's and alive, made by an
        earlier try whose answer was lost (taken as it is); another supervisor's, made
        meanwhile (refused). Within kubernetes.ready_timeout_s."""
        name = pod["metadata"]["name"]
        deadline = time.monotonic() + self._kube.ready_timeout_s
        while self._api.create("pod", pod) is None:
            if time.monotonic() > deadline:
                raise SandboxBroken(
                    f"pod {name}: an earlier pod of that name was still there after "
                    f"{self._kube.ready_timeout_s:g} s (kubernetes.ready_timeout_s)"
                )
            found = self._api.read("pod", name)
            if found is None:
                continue  # deleted meanwhile: create again
            meta = found.get("metadata") or {}
            owner = manifests.carried_labels(meta).get(LABEL_INSTANCE)
            if owner != instance:
                raise EngineUnavailable(
                    f"pod {name} exists and belongs to another supervisor (instance {owner})"
                )
            ended = (found.get("status") or {}).get("phase") in ("Failed", "Succeeded")
            if not meta.get("deletionTimestamp") and not ended:
                return
            if ended:
                self._api.delete("pod", name)
            time.sleep(GONE_POLL_S)

    def inspect(self, name_or_id: str) -> ContainerInfo | None:
        pod = self._api.read("pod", name_or_id)
        return None if pod is None else self._seen(pod)

    def list(self, labels: Mapping[str, str]) -> list[ContainerInfo]:
        """Pods carrying all of `labels`: those that are valid label values are selected by
        the server, the others (carried as annotations) here."""
        selectable = {k: v for k, v in labels.items() if manifests.is_label(k, v)}
        found = [self._seen(pod) for pod in self._api.list("pod", selectable)]
        return [i for i in found if all(i.labels.get(k) == v for k, v in labels.items())]

    def remove(self, name_or_id: str) -> bool:
        """Delete the pod and its agent Secret (the one it mounts); the workspace claim
        stays, but an unclaimed pool pod's, which is no one's workspace."""
        pod = self._api.read("pod", name_or_id)
        if pod is None:
            ident = _ident_of(name_or_id)
            return self._remove(name_or_id, manifests.secret_name(ident) if ident else "", "")
        labels = manifests.carried_labels(pod.get("metadata") or {})
        unclaimed = bool(labels.get(LABEL_POOL)) and not labels.get(LABEL_SANDBOX_ID)
        claim = manifests.claim_of(pod) if unclaimed else ""
        return self._remove(name_or_id, manifests.secret_of(pod), claim)

    def _remove(self, name: str, secret: str, claim: str) -> bool:
        removed = self._api.delete("pod", name)
        if secret:
            self._api.delete("secret", secret)
        if claim:
            self._api.delete("claim", claim)
        return removed

    def relabel(self, name_or_id: str, labels: Mapping[str, str | None]) -> ContainerInfo | None:
        """Claim a pod (a warm-pool one) for a key: its claim gets the key's labels that it
        carries (whose it is), then the pod gets `labels` (None: removed), each by a merge
        patch, so a lookup by the sandbox-id label that finds the pod finds its claim too.
        The Secret is not patched: it is only ever reached through the pod that mounts it,
        and a patch answers with the whole object, so `patch` on Secrets would let the
        supervisors read every Secret of the namespace (docs/kubernetes.md). None when
        there is no such pod; EngineUnavailable when a patch fails (the caller drops it)."""
        pod = self._api.read("pod", name_or_id)
        if pod is None:
            return None
        owned = {k: v for k, v in labels.items() if k in OWNED}
        claim = manifests.claim_of(pod)
        if claim and self._api.patch("claim", claim, manifests.relabeling(owned)) is None:
            raise SandboxBroken(f"pod {name_or_id}: its workspace claim {claim} is gone")
        patched = self._api.patch("pod", name_or_id, manifests.relabeling(labels))
        return None if patched is None else self._seen(patched)

    def has_workspace(self, sandbox_id: str) -> bool:
        """Whether a claim labelled with the sandbox id exists (never with emptyDir
        workspaces: they end with their pod)."""
        return self._kube.workspace == "pvc" and bool(self._claims_of(sandbox_id))

    def remove_workspace(self, sandbox_id: str) -> bool:
        """Delete the sandbox's workspace claims (its pod must be gone): those labelled with
        its sandbox id (a claimed pool pod's keeps the pool's name) and the one of its
        name; False: none."""
        names = {*self._claims_of(sandbox_id), manifests.claim_name(sandbox_id)}
        self._workspaces.pop(sandbox_id, None)
        return any([self._api.delete("claim", name) for name in sorted(names)])

    def workspace_of(self, sandbox_id: str) -> str:
        """pvc://<namespace>/<claim>, or "emptyDir" (a workspace that lives and dies with
        its pod): the supervisor's host folder of a key means nothing for a pod. The claim
        its pod was last seen mounting, else the one of its name (no API call here)."""
        if self._kube.workspace != "pvc":
            return "emptyDir"
        claim = self._workspaces.get(sandbox_id) or manifests.claim_name(sandbox_id)
        return f"pvc://{self._kube.namespace}/{claim}"

    def pause(self, name_or_id: str) -> bool:
        raise Unsupported(
            "a pod cannot be paused: Kubernetes has no freezer in its API (engine.kind "
            "kubernetes); stop it with DestroySandbox, its workspace claim is kept"
        )

    def unpause(self, name_or_id: str) -> bool:
        raise Unsupported("a pod cannot be paused or resumed (engine.kind kubernetes)")

    def set_connected(self, name_or_id: str, connected: bool) -> bool:
        raise Unsupported(
            "a pod cannot be cut off its network by the supervisor (engine.kind kubernetes): "
            "its NetworkPolicy decides"
        )

    def mounts(self, name_or_id: str) -> tuple[BindMount, ...] | None:
        """A pod has volumes, never bind mounts of this host."""
        return None if self._api.read("pod", name_or_id) is None else ()

    def security_view(self, name_or_id: str) -> EngineView | None:
        pod = self._api.read("pod", name_or_id)
        return None if pod is None else view_of(pod)

    def runtime_facts(self) -> RuntimeFacts:
        """The RuntimeClass pods ask for; its handler and version are the nodes' business."""
        return RuntimeFacts(name=self._kube.runtime_class)

    def runtimes(self) -> dict[str, str]:
        return {self._kube.runtime_class: ""} if self._kube.runtime_class else {}

    def close(self) -> None:
        self._api.close()


def pod_agent_args(command: tuple[str, ...]) -> tuple[str, ...]:
    """The agent options of a ContainerSpec's command that a pod keeps (limits and such);
    those it replaces go, with their values."""
    kept: list[str] = []
    skip = False
    for arg in command:
        if skip:
            skip = False
        elif arg in REPLACED_FLAGS:
            skip = True
        elif arg.split("=", 1)[0] not in REPLACED_FLAGS:
            kept.append(arg)
    return tuple(kept)


OWNED = (
    LABEL_MANAGED,
    LABEL_INSTANCE,
    LABEL_KEY,
    LABEL_TENANT,
    LABEL_SANDBOX_ID,
    LABEL_POOL,
    LABEL_REPLICA,
)
"""The labels a sandbox's Secret and claim carry too: whose they are (lookups, cleanup)."""


def identity(labels: Mapping[str, str]) -> str:
    """Whom a pod's agent certificate names: its pool id's ident when it began in the warm
    pool (it keeps that certificate when claimed), else its sandbox id; "" for neither."""
    pool_id = labels.get(LABEL_POOL, "")
    return manifests.pool_ident(pool_id) if pool_id else labels.get(LABEL_SANDBOX_ID, "")


def _owned_labels(labels: Mapping[str, str], sid: str) -> dict[str, str]:
    """What a sandbox's Secret and claim carry: whose they are, for people and for cleanup."""
    owned = {**manifests.COMPONENT_LABELS, **{k: v for k, v in labels.items() if k in OWNED}}
    if sid:
        owned[LABEL_SANDBOX_ID] = sid
    return owned


def _ident_of(name: str) -> str:
    """The sandbox id (or pool ident) in a pod name (stockade-<instance[:8]>-<ident>)."""
    parts = name.split("-", 2)
    return parts[2] if len(parts) == 3 and parts[0] == "stockade" else ""
