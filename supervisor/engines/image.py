"""Build the sandbox image (sandbox_image/Containerfile) and the supervisor's own image (the
top-level Containerfile) for Podman or Docker.

No registry is needed. The steps of `build_image` (and `build_supervisor_image`):

1. hash the build's inputs (Containerfile, Python code, the versions of the wheels);
   an image already labelled with that hash is kept, so a second run is quick;
2. make sure the base `debian:bookworm` exists: pull it, or else create it with
   `debootstrap --variant=minbase` (the root filesystem tarball is cached under
   cache_dir, so the second engine reuses it) and import it under that name;
3. assemble a build context (Containerfile, wheels/ downloaded on the host since
   containers here cannot reach PyPI over HTTPS, lib/stockade/...); the supervisor image's
   wheels are the package's runtime dependencies at the versions installed here;
4. build with the engine's CLI on the host network, streaming the log.

Both engines get the same reference, `localhost/stockade-sandbox:latest`: Podman
names local builds so anyway, and Docker reads `localhost` as a registry host,
so a missing image fails fast instead of being looked for on Docker Hub.
Docker builds run the classic builder (DOCKER_BUILDKIT=0): the Docker CLI may
lack the buildx plugin that BuildKit builds need.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

Engine = Literal["podman", "docker"]
Log = Callable[[str], None]

REPO = Path(__file__).resolve().parents[2]
IMAGE_REF = "localhost/stockade-sandbox:latest"
SUPERVISOR_REF = "localhost/stockade-supervisor:latest"
HASH_LABEL = "io.stockade.image-hash"
BASE_IMAGE = "docker.io/library/debian:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
IMAGE_PYTHON = "3.11"  # Python of the base; the wheels must match it
WHEELS = ("grpcio", "protobuf")
PULL_TIMEOUT = 30.0
SETUP_HINT = "scripts/setup.sh installs and starts what is missing"
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Docker's classic builder colours stderr


class ImageBuildError(Exception):
    """The sandbox image could not be built; the message ends with a hint to fix it."""


def image_ref(engine: str) -> str:
    """The reference of the sandbox image in that engine (the same for all):
    $STOCKADE_IMAGE_REF when set (keeps two checkouts' images apart), else IMAGE_REF. For
    kubernetes the nodes must have it or pull it: a cluster usually wants sandbox.image set
    to a registry's reference."""
    if engine not in ("podman", "docker", "kubernetes"):
        raise ValueError(f"unknown engine {engine!r}")
    return os.environ.get("STOCKADE_IMAGE_REF") or IMAGE_REF


def supervisor_image_ref() -> str:
    """The supervisor image's reference: $STOCKADE_SUPERVISOR_IMAGE_REF when set, else
    SUPERVISOR_REF (the same in both engines)."""
    return os.environ.get("STOCKADE_SUPERVISOR_IMAGE_REF") or SUPERVISOR_REF


def default_cache_dir() -> Path:
    """Where downloads (base root filesystem, wheels) are kept between builds."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "stockade"


def build_image(
    engine: Literal["podman", "docker"],
    *,
    cache_dir: Path,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> str:
    """Build the sandbox image for engine unless it is up to date; return its reference.

    force rebuilds without the engine's layer cache (the base image is kept).
    """
    files = context_files()
    return _build_if_stale(
        engine, image_ref(engine), files, content_hash(files), WHEELS, cache_dir, force, log
    )


def build_supervisor_image(
    engine: Literal["podman", "docker"],
    *,
    cache_dir: Path,
    force: bool = False,
    log: Callable[[str], None] = print,
) -> str:
    """Build the supervisor image (the top-level Containerfile) for engine unless it is up
    to date; return its reference. It runs sandboxes of the sandbox image, built apart."""
    files = supervisor_context_files()
    dists = runtime_dependencies()
    digest = content_hash(files, dists)
    return _build_if_stale(
        engine, supervisor_image_ref(), files, digest, dists, cache_dir, force, log
    )


def _build_if_stale(
    engine: Engine,
    ref: str,
    files: dict[str, Path],
    digest: str,
    dists: tuple[str, ...],
    cache_dir: Path,
    force: bool,
    log: Log,
) -> str:
    _check_engine(engine)
    current = _inspect(engine, ref)
    if current and _labels(current).get(HASH_LABEL) == digest and not force:
        log(f"{engine}: {ref} is up to date (hash {digest[:12]})")
        return ref
    _ensure_base(engine, cache_dir, log)
    wheels = _wheels(dists, cache_dir, log)
    with tempfile.TemporaryDirectory(prefix="stockade-image-") as tmp:
        context = Path(tmp)
        _assemble(context, files, wheels)
        log(f"{engine}: building {ref} (hash {digest[:12]})")
        _build(engine, context, ref, digest, log, no_cache=force)
    if current and current["Id"] != (_inspect(engine, ref) or {}).get("Id"):
        _remove_if_untagged(engine, current["Id"])
    return ref


def _remove_if_untagged(engine: Engine, image_id: str) -> None:
    """Remove the image a reference named before its rebuild, unless another tag still names
    it: a private tag (STOCKADE_IMAGE_REF) built from the same sources shares the shared
    tag's image, and removing it by id took that tag with it. Best effort: it may be in use."""
    old = _inspect(engine, image_id)
    if old is not None and not old.get("RepoTags"):
        _run([engine, "image", "rm", image_id], engine)


def context_files() -> dict[str, Path]:
    """Build-context path -> source file: the Containerfile, drop/drop.c (the command
    launcher, compiled in the build), node/proxy.js (Node's proxy preload) and
    lib/stockade/**/*.py."""
    files = {"Containerfile": REPO / "sandbox_image" / "Containerfile"}
    files["drop/drop.c"] = REPO / "sandbox_image" / "drop" / "drop.c"
    files["node/proxy.js"] = REPO / "sandbox_image" / "node" / "proxy.js"
    files["lib/stockade/__init__.py"] = REPO / "src" / "stockade" / "__init__.py"
    agent = REPO / "sandbox_image" / "agent"
    for folder, dirs, names in os.walk(agent, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(n for n in names if n.endswith(".py")):
            source = Path(folder) / name
            files[f"lib/stockade/agent/{source.relative_to(agent).as_posix()}"] = source
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing or not (agent / "__main__.py").is_file():
        raise ImageBuildError(
            f"the sandbox image's sources are incomplete ({', '.join(missing) or 'no agent'}): "
            "build from a full checkout of the repository"
        )
    return files


def supervisor_context_files() -> dict[str, Path]:
    """Build-context path -> source file for the supervisor image: the top-level
    Containerfile and the stockade package (the agent's protocol too) but stockade.testing."""
    files = {"Containerfile": REPO / "Containerfile"}
    package = REPO / "src" / "stockade"
    for folder, dirs, names in os.walk(package, followlinks=True):
        # stockade.testing runs on the test's side, never in the image
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "testing"))
        for name in sorted(n for n in names if n.endswith(".py") or n == "py.typed"):
            source = Path(folder) / name
            files[f"lib/stockade/{source.relative_to(package).as_posix()}"] = source
    if not files["Containerfile"].is_file() or "lib/stockade/supervisor/app.py" not in files:
        raise ImageBuildError(
            "the supervisor image's sources are incomplete: build from a full checkout"
        )
    return files


