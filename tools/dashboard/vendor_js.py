"""Vendors the dashboard's JavaScript dependencies (uPlot) into the levanter package.

    python tools/dashboard/vendor_js.py          # fetch, verify, copy (needs npm and a network)
    python tools/dashboard/vendor_js.py --check  # verify the committed files only (offline)

For each pinned package: `npm pack NAME@VERSION` fetches the tarball through npm's configured
registry, its sha512 is checked against both the pin below and the registry metadata
(`npm view NAME@VERSION dist.integrity`), and the listed dist files and the licence are copied
to `levanter/src/meltemi/levanter/dashboard/static/vendor/`. `VERSIONS.json` there records name,
version, licence, integrity and the sha256 of every copied file, so the files are committed and
nothing downloads at run or test time.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import pathlib
import subprocess
import sys
import tarfile
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENDOR = ROOT / "levanter/src/meltemi/levanter/dashboard/static/vendor"

#: name, version, the registry's sha512 integrity, licence, {file in the tarball: vendored name}.
PINS = [
    {
        "name": "uplot",
        "version": "1.6.32",
        "integrity": "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+"
        "jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==",
        "license": "MIT",
        "files": {
            "package/dist/uPlot.esm.js": "uPlot.esm.js",
            "package/dist/uPlot.min.css": "uPlot.min.css",
            "package/LICENSE": "uPlot.LICENSE.txt",
        },
    },
]


class VendorError(Exception):
    """A vendored file does not match its pin."""


def integrity(data: bytes) -> str:
    """The npm `dist.integrity` string (sha512, base64) of a tarball."""
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()


def _npm(*args: str, cwd: pathlib.Path) -> str:
    return subprocess.run(
        ["npm", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def extract(pin: dict, tarball: bytes, registry_integrity: str) -> dict[str, bytes]:
    """Checks `tarball` against the pin and the registry; returns {vendored name: bytes}."""
    got = integrity(tarball)
    spec = f"{pin['name']}@{pin['version']}"
    if registry_integrity != pin["integrity"]:
        raise VendorError(
            f"{spec}: the registry's integrity {registry_integrity} differs from the pinned "
            f"{pin['integrity']}; check the release, then update PINS in {__file__}."
        )
    if got != pin["integrity"]:
        raise VendorError(f"{spec}: the tarball's integrity is {got}, pinned {pin['integrity']}.")
    out = {}
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        names = set(tar.getnames())
        for member, name in pin["files"].items():
            f = tar.extractfile(member) if member in names else None
            if f is None:
                raise VendorError(f"{spec}: {member} is not in the tarball; fix PINS files.")
            out[name] = f.read()
    return out


def fetch(pin: dict) -> tuple[bytes, str]:
    """The tarball of a pin (npm pack) and the registry's integrity for it (npm view)."""
    spec = f"{pin['name']}@{pin['version']}"
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = pathlib.Path(tmp)
        registry = json.loads(_npm("view", spec, "dist.integrity", "--json", cwd=tmp_path))
        name = _npm("pack", spec, "--silent", cwd=tmp_path).splitlines()[-1]
        return (tmp_path / name).read_bytes(), registry


def write(pins: list[dict], vendor: pathlib.Path = VENDOR) -> None:
    """Fetches, verifies and copies every pin; writes VERSIONS.json."""
    vendor.mkdir(parents=True, exist_ok=True)
    versions = []
    for pin in pins:
        files = extract(pin, *fetch(pin))
        for name, data in files.items():
            (vendor / name).write_bytes(data)
        versions.append(_record(pin, files))
    (vendor / "VERSIONS.json").write_text(json.dumps(versions, indent=1) + "\n")


def _record(pin: dict, files: dict[str, bytes]) -> dict:
    return {
        "name": pin["name"], "version": pin["version"], "license": pin["license"],
        "integrity": pin["integrity"],
        "files": {n: hashlib.sha256(d).hexdigest() for n, d in sorted(files.items())},
    }  # fmt: skip


def check(pins: list[dict], vendor: pathlib.Path = VENDOR) -> None:
    """Raises VendorError unless vendor/ holds exactly the pinned files, unmodified."""
    path = vendor / "VERSIONS.json"
    if not path.is_file():
        raise VendorError(f"{path} is missing: run `python tools/dashboard/vendor_js.py`.")
    recorded = {v["name"]: v for v in json.loads(path.read_text())}
    for pin in pins:
        got = recorded.get(pin["name"])
        if got is None or got["version"] != pin["version"] or got["integrity"] != pin["integrity"]:
            raise VendorError(
                f"{path}: {pin['name']} is {got and got['version']}, pinned {pin['version']}: "
                "run `python tools/dashboard/vendor_js.py`."
            )
        for name, sha in got["files"].items():
            data = (vendor / name).read_bytes() if (vendor / name).is_file() else b""
            if hashlib.sha256(data).hexdigest() != sha:
                raise VendorError(
                    f"{vendor / name}: sha256 differs from VERSIONS.json (edited or missing); "
                    "run `python tools/dashboard/vendor_js.py` to restore it."
                )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify only, no network")
    args = parser.parse_args(argv)
    try:
        check(PINS) if args.check else write(PINS)
    except VendorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"vendor: {', '.join(p['name'] + '@' + p['version'] for p in PINS)} ok in {VENDOR}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
