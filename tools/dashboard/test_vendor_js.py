"""The vendoring step of the dashboard's JavaScript checks what it copies, offline."""

import dataclasses
import io
import pathlib
import shutil
import tarfile

import pytest

from tools.dashboard import vendor_js as vj


def _tarball(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclasses.dataclass
class Fake:
    tarball: bytes
    pin: dict


@pytest.fixture
def fake() -> Fake:
    tarball = _tarball({"package/dist/x.js": b"export default 1;\n", "package/LICENSE": b"MIT\n"})
    pin = {"name": "x", "version": "1.0.0", "integrity": vj.integrity(tarball), "license": "MIT",
           "files": {"package/dist/x.js": "x.js", "package/LICENSE": "x.LICENSE.txt"}}  # fmt: skip
    return Fake(tarball, pin)


def test_committed_vendor_files_match_their_pins():
    vj.check(vj.PINS)  # raises if a file was edited, is missing or is another version


def test_pinned_uplot_is_what_index_html_loads():
    static = vj.VENDOR.parent
    assert '"vendor/uPlot.min.css"' in (static / "index.html").read_text()
    assert 'from "../vendor/uPlot.esm.js"' in (static / "lib" / "chart.js").read_text()
    assert [p["name"] for p in vj.PINS] == ["uplot"]


def test_extract_returns_the_listed_files(fake: Fake):
    files = vj.extract(fake.pin, fake.tarball, fake.pin["integrity"])
    assert files == {"x.js": b"export default 1;\n", "x.LICENSE.txt": b"MIT\n"}


def test_extract_refuses_a_tarball_that_differs_from_the_pin(fake: Fake):
    with pytest.raises(vj.VendorError, match=r"x@1.0.0: the tarball's integrity is sha512-"):
        vj.extract(fake.pin, fake.tarball + b"\0", fake.pin["integrity"])


def test_extract_refuses_when_the_registry_disagrees_with_the_pin(fake: Fake):
    with pytest.raises(vj.VendorError, match=r"the registry's integrity sha512-AAAA differs"):
        vj.extract(fake.pin, fake.tarball, "sha512-AAAA")


def test_extract_names_a_listed_file_missing_from_the_tarball(fake: Fake):
    fake.pin["files"]["package/dist/gone.js"] = "gone.js"
    with pytest.raises(vj.VendorError, match=r"package/dist/gone.js is not in the tarball"):
        vj.extract(fake.pin, fake.tarball, fake.pin["integrity"])


def test_check_refuses_an_edited_vendored_file(tmp_path: pathlib.Path):
    vendor = tmp_path / "vendor"
    shutil.copytree(vj.VENDOR, vendor)
    vj.check(vj.PINS, vendor)
    with open(vendor / "uPlot.esm.js", "a") as f:
        f.write("// local edit\n")
    with pytest.raises(vj.VendorError, match=r"uPlot.esm.js: sha256 differs from VERSIONS.json"):
        vj.check(vj.PINS, vendor)


def test_check_refuses_another_version(tmp_path: pathlib.Path):
    vendor = tmp_path / "vendor"
    shutil.copytree(vj.VENDOR, vendor)
    pins = [dict(vj.PINS[0], version="9.9.9")]
    with pytest.raises(vj.VendorError, match=r"uplot is 1.6.32, pinned 9.9.9"):
        vj.check(pins, vendor)
