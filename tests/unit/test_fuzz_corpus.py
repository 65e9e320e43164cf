"""Every fuzz target's corpus (fuzz/corpus/<target>/: seeds from the tests and the SDKs'
wire, and what `make fuzz` found that added coverage, crashes it found included) replayed
through its harness, without atheris: each input is parsed or cleanly refused (the target's
REFUSALS); anything else raised fails. docs/security.md, "Fuzzing"."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import fuzz
from fuzz.__main__ import MAX_BYTES, MAX_FILES


@pytest.mark.parametrize("name", fuzz.TARGETS)
def test_the_corpus_replays_without_a_crash(name: str) -> None:
    module = fuzz.target(name)
    files = fuzz.corpus_of(name)
    assert files, f"fuzz/corpus/{name}/ is empty"
    for path in files:
        try:
            fuzz.check(module, path.read_bytes())
        except Exception as exc:
            pytest.fail(f"fuzz/corpus/{name}/{path.name}: {type(exc).__name__}: {exc}")


@pytest.mark.parametrize("name", fuzz.TARGETS)
def test_the_corpus_is_bounded(name: str) -> None:
    files = fuzz.corpus_of(name)
    assert len(files) <= MAX_FILES
    assert sum(p.stat().st_size for p in files) <= MAX_BYTES


def test_every_target_has_its_module_and_corpus_only() -> None:
    modules = {p.stem for p in fuzz.HERE.glob("*.py")} - {"__init__", "__main__"}
    assert modules == set(fuzz.TARGETS)
    assert {p.name for p in fuzz.CORPUS.iterdir()} == set(fuzz.TARGETS)


def test_the_harnesses_need_no_atheris() -> None:
    """Replaying (make test) must not need the fuzz extra: only the runner imports atheris,
    inside its child."""
    for path in [*fuzz.HERE.glob("*.py")]:
        text = path.read_text()
        imports = [line for line in text.splitlines() if line.strip().startswith("import atheris")]
        assert path.name == "__main__.py" or not imports, path
        assert all(line.startswith("    ") for line in imports), f"{path}: atheris at the top"


def test_a_crash_is_not_a_refusal() -> None:
    """check lets a target's clean refusals pass and raises anything else."""

    def one(data: bytes) -> None:
        raise (ValueError if data else KeyError)("no")

    target = SimpleNamespace(one=one, REFUSALS=(ValueError,))
    fuzz.check(target, b"refused")
    with pytest.raises(KeyError):
        fuzz.check(target, b"")