def runtime_dependencies() -> tuple[str, ...]:
    """The stockade package's own requirements (no extras), by distribution name."""
    names = []
    for requirement in importlib.metadata.requires("stockade") or []:
        if "extra ==" in requirement.replace("extra==", "extra =="):
            continue
        names.append(re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0])
    return tuple(names)


def content_hash(files: dict[str, Path], dists: tuple[str, ...] = WHEELS) -> str:
    """sha256 over the context files and the versions of the wheels it installs."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(f"{name}\0".encode() + files[name].read_bytes() + b"\0")
    for dist, version in _versions(dists).items():
        digest.update(f"{dist}=={version}\n".encode())
    return digest.hexdigest()


def _versions(dists: tuple[str, ...] = WHEELS) -> dict[str, str]:
    return {dist: importlib.metadata.version(dist) for dist in dists}


def _check_engine(engine: Engine) -> None:
    if shutil.which(engine) is None:
        raise ImageBuildError(f"{engine} is not installed: {SETUP_HINT}")
    proc = _run([engine, "version"], engine)
    if proc.returncode != 0:
        raise ImageBuildError(
            f"{engine} does not answer: {proc.stderr.strip()[-300:]}\n"
            f"hint: {SETUP_HINT} (for Docker: start dockerd)"
        )


def _run(cmd: list[str], engine: Engine, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=_env(engine), check=False
    )


def _env(engine: Engine) -> dict[str, str]:
    env = dict(os.environ)
    if engine == "docker":
        env["DOCKER_BUILDKIT"] = "0"  # the classic builder: no buildx plugin needed
    return env


def _inspect(engine: Engine, ref: str) -> dict[str, Any] | None:
    proc = _run([engine, "image", "inspect", ref], engine)
    if proc.returncode != 0:
        return None
    found: list[dict[str, Any]] = json.loads(proc.stdout)
    return found[0] if found else None


def _labels(image: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = (image.get("Config") or {}).get("Labels") or {}
    return labels


def _stream(cmd: list[str], log: Log, *, env: dict[str, str] | None = None) -> None:
    """Run cmd, passing each output line to log; raise with the last lines on failure."""
    tail: deque[str] = deque(maxlen=25)
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace", env=env
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(ANSI.sub("", line.rstrip()))
            log(tail[-1])
    if proc.returncode != 0:
        raise ImageBuildError(
            f"`{' '.join(cmd[:3])} ...` failed (exit {proc.returncode}); last lines:\n"
            + "\n".join(tail)
        )


def _ensure_base(engine: Engine, cache_dir: Path, log: Log) -> None:
    if _inspect(engine, BASE_IMAGE) is not None:
        return
    log(f"{engine}: base {BASE_IMAGE} missing; trying a pull ({PULL_TIMEOUT:.0f} s at most)")
    try:
        pulled = _run([engine, "pull", BASE_IMAGE], engine, timeout=PULL_TIMEOUT).returncode == 0
    except subprocess.TimeoutExpired:
        pulled = False
    if pulled:
        return
    log(f"{engine}: pull failed; creating the base from a debootstrap root filesystem")
    tarball = _base_rootfs(cache_dir, log)
    log(f"{engine}: importing {tarball} as {BASE_IMAGE}")
    cmd = [engine, "import", "--change", 'CMD ["bash"]', str(tarball), BASE_IMAGE]
    try:
        _stream(cmd, log, env=_env(engine))
    except ImageBuildError as exc:
        raise ImageBuildError(f"{exc}\nhint: delete {tarball} to bootstrap it again") from exc


def _base_rootfs(cache_dir: Path, log: Log) -> Path:
    """The cached minbase tarball, made with debootstrap if needed (root only)."""
    tarball = cache_dir / f"debian-bookworm-minbase-{platform.machine()}.tar"
    if tarball.is_file():
        return tarball
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        raise ImageBuildError(
            "no debian:bookworm base and no registry: creating it needs root and debootstrap "
            f"(apt-get install debootstrap); {SETUP_HINT}"
        )
    cache_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rootfs-", dir=cache_dir))
    try:
        log(f"debootstrap: creating a minbase bookworm in {root} (a few minutes)")
        _stream(["debootstrap", "--variant=minbase", "bookworm", str(root), DEBIAN_MIRROR], log)
        _tidy_rootfs(root)
        partial = tarball.with_suffix(".tar.partial")
        _stream(["tar", "--numeric-owner", "--exclude=./dev/*", "-C", str(root),
                 "-cf", str(partial), "."], log)  # fmt: skip
        partial.replace(tarball)
    finally:
        _remove_rootfs(root)
    return tarball


def _tidy_rootfs(root: Path) -> None:
    """Sources like the official image's (with updates and security); no caches."""
    (root / "etc/apt/sources.list").write_text(
        f"deb {DEBIAN_MIRROR} bookworm main\n"
        f"deb {DEBIAN_MIRROR} bookworm-updates main\n"
        f"deb {DEBIAN_MIRROR}-security bookworm-security main\n"
    )
    for folder in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (root / folder).glob("*"):
            if entry.is_file():
                entry.unlink()


