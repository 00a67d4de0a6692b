"""Every ELF file in both manylinux wheels checked against the policy its tag claims, with
binutils' readelf (not auditwheel, which built the claim): the machine matches the tag's
architecture; every needed library is one the policy lets a wheel assume (or glibc's own
dynamic loader, the program's interpreter); every versioned symbol
it references (GLIBC_*, GLIBCXX_*, CXXABI_*, GCC_*) is one the policy allows for that
architecture — for manylinux_2_28 nothing newer than GLIBC_2.28 or GLIBCXX_3.4.24; and nothing
names a run path outside the wheel.

    wheel_symbols_test.py WHEEL_DIR
    wheel_symbols_test.py --self-test WHEEL_DIR   the check fails on a wheel that claims
                                                  manylinux_2_28 but holds this machine's
                                                  /usr/bin/true (glibc 2.36: GLIBC_2.34)
Run by the wheel-tools venv's python (auditwheel's policy file is read from its package).
"""
import os
import re
import subprocess
import sys
import tempfile
import zipfile

MACHINES = {"x86_64": "Advanced Micro Devices X86-64", "aarch64": "AArch64"}


def fail(message):
    print(f"wheel_symbols_test: {message}", file=sys.stderr)
    sys.exit(1)


def policy_file():
    import importlib.util

    spec = importlib.util.find_spec("auditwheel")
    if spec is None or spec.origin is None:
        fail("no auditwheel in this python (run it with /opt/cpprun/wheel-tools/bin/python)")
    return os.path.join(os.path.dirname(spec.origin), "policy", "manylinux-policy.json")


def readelf(*args):
    out = subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail(f"readelf {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def version_key(text):
    return tuple(int(part) for part in text.split("."))


def check_elf(path, name, arch, policy):
    header = readelf("-h", path)
    machine = re.search(r"Machine:\s+(.*)", header).group(1).strip()
    if machine != MACHINES[arch]:
        fail(f"{name} is for {machine}, the wheel says {arch}")
    dynamic = readelf("-d", path)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dynamic)
    # The program interpreter (glibc's dynamic loader) is glibc itself, always present.
    interp = re.search(r"Requesting program interpreter: (.*)\]", readelf("-l", path))
    loader = [os.path.basename(interp.group(1))] if interp else []
    outside = [lib for lib in needed if lib not in policy["lib_whitelist"] + loader]
    if outside:
        fail(f"{name} needs {outside}, which {policy['name']} does not let a wheel assume")
    if re.search(r"\((RPATH|RUNPATH)\)", dynamic):
        fail(f"{name} has a run path: {re.findall(r'(?:RPATH|RUNPATH).*', dynamic)}")
    allowed = policy["symbol_versions"][arch]
    used = {}
    # .gnu.version_r: "  0x0010:   Name: GLIBC_2.17  Flags: none  Version: 3"
    for prefix, version in re.findall(r"Name: ([A-Z]+)_([0-9.]+)\s", readelf("-V", path)):
        used.setdefault(prefix, set()).add(version)
    for prefix, versions in used.items():
        if prefix not in allowed:
            fail(f"{name} references {prefix}_* symbols, which {policy['name']} does not allow")
        too_new = sorted(v for v in versions if v not in allowed[prefix])
        if too_new:
            fail(f"{name} references {prefix}_{too_new}, newer than {policy['name']} allows "
                 f"(up to {prefix}_{max(allowed[prefix], key=version_key)})")
    newest = {p: max(v, key=version_key) for p, v in used.items()}
    print(f"wheel_symbols_test: {name} ({arch}): needs {', '.join(needed)}; newest "
          + ", ".join(f"{p}_{v}" for p, v in sorted(newest.items())))
    return newest


def main():
    import json

    wheel_dir = sys.argv[1]
    with open(policy_file()) as f:
        policies = {p["name"]: p for p in json.load(f)}
    wheels = sorted(w for w in os.listdir(wheel_dir) if w.endswith(".whl"))
    tags = {}
    for wheel in wheels:
        m = re.match(r"cpprun-[0-9.]+-py3-none-(manylinux_\d+_\d+)_(x86_64|aarch64)\.whl$", wheel)
        if not m:
            fail(f"unexpected wheel {wheel}")
        tags[m.group(2)] = (m.group(1), wheel)
    if sorted(tags) != ["aarch64", "x86_64"]:
        fail(f"{wheel_dir} should hold one x86_64 and one aarch64 wheel, it holds {wheels}")
    for arch, (tag, wheel) in sorted(tags.items()):
        if tag != "manylinux_2_28":
            fail(f"{wheel} is tagged {tag}, not manylinux_2_28")
        policy = policies[tag]
        elves = 0
        with tempfile.TemporaryDirectory() as scratch:
            with zipfile.ZipFile(os.path.join(wheel_dir, wheel)) as z:
                z.extractall(scratch)
            for root, _, files in os.walk(scratch):
                for file in files:
                    path = os.path.join(root, file)
                    with open(path, "rb") as f:
                        if f.read(4) != b"\x7fELF":
                            continue
                    check_elf(path, f"{wheel}:{os.path.relpath(path, scratch)}", arch, policy)
                    elves += 1
        if elves < 2:
            fail(f"{wheel} holds {elves} ELF files; cpprun and cpprun-store were expected")
    print("wheel_symbols_test: passed")


def self_test(wheel_dir):
    """A wheel whose binary is built against glibc 2.36 must fail the check, naming it."""
    import shutil

    with tempfile.TemporaryDirectory() as scratch:
        for wheel in os.listdir(wheel_dir):
            if wheel.endswith("_aarch64.whl"):
                shutil.copy(os.path.join(wheel_dir, wheel), scratch)
        bad = os.path.join(scratch, "cpprun-0.1.0-py3-none-manylinux_2_28_x86_64.whl")
        with zipfile.ZipFile(bad, "w") as z:
            z.write("/usr/bin/true", "cpprun-0.1.0.data/scripts/cpprun")
        out = subprocess.run([sys.executable, __file__, scratch], capture_output=True, text=True,
                             timeout=120)
        expected = "references GLIBC_['2.34'], newer than manylinux_2_28 allows (up to GLIBC_2.28)"
        if out.returncode == 0 or expected not in out.stderr:
            fail(f"the check passed or said something else for a glibc 2.36 binary:\n"
                 f"{out.stdout}{out.stderr}")
    print("wheel_symbols_test: self-test passed (a GLIBC_2.34 reference fails the check)")


if __name__ == "__main__":
    if sys.argv[1] == "--self-test":
        self_test(sys.argv[2])
    else:
        main()
