"""Assembles linseq as a Hugging Face `kernels` repository (the layout `kernels.get_kernel` and
`kernels.get_local_kernel` load): one CPU build variant for this machine and the installed
PyTorch,

    OUT/build/torch<MAJOR><MINOR>-cpu-<arch>-<os>/
        metadata.json          what `kernels` reads: id, name, version, license, backend
        linseq/__init__.py     the kernel's module (tools/kernels/entry.py): the drop-in names
        linseq/_linseq/        the Python package python/linseq, with liblinseq.so inside

    python3 tools/kernels/build.py --library build/liblinseq.so --out build/kernels/linseq
                                   [--torch-version 2.15] [--license SPDX]

Nothing is compiled here: the library is the one `make lib` built. `kernels` imports the
module under the metadata id, so the package inside is a second copy of linseq beside any
installed one. Two things change in the copy: its PyTorch custom-op namespace is the id (two
copies registering linseq::* ops would clash in one process), and the module names it
imports by string ("linseq.torch") name its own modules, never an installed linseq. The variant
names the PyTorch version because `kernels` matches it exactly; linseq itself uses no C++ ABI
of PyTorch, so rebuilding for another version only renames the folder. On a CUDA build of
PyTorch `kernels` looks for CUDA variants first: load this one with backend="cpu".
"""

import argparse
import ctypes
import hashlib
import json
import os
import platform
import re
import shutil
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "python", "linseq")
ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "entry.py")
KERNEL_NAME = "linseq"
KERNEL_API_VERSION = 1  # the `version` of metadata.json: the exported names' contract
NAMESPACE_LINE = 'NAMESPACE = "linseq"\n'
# A string literal that is a whole dotted module name inside linseq ("linseq.torch"): the
# package's absolute references to itself, through importlib and sys.modules
SELF_REFERENCE = re.compile(r"""(["'])linseq((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\1""")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", required=True, help="the built liblinseq.so")
    parser.add_argument("--out", required=True, help="the kernel repository to write")
    parser.add_argument("--torch-version", help="MAJOR.MINOR (default: the importable torch)")
    parser.add_argument("--license", default="NOASSERTION",
                        help="SPDX license id for metadata.json (default: NOASSERTION)")
    return parser.parse_args(argv)


def torch_version(given):
    if given is None:
        try:
            import torch
        except ImportError:
            sys.exit("build.py: no torch to read the version from: pass --torch-version MAJOR.MINOR "
                     "(make kernels-build TORCH_VERSION=MAJOR.MINOR, or KERNELS_PYTHON=a Python with torch)")
        given = torch.__version__
    parts = given.split("+")[0].split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        sys.exit(f"build.py: --torch-version: expected MAJOR.MINOR, got {given!r}")
    return parts[0], parts[1]


def variant_name(torch_major, torch_minor):
    """The folder name `kernels` matches against this system: torch version, backend, CPU
    architecture and OS, as platform reports them."""
    arch = platform.machine()
    os_name = platform.system().lower()
    return f"torch{torch_major}{torch_minor}-cpu-{arch}-{os_name}"


def library_version(library):
    """The library's own version (loading it also proves it is a loadable liblinseq)."""
    try:
        lib = ctypes.CDLL(os.path.abspath(library))
    except OSError as exc:
        sys.exit(f"build.py: --library: cannot load {library!r}: {exc}")
    lib.linseq_version.restype = ctypes.c_char_p
    return lib.linseq_version().decode()


def _not_python(folder, names):
    """copytree's ignore: everything but Python modules and sub-packages, and linseq's
    integrations (hooks into frameworks: the kernel is what those hooks would load)."""
    return [n for n in names if n in ("__pycache__", "integrations") or
            (not n.endswith(".py") and not os.path.isdir(os.path.join(folder, n)))]


def copy_package(dest, library):
    """python/linseq's modules and the library, into dest."""
    shutil.copytree(PACKAGE, dest, ignore=_not_python)
    shutil.copyfile(library, os.path.join(dest, "liblinseq.so"))


def content_digest(folder):
    """sha256 over every file's relative path and bytes, in a fixed order."""
    digest = hashlib.sha256()
    for base, dirs, files in sorted(os.walk(folder)):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(base, name)
            digest.update(os.path.relpath(path, folder).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def rename_op_namespace(package, namespace):
    """The copy's custom ops under `namespace` instead of linseq::."""
    path = os.path.join(package, "_torch_ops.py")
    with open(path) as f:
        lines = f.readlines()
    if lines.count(NAMESPACE_LINE) != 1:
        sys.exit(f"build.py: {os.path.relpath(path, package)} no longer has the one line "
                 f"{NAMESPACE_LINE.strip()!r} this script renames; update the script")
    lines[lines.index(NAMESPACE_LINE)] = f'NAMESPACE = "{namespace}"\n'
    with open(path, "w") as f:
        f.writelines(lines)


def point_self_references(package, full_name):
    """The copy's absolute references to linseq's modules, to its own modules (full_name is
    the copy's importable name), so that it never imports an installed linseq."""
    for base, _, files in os.walk(package):
        for name in (n for n in files if n.endswith(".py")):
            path = os.path.join(base, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            changed = SELF_REFERENCE.sub(lambda m: f"{m[1]}{full_name}{m[2]}{m[1]}", text)
            if changed != text:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(changed)


def write_metadata(variant_dir, kernel_id, license_id):
    metadata = {"id": kernel_id, "name": KERNEL_NAME, "version": KERNEL_API_VERSION,
                "license": license_id, "python-depends": [], "backend": {"type": "cpu"}}
    with open(os.path.join(variant_dir, "metadata.json"), "w") as f:
        json.dump(metadata, f, indent=2)
        f.write("\n")


def build(library, out, torch_major_minor, license_id):
    """Writes the variant folder and returns its path."""
    version = library_version(library)
    variant_dir = os.path.join(out, "build", variant_name(*torch_major_minor))
    if os.path.isdir(variant_dir):
        shutil.rmtree(variant_dir)
    module_dir = os.path.join(variant_dir, KERNEL_NAME)
    package_dir = os.path.join(module_dir, "_linseq")
    copy_package(package_dir, library)
    shutil.copyfile(ENTRY, os.path.join(module_dir, "__init__.py"))
    # The id names the module `kernels` imports and the copy's op namespace: one per content,
    # so two different builds can share a process as well.
    kernel_id = f"_{KERNEL_NAME}_{version.replace('.', '_')}_{content_digest(module_dir)[:10]}"
    rename_op_namespace(package_dir, kernel_id)
    point_self_references(package_dir, f"{kernel_id}._linseq")
    write_metadata(variant_dir, kernel_id, license_id)
    return variant_dir


def main(argv=None):
    args = parse_args(argv)
    variant_dir = build(args.library, args.out, torch_version(args.torch_version), args.license)
    print(f"kernels build: {variant_dir}")


if __name__ == "__main__":
    main()
