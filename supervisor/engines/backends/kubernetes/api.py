"""The Kubernetes API calls the backend makes, on the official (blocking) client.

Every object goes in and comes out as the plain dict of its JSON form (camelCase keys, as
manifests.py writes them), so nothing above this module sees the client's model classes.
Every call has a timeout; a call that meets a connection error, a timeout, 429 (throttled) or
a 5xx is asked again after a growing pause, a bounded number of times, and then is
EngineUnavailable naming the API server and what failed. 404 is an answer (None, False), not
an error; so is 409 on a create (None: one of that name is there already, the caller decides
whether it is its own). A refusal that asking again cannot mend (401, 403, 422 ...) is
EngineUnavailable at once, with the server's own words.

Waiting for a pod is a watch of that one pod, bounded by the caller's deadline: a watch that
ends (the server's timeout, a dropped connection) or expires (410 Gone: the resource version
it started from is too old) is followed by a fresh read of the pod and a new watch from the
version that read returned.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.watch.watch import iter_resp_lines

from stockade.supervisor.config.sandbox import KubernetesConfig
from stockade.supervisor.errors import ConfigError, EngineUnavailable, SandboxBroken

log = logging.getLogger("stockade")

Obj = dict[str, Any]
Kind = Literal["pod", "secret", "claim"]
T = TypeVar("T")

_RETRIED = (urllib3.exceptions.HTTPError, OSError)
"""Transport failures: refused or reset connections, timeouts, broken streams."""
GONE = 410
THROTTLED = 429
MIN_WATCH_S = 1.0
"""A watch that ends sooner without news is followed by a pause: no busy loop of reads."""
DELETE_GRACE_S = 2
"""A removed pod's processes get this long after SIGTERM (the agent ends its commands);
the engines' forced remove gives none, a pod's default 30 s would hold its name that long."""
MERGE_PATCH = "application/merge-patch+json"
"""The one patch content type used: a plain JSON merge (the official client would pick
json-patch+json for a dict body, which a server refuses; kmock merges any dict)."""
FATAL_WAITING = ("ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError")
"""Reasons a container waits for that no waiting mends: a pod showing one is given up."""


@dataclass(frozen=True)
class Timeouts:
    """How long each request and the whole of one call's retries may take."""

    connect_s: float = 5.0
    read_s: float = 10.0
    attempts: int = 4
    """Tries of one call (the first included) before it is EngineUnavailable."""
    backoff_s: float = 0.2
    """The pause after the first failure; it doubles after each (up to max_backoff_s)."""
    max_backoff_s: float = 3.0
    watch_window_s: float = 30.0
    """One watch request's length; a longer wait is made of several."""

    def pause(self, attempt: int, retry_after: float | None = None) -> float:
        step = min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)
        return min(retry_after, self.max_backoff_s) if retry_after else step