def _remove_rootfs(root: Path) -> None:
    """Remove a (partial) debootstrap tree; never descend into what is mounted in it."""
    prefix = f"{root}/"
    with open("/proc/self/mounts") as mounts:
        mounted = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(mounted, reverse=True):
        subprocess.run(["umount", "-l", point], check=False)
    shutil.rmtree(root, ignore_errors=True)


def _wheels(dists: tuple[str, ...], cache_dir: Path, log: Log) -> Path:
    """A folder of cp311 manylinux wheels of dists (at the versions installed here) and
    their dependencies."""
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine(), platform.machine())
    pins = [f"{dist}=={version}" for dist, version in _versions(dists).items()]
    name = "-".join(pins).replace("==", "-")
    if len(name) > 80:  # the supervisor's dozen pins: a digest keeps the name short
        name = hashlib.sha256(name.encode()).hexdigest()[:16]
    folder = cache_dir / "wheels" / f"cp311-{arch}-{name}"
    if (folder / ".complete").is_file():
        return folder
    log(f"pip: downloading {' '.join(pins)} for cp311 {arch} into {folder}")
    shutil.rmtree(folder, ignore_errors=True)
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(17, 37)] + [
        f"manylinux2014_{arch}"
    ]
    cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--implementation",
           "cp", "--python-version", IMAGE_PYTHON, "--dest", str(folder), *pins]  # fmt: skip
    for tag in platforms:
        cmd += ["--platform", tag]
    try:
        _stream(cmd, log)
    except ImageBuildError as exc:
        raise ImageBuildError(f"{exc}\nhint: the host needs PyPI (or a pip index) access") from exc
    (folder / ".complete").write_text("\n".join(pins) + "\n")
    return folder


def _assemble(context: Path, files: dict[str, Path], wheels: Path) -> None:
    for name, source in files.items():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, context / name)
    (context / "wheels").mkdir()
    for wheel in wheels.glob("*.whl"):
        shutil.copyfile(wheel, context / "wheels" / wheel.name)


def _build(
    engine: Engine, context: Path, ref: str, digest: str, log: Log, *, no_cache: bool
) -> None:
    cmd = [engine, "build", "--network", "host", "--label", f"{HASH_LABEL}={digest}",
           "--build-arg", f"STOCKADE_IMAGE_HASH={digest}", "-t", ref,
           "-f", str(context / "Containerfile")]  # fmt: skip
    if no_cache:
        cmd.append("--no-cache")  # forced: fetch the Debian packages again, too
    if engine == "podman":
        cmd.append("--pull=never")  # the base is local; never ask a registry
    try:
        _stream([*cmd, str(context)], log, env=_env(engine))
    except ImageBuildError as exc:
        raise ImageBuildError(
            f"{exc}\nhint: the build needs http://deb.debian.org from the host network; "
            f"retry with --force, or remove the base ({engine} rmi {BASE_IMAGE}) to recreate it"
        ) from exc