def load_client(kube: KubernetesConfig) -> client.ApiClient:
    """An API client from kubernetes.kubeconfig (and its context), or from the pod's own
    service account when no kubeconfig is named. Retries are this module's, not urllib3's."""
    configuration = client.Configuration()
    try:
        if kube.kubeconfig:
            config.load_kube_config(
                config_file=kube.kubeconfig,
                context=kube.context or None,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (ConfigException, OSError, ValueError, TypeError) as exc:
        where = (
            f"kubernetes.kubeconfig {kube.kubeconfig}"
            + (f" (context {kube.context!r})" if kube.context else "")
            if kube.kubeconfig
            else "the in-cluster service account (kubernetes.kubeconfig is empty: the "
            "supervisor must run in a pod, or name a kubeconfig file)"
        )
        raise ConfigError(f"cannot load {where}: {exc}") from exc
    configuration.retries = 0
    return client.ApiClient(configuration)


class KubeApi:
    """One namespace's pods, Secrets and claims (kubernetes.namespace)."""

    def __init__(
        self, api: client.ApiClient, namespace: str, timeouts: Timeouts | None = None
    ) -> None:
        self._client = api
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self.timeouts = timeouts or Timeouts()
        self.server = str(api.configuration.host)

    def close(self) -> None:
        self._client.close()

    # The calls.

    def version(self) -> str:
        """The API server's version ("v1.30.2"; "unknown" when it tells none); EngineUnavailable
        when it does not answer."""
        try:
            found = self._call("read its version", client.VersionApi(self._client).get_code)
        except _Absent:
            return "unknown"
        return str(found.get("gitVersion") or "unknown")

    def read(self, kind: Kind, name: str) -> Obj | None:
        """The object of that name; None when there is none."""
        try:
            return self._call(f"read {kind} {name}", self._op("read", kind), name, self.namespace)
        except _Absent:
            return None

    def create(self, kind: Kind, body: Obj) -> Obj | None:
        """The object as created; None when one of its name exists already (409)."""
        name = str(body.get("metadata", {}).get("name", ""))
        try:
            return self._call(
                f"create {kind} {name}", self._op("create", kind), self.namespace, body
            )
        except _Conflict:
            return None
        except _Absent:
            raise EngineUnavailable(
                f"the Kubernetes API at {self.server} cannot create {kind} {name}: namespace "
                f"{self.namespace} (kubernetes.namespace) does not exist"
            ) from None

    def patch(self, kind: Kind, name: str, body: Obj) -> Obj | None:
        """Merge-patch the object (RFC 7386: a null removes a key): the object as patched;
        None when there is none. A conflict (409) is EngineUnavailable: the caller gives up
        what it patched for (a pool pod not claimed is dropped)."""
        method = self._op("patch", kind)
        try:
            return self._call(
                f"patch {kind} {name}",
                method,
                name,
                self.namespace,
                body,
                _content_type=MERGE_PATCH,
            )
        except _Absent:
            return None
        except _Conflict:
            raise EngineUnavailable(
                f"the Kubernetes API at {self.server} refused to patch {kind} {name}: it was "
                "changed meanwhile (409 Conflict)"
            ) from None

    def delete(self, kind: Kind, name: str) -> bool:
        """Delete the object; False when there was none."""
        options: Obj = {"propagationPolicy": "Background"}
        if kind == "pod":
            options["gracePeriodSeconds"] = DELETE_GRACE_S
        method = self._op("delete", kind)
        try:
            self._call(f"delete {kind} {name}", method, name, self.namespace, body=options)
        except _Absent:
            return False
        return True

    def list(self, kind: Kind, labels: Mapping[str, str]) -> list[Obj]:
        """The objects carrying all of `labels`. The selector is also applied here: a server
        (or a mock of one) that ignores it cannot hand back another's objects."""
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        method = self._op("list", kind)
        try:
            found = self._call(f"list {kind}s", method, self.namespace, label_selector=selector)
        except _Absent:  # no such namespace (yet): nothing in it
            return []
        return [
            item
            for item in found.get("items") or []
            if all(labelled(item).get(k) == v for k, v in labels.items())
        ]

    def wait_ready(self, name: str, timeout_s: float) -> Obj:
        """The pod once it is Ready with an IP. SandboxBroken when it ends, is deleted, shows
        a reason that waiting cannot mend, or is not ready within timeout_s (saying what it
        waits for); EngineUnavailable when the API server stops answering."""
        deadline = time.monotonic() + timeout_s
        failures = 0
        while True:
            pod = self.read("pod", name)
            if pod is None:
                raise SandboxBroken(f"pod {name} was deleted before it was ready")
            if _verdict(pod):
                return pod
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxBroken(
                    f"pod {name} was not ready within {timeout_s:g} s "
                    f"(kubernetes.ready_timeout_s): {describe(pod)}"
                )
            version = str(pod.get("metadata", {}).get("resourceVersion") or "")
            window = min(remaining, self.timeouts.watch_window_s)
            started = time.monotonic()
            try:
                found = self._watch_pod(name, version, window)
            except _Expired:  # too old a version: read again, watch from the new one
                log.debug("watch of pod %s expired (410 Gone): watching afresh", name)
                continue
            except _RETRIED as exc:  # the stream broke off: read again, after a pause
                failures += 1
                if failures >= self.timeouts.attempts:
                    raise self._unreachable(f"watch pod {name}", exc) from exc
                time.sleep(self.timeouts.pause(failures))
                continue
            failures = 0
            if found is not None:
                return found
            if time.monotonic() - started < MIN_WATCH_S:  # a server that ends watches at once
                time.sleep(min(MIN_WATCH_S, max(0.0, deadline - time.monotonic())))

    def _watch_pod(self, name: str, version: str, window_s: float) -> Obj | None:
        """Follow the pod for window_s: the pod once ready; None when the window ends first
        (or the server ends the stream). _Expired on 410 Gone."""
        params: dict[str, Any] = {
            "watch": True,
            "field_selector": f"metadata.name={name}",
            "timeout_seconds": max(1, int(window_s)),
        }
        if version:
            params["resource_version"] = version
            params["allow_watch_bookmarks"] = True
        ends = time.monotonic() + window_s
        timeout = (self.timeouts.connect_s, window_s + 1)
        method = self._core.list_namespaced_pod
        try:
            response = self._open(f"watch pod {name}", method, timeout, self.namespace, **params)
        except _Absent:
            return None  # the caller reads the pod again
        try:
            for line in iter_resp_lines(response):
                event = _event(line)
                pod = event.get("object")
                if event.get("type") == "ERROR":
                    code = pod.get("code") if isinstance(pod, dict) else None
                    if code == GONE:
                        raise _Expired()
                    raise urllib3.exceptions.ProtocolError(
                        f"watch error event: {_status_words(pod)}"
                    )
                if isinstance(pod, dict) and pod.get("metadata", {}).get("name") == name:
                    # not a bookmark, nor another pod from a server that ignores the selector
                    if event.get("type") == "DELETED":
                        raise SandboxBroken(f"pod {name} was deleted before it was ready")
                    if _verdict(pod):
                        return pod
                if time.monotonic() >= ends:
                    return None
        except urllib3.exceptions.ReadTimeoutError:
            return None  # a quiet window: the caller reads the pod again
        finally:
            response.release_conn()
            response.close()
        return None

    # The machinery.

    def _op(self, verb: str, kind: Kind) -> Callable[..., Any]:
        resource = {"pod": "pod", "secret": "secret", "claim": "persistent_volume_claim"}[kind]
        method: Callable[..., Any] = getattr(self._core, f"{verb}_namespaced_{resource}")
        return method

    def _call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Obj:
        """Call the API with a timeout, retrying what may pass: the answer's JSON as a dict
        (the client's models are not used: they refuse what they do not know)."""
        timeout = (self.timeouts.connect_s, self.timeouts.read_s)
        return self._retrying(what, lambda: _json(method(*args, **_raw(timeout), **kwargs)))

    def _open(
        self,
        what: str,
        method: Callable[..., Any],
        timeout: tuple[float, float],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """The open response of a streamed call (a watch), retried as _call is."""
        return self._retrying(what, lambda: method(*args, **_raw(timeout), **kwargs))

    def _retrying(self, what: str, do: Callable[[], T]) -> T:
        attempt = 1
        while True:
            try:
                return do()
            except ApiException as exc:
                if exc.status == 404:
                    raise _Absent() from exc
                if exc.status == 409:
                    raise _Conflict() from exc
                if exc.status == GONE:
                    raise _Expired() from exc
                if not _retriable(exc) or attempt >= self.timeouts.attempts:
                    raise self._unavailable(what, exc) from exc
                pause = self.timeouts.pause(attempt, _retry_after(exc))
                log.debug(
                    "kubernetes: %s: %s %s; again in %.1f s", what, exc.status, exc.reason, pause
                )
            except _RETRIED as exc:
                if attempt >= self.timeouts.attempts:
                    raise self._unreachable(what, exc) from exc
                pause = self.timeouts.pause(attempt)
                log.debug("kubernetes: %s: %s; again in %.1f s", what, exc, pause)
            time.sleep(pause)
            attempt += 1

    def _unavailable(self, what: str, exc: ApiException) -> EngineUnavailable:
        message = _message(exc)
        if exc.status in (401, 403):
            return EngineUnavailable(
                f"the Kubernetes API at {self.server} refuses to {what} in namespace "
                f"{self.namespace} ({exc.status}: {message}); the supervisor's service account "
                "needs there: pods create, get, list, watch, patch, delete; "
                "persistentvolumeclaims create, get, list, patch, delete; secrets create, "
                "delete, and get on kubernetes.ca_secret "
                "(deploy/kubernetes/rbac.yaml)"
            )
        tries = f" after {self.timeouts.attempts} tries" if _retriable(exc) else ""
        return EngineUnavailable(
            f"the Kubernetes API at {self.server} failed to {what}{tries}: {exc.status} {message}"
        )

    def _unreachable(self, what: str, exc: BaseException) -> EngineUnavailable:
        return EngineUnavailable(
            f"the Kubernetes API at {self.server} cannot be reached to {what} "
            f"({self.timeouts.attempts} tries, each within {self.timeouts.read_s:g} s): {exc}"
        )


class _Absent(Exception):
    """404."""


class _Conflict(Exception):
    """409 on a create."""


class _Expired(Exception):
    """410 Gone on a watch: its resource version is too old."""


def _raw(timeout: tuple[float, float]) -> dict[str, Any]:
    """The client's options for one request: its timeouts, and the answer unparsed."""
    return {"_request_timeout": timeout, "_preload_content": False}


def _json(response: Any) -> Obj:
    """A response's JSON object; an answer that is not one is a broken stream (retried)."""
    try:
        found = json.loads(response.data)
    except ValueError as exc:
        raise urllib3.exceptions.ProtocolError(f"not JSON: {exc}") from exc
    finally:
        response.release_conn()
    if not isinstance(found, dict):
        raise urllib3.exceptions.ProtocolError("not a JSON object")
    return found


def _event(line: str) -> Obj:
    try:
        event = json.loads(line) if line.strip() else {}
    except ValueError as exc:
        raise urllib3.exceptions.ProtocolError(f"a watch event that is not JSON: {exc}") from exc
    return event if isinstance(event, dict) else {}


def _status_words(status: Any) -> str:
    if not isinstance(status, dict):
        return "no status"
    return (
        f"{status.get('code', '?')} {status.get('reason', '')} {status.get('message', '')}".strip()
    )


def labelled(obj: Obj) -> dict[str, str]:
    labels = obj.get("metadata", {}).get("labels") or {}
    return {str(k): str(v) for k, v in labels.items()}


def _retriable(exc: ApiException) -> bool:
    status = exc.status or 0
    return status in (0, THROTTLED) or status >= 500


def _retry_after(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _message(exc: ApiException) -> str:
    """The server's own words (a Status object's message), else the HTTP reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or "no reason given").splitlines()[0][:500]


def _verdict(pod: Obj) -> bool:
    """True when the pod serves (Ready, with an IP); SandboxBroken when it never will."""
    name = pod.get("metadata", {}).get("name", "?")
    if pod.get("metadata", {}).get("deletionTimestamp"):
        raise SandboxBroken(f"pod {name} is being deleted")
    status = pod.get("status") or {}
    phase = status.get("phase", "")
    if phase in ("Failed", "Succeeded"):
        raise SandboxBroken(f"pod {name} ended ({phase}): {describe(pod)}")
    for waiting in _waiting(status):
        if waiting.get("reason") in FATAL_WAITING:
            raise SandboxBroken(f"pod {name} cannot start: {describe(pod)}")
    return bool(status.get("podIP")) and is_ready(pod)


def is_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _waiting(status: Obj) -> list[Obj]:
    found = []
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if isinstance(waiting, dict):
            found.append(waiting)
    return found


def describe(pod: Obj) -> str:
    """What a pod's status says about why it does not serve, in one line."""
    status = pod.get("status") or {}
    parts = [f"phase {status.get('phase') or 'unknown'}"]
    if status.get("reason"):  # Evicted, NodeLost, DeadlineExceeded ...
        parts.append(str(status["reason"]))
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True" and (
            condition.get("reason") or condition.get("message")
        ):
            parts.append(
                f"{condition.get('type')}: {condition.get('reason', '')} "
                f"{condition.get('message', '')}".strip()
            )
    for container in status.get("containerStatuses") or []:
        for state, info in (container.get("state") or {}).items():
            if (
                isinstance(info, dict)
                and state != "running"
                and (info.get("reason") or info.get("message"))
            ):
                parts.append(
                    f"container {container.get('name')} {state}: {info.get('reason', '')} "
                    f"{info.get('message', '')}".strip()
                )
    if status.get("message"):
        parts.append(str(status["message"]))
    return "; ".join(parts)
