"""The packaging recipes kept in packaging/, checked as far as this machine allows (docs/install.md
says what is not run): the EasyBuild easyconfig through EasyBuild itself (checksums injected for a
`git archive` of the clone, --check-contrib, --dry-run and --extended-dry-run with Debian's
environment-modules); the Spack recipe loaded with a stub of Spack's package API (its variants,
dependencies and cmake_args for +cuda+nccl and ~cuda); the Apptainer definition's sections and
build commands against the project's CMake options and scripts/setup's packages."""

import ast
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERSION = re.search(r"project\(trainscope VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text())[1]
EASYCONFIG = ROOT / "packaging" / "easybuild" / f"trainscope-{VERSION}.eb"
SPACK_REPO = ROOT / "packaging" / "spack" / "spack_repo" / "trainscope"
APPTAINER_DEF = ROOT / "packaging" / "apptainer" / "trainscope.def"
CACHE = Path(os.environ.get("TRAINSCOPE_CACHE", Path.home() / ".cache" / "trainscope"))
EB = CACHE / "venv-easybuild" / "bin" / "eb"
MODULES_INIT = Path("/usr/share/modules/init/bash")


def cmake_cache_options():
    """The TRAINSCOPE_* cache variables and options that the project's CMake declares."""
    text = "".join(p.read_text() for p in [ROOT / "CMakeLists.txt", *ROOT.glob("cmake/*.cmake")])
    pattern = r"option\((TRAINSCOPE_\w+)|set\((TRAINSCOPE_\w+)[^)]*CACHE"
    return {a or b for a, b in re.findall(pattern, text)}


def setup_apt_packages(layer="APT_PACKAGES"):
    text = (ROOT / "scripts" / "setup").read_text()
    return re.search(rf"^{layer}=\(([^)]*)\)", text, re.M)[1].split()


def test_cmake_options_are_found():
    # The helper itself: the options the recipes set are declared.
    assert {"TRAINSCOPE_USE_CUDA", "TRAINSCOPE_USE_NCCL", "TRAINSCOPE_BUILD_TESTS",
            "TRAINSCOPE_USE_PCH"} <= cmake_cache_options()


# --- EasyBuild ------------------------------------------------------------------------------------

def read_easyconfig(path=EASYCONFIG):
    """The easyconfig's parameters: it is Python with EasyBuild's constants predefined."""
    ns = {"SYSTEM": {"name": "system", "version": "system"},
          "SOURCE_TAR_GZ": "%(name)s-%(version)s.tar.gz"}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns


def test_easyconfig_content():
    ec = read_easyconfig()
    assert (ec["name"], ec["version"], ec["toolchain"]["name"]) == ("trainscope", VERSION, "system")
    assert ec["easyblock"] in ("CMakeNinja", "CMakeMake")
    files = ec["sanity_check_paths"]["files"]
    assert "bin/trainscope" in files and "share/modulefiles/trainscope/%(version)s" in files
    assert ec["modextravars"] == {"TRAINSCOPE_ROOT": "%(installdir)s/share/trainscope",
                                  "TRAINSCOPE_BINARY": "%(installdir)s/bin/trainscope"}
    # Every OS dependency is one scripts/setup installs (g++ comes with build-essential).
    debs = {d[0] if isinstance(d, tuple) else d for d in ec["osdependencies"]}
    assert debs - {"g++"} <= set(setup_apt_packages())
    # configopts as the shell that runs cmake expands them: LibTorch's CMake package from the
    # Python in $TRAINSCOPE_PYTHON, and only options the project declares.
    python = sys.executable
    out = subprocess.run(["bash", "-c", f"printf '%s\\n' {ec['configopts']}"], text=True,
                         capture_output=True, env=dict(os.environ, TRAINSCOPE_PYTHON=python))
    assert out.returncode == 0, out.stderr
    opts = dict(a[2:].split("=", 1) for a in out.stdout.split())
    assert (Path(opts["CMAKE_PREFIX_PATH"]) / "Torch" / "TorchConfig.cmake").is_file(), opts
    assert Path(opts["TRAINSCOPE_PYTHON"]).resolve() == Path(python).resolve()
    assert {k for k in opts if k.startswith("TRAINSCOPE_")} <= cmake_cache_options() | {
        "TRAINSCOPE_PYTHON"}


@pytest.fixture(scope="module")
def eb(tmp_path_factory):
    """Runs eb in a scratch configuration (sources, builds, installs under a temporary
    directory) with Debian's environment-modules; returns (run, the easyconfig copy)."""
    assert EB.is_file(), f"EasyBuild missing ({EB}): scripts/setup --tests installs it"
    assert MODULES_INIT.is_file(), "environment-modules missing: scripts/setup --tests installs it"
    base = tmp_path_factory.mktemp("easybuild")
    # The source tarball EasyBuild expects (SOURCE_TAR_GZ), from the committed tree.
    tarball = base / "sources" / f"trainscope-{VERSION}.tar.gz"
    tarball.parent.mkdir()
    proc = subprocess.run(["git", "archive", f"--prefix=trainscope-{VERSION}/", "-o", str(tarball),
                           "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    ec = base / "ec" / EASYCONFIG.name
    ec.parent.mkdir()
    shutil.copy(EASYCONFIG, ec)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EASYBUILD_")}
    env.update(PATH=f"{EB.parent}:{env['PATH']}", TRAINSCOPE_PYTHON=sys.executable,
               EASYBUILD_SOURCEPATH=str(tarball.parent), EASYBUILD_PREFIX=str(base / "eb"),
               EASYBUILD_TMPDIR=str(base / "tmp"), EASYBUILD_MODULES_TOOL="EnvironmentModules",
               EASYBUILD_MODULE_SYNTAX="Tcl")
    root = ["--allow-use-as-root-and-accept-consequences"] if os.geteuid() == 0 else []

    def run(*args):
        cmd = " ".join(["eb", *root, *map(str, args)])
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-c",
                               f"source {MODULES_INIT}; {cmd}"], env=env, cwd=base,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout + proc.stderr

    # No release tarball, so no checksum is committed: inject the one of this tree's tarball, as
    # a maintainer does for a release (eb --inject-checksums).
    out = run(ec, "--inject-checksums")
    assert f"trainscope-{VERSION}.tar.gz: " in out
    assert re.search(r"^checksums = \['[0-9a-f]{64}'\]", ec.read_text(), re.M)
    return run, ec


def test_eb_check_contrib(eb):
    run, ec = eb
    out = run(ec, "--check-contrib")  # code style (pycodestyle) and checksums
    assert "All contribution checks PASSed" in out, out


def test_eb_dry_run(eb):
    run, ec = eb
    out = run(ec, "--dry-run")
    assert re.search(r"\[ \] .*trainscope-.*\.eb \(module: trainscope/" + re.escape(VERSION), out)
    out = run(ec, "--extended-dry-run")
    assert f"trainscope-{VERSION}.tar.gz found at" in out
    assert "*** DRY RUN using 'CMakeNinja' easyblock" in out
    for path in ["bin/trainscope", f"share/modulefiles/trainscope/{VERSION}",
                 "share/trainscope/postprocess/trainscope_post",
                 "share/trainscope/postprocess/trainscope_jobs/schedulers"]:
        assert f"  * {path}\n" in out, path
    assert re.search(r"setenv\s+TRAINSCOPE_ROOT\s+\"\S+/software/trainscope/" + re.escape(VERSION)
                     + r"/share/trainscope\"", out), out
    assert "Build succeeded for 1 out of 1" in out


# --- Spack ----------------------------------------------------------------------------------------

class Directives:
    """What the recipe declared: each directive call with its arguments."""

    def __init__(self):
        self.calls = []

    def record(self, name):
        def directive(*args, **kwargs):
            self.calls.append((name, args, kwargs))
        return directive

    def of(self, name):
        return [(a, k) for n, a, k in self.calls if n == name]


class FakePrefix(str):
    """Spack's Prefix: a path whose attributes are subdirectories."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return FakePrefix(os.path.join(self, name))


class FakeSpec:
    """`+cuda+nccl cuda_arch=80,90a` and the like, with dependency prefixes under `root`."""

    def __init__(self, on, cuda_arch=(), root="/spack"):
        self.on, self.root = set(on), root
        self.variants = {v: types.SimpleNamespace(value=True) for v in self.on}
        self.variants["cuda_arch"] = types.SimpleNamespace(value=tuple(cuda_arch) or ("none",))

    def satisfies(self, text):
        for tok in re.findall(r"[+~][\w-]+", text):
            if (tok[0] == "+") != (tok[1:] in self.on):
                return False
        return True

    def __getitem__(self, name):
        prefix = FakePrefix(os.path.join(self.root, name))
        return types.SimpleNamespace(prefix=prefix, command=types.SimpleNamespace(
            path=os.path.join(prefix, "bin", name)))


def spack_stub(directives):
    """The modules `from spack... import` names in the recipe, as far as it uses them."""
    rec = directives.record

    class InstallError(Exception):
        pass

    class CMakePackage:
        run_tests = False

        def __init__(self, spec):
            self.spec = spec

        @staticmethod
        def define(name, value):  # as Spack's CMakeBuilder.define writes it
            kind = "BOOL" if isinstance(value, bool) else "STRING"
            value = ("ON" if value else "OFF") if isinstance(value, bool) else value
            return f"-D{name}:{kind}={value}"

        def define_from_variant(self, name, variant):
            return self.define(name, self.spec.satisfies("+" + variant))

    class CudaPackage:
        cuda_arch_values = ("70", "80", "90", "90a", "100")
        rec("variant")("cuda", default=False, description="Build with CUDA")

    package = types.ModuleType("spack.package")
    for name in ("version", "variant", "depends_on", "conflicts", "extends", "license"):
        setattr(package, name, rec(name))
    package.join_path = os.path.join
    package.InstallError = InstallError
    cmake = types.ModuleType("spack_repo.builtin.build_systems.cmake")
    cmake.CMakePackage, cmake.generator = CMakePackage, rec("generator")
    cuda = types.ModuleType("spack_repo.builtin.build_systems.cuda")
    cuda.CudaPackage = CudaPackage
    return {"spack": types.ModuleType("spack"), "spack.package": package,
            "spack_repo": types.ModuleType("spack_repo"),
            "spack_repo.builtin": types.ModuleType("spack_repo.builtin"),
            "spack_repo.builtin.build_systems": types.ModuleType("b"),
            "spack_repo.builtin.build_systems.cmake": cmake,
            "spack_repo.builtin.build_systems.cuda": cuda}


@pytest.fixture(scope="module")
def spack_recipe():
    directives = Directives()
    saved = dict(sys.modules)
    sys.modules.update(spack_stub(directives))
    try:
        path = SPACK_REPO / "packages" / "trainscope" / "package.py"
        ns = {"__file__": str(path), "__name__": "spack_repo.trainscope.packages.trainscope"}
        exec(compile(path.read_text(), str(path), "exec"), ns)
    finally:
        sys.modules.clear()
        sys.modules.update(saved)
    return ns["Trainscope"], directives


def test_spack_repository_layout():
    text = (SPACK_REPO / "repo.yaml").read_text()
    assert re.search(r"^  namespace: trainscope$", text, re.M)  # = its directory's name
    assert re.search(r"^  api: v2\.\d+$", text, re.M)  # Spack >= 1.0 repositories
    tree = ast.parse((SPACK_REPO / "packages" / "trainscope" / "package.py").read_text())
    imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {"spack.package", "spack_repo.builtin.build_systems.cmake",
            "spack_repo.builtin.build_systems.cuda"} <= imports


def test_spack_variants_and_dependencies(spack_recipe):
    cls, d = spack_recipe
    assert [c.__name__ for c in cls.__mro__[1:3]] == ["CMakePackage", "CudaPackage"]
    variants = {a[0]: k for a, k in d.of("variant")}
    assert set(variants) == {"cuda", "nccl"} and variants["nccl"]["default"] is False
    assert (("+nccl",), "~cuda") in [(a, k.get("when")) for a, k in d.of("conflicts")]
    assert d.of("generator") == [(("ninja",), {})]
    deps = [(a[0], k.get("when"), k.get("type")) for a, k in d.of("depends_on")]
    for spec in ["mpi@3:", "hdf5@1.10:+mpi", "boost@1.71:+program_options", "spdlog@1.9:",
                 "nlohmann-json@3.10:", "zlib-api", "libjpeg-turbo", "libpng", "pcre2"]:
        assert (spec, None, None) in deps, spec  # build and link
    assert ("googletest", None, "test") in deps
    assert ("cmake@3.25:", None, "build") in deps and ("ninja", None, "build") in deps
    # py-torch's CUDA follows trainscope's, arch by arch; one NCCL.
    assert ("py-torch~cuda", "~cuda", None) in deps and ("py-torch+cuda", "+cuda", None) in deps
    assert ("nccl", "+nccl", None) in deps and ("py-torch+nccl", "+nccl", None) in deps
    for arch in ("80", "90a"):
        assert (f"py-torch+cuda cuda_arch={arch}", f"+cuda cuda_arch={arch}", None) in deps
    for mod in ["py-numpy", "py-h5py", "py-pandas", "py-matplotlib"]:
        assert (mod, None, "run") in deps, mod
    assert d.of("extends") == [(("python",), {})]


def fake_torch(root):
    cfg = root / "py-torch" / "lib" / "python3.11" / "site-packages" / "torch" / "share" / "cmake"
    (cfg / "Torch").mkdir(parents=True)
    (cfg / "Torch" / "TorchConfig.cmake").write_text("")
    return cfg / "Torch"


def test_spack_cmake_args_cuda_nccl(spack_recipe, tmp_path):
    cls, _ = spack_recipe
    torch_dir = fake_torch(tmp_path)
    args = cls(FakeSpec({"cuda", "nccl"}, ("80", "90a"), root=str(tmp_path))).cmake_args()
    assert "-DTRAINSCOPE_USE_CUDA:BOOL=ON" in args and "-DTRAINSCOPE_USE_NCCL:BOOL=ON" in args
    assert "-DTRAINSCOPE_BUILD_TESTS:BOOL=OFF" in args
    assert f"-DTorch_DIR:STRING={torch_dir}" in args
    assert "-DTORCH_CUDA_ARCH_LIST:STRING=8.0;9.0a" in args
    assert f"-DCUDAToolkit_ROOT:STRING={tmp_path}/cuda" in args
    assert f"-DNCCL_LIBRARY:STRING={tmp_path}/nccl/lib/libnccl.so" in args
    assert f"-DTRAINSCOPE_PYTHON:STRING={tmp_path}/python/bin/python" in args
    # +cuda alone: the CUDA path without NCCL.
    cuda_only = cls(FakeSpec({"cuda"}, ("90",), root=str(tmp_path))).cmake_args()
    assert "-DTRAINSCOPE_USE_CUDA:BOOL=ON" in cuda_only
    assert "-DTRAINSCOPE_USE_NCCL:BOOL=OFF" in cuda_only
    assert not [a for a in cuda_only if "NCCL_" in a]
    names = {a[2:].split(":", 1)[0] for a in args}
    assert {n for n in names if n.startswith("TRAINSCOPE_")} <= cmake_cache_options() | {
        "TRAINSCOPE_PYTHON"}


def test_spack_cmake_args_cpu(spack_recipe, tmp_path):
    cls, _ = spack_recipe
    fake_torch(tmp_path)
    args = cls(FakeSpec(set(), root=str(tmp_path))).cmake_args()
    assert "-DTRAINSCOPE_USE_CUDA:BOOL=OFF" in args and "-DTRAINSCOPE_USE_NCCL:BOOL=OFF" in args
    assert not [a for a in args if "CUDA_ARCH" in a or "NCCL_" in a or "CUDAToolkit" in a]
    # Without py-torch's CMake package the recipe says where it looked.
    shutil.rmtree(tmp_path / "py-torch")
    with pytest.raises(Exception, match="TorchConfig.cmake not found"):
        cls(FakeSpec(set(), root=str(tmp_path))).cmake_args()


# --- Apptainer ------------------------------------------------------------------------------------

def def_sections(text):
    """{section: body} of an Apptainer definition (the header under "header")."""
    parts = re.split(r"^%(\w+)[ \t]*$", text, flags=re.M)
    out = {"header": parts[0]}
    out.update(zip(parts[1::2], parts[2::2]))
    return out


def test_apptainer_definition():
    text = APPTAINER_DEF.read_text()
    s = def_sections(text)
    assert {"arguments", "labels", "help", "files", "post", "environment", "runscript",
            "test"} <= set(s)
    assert re.search(r"^Bootstrap: docker$", s["header"], re.M)
    assert re.search(r"^From: debian:12$", s["header"], re.M)
    # The build installs scripts/setup's run layer and its torch pin.
    post = s["post"]
    missing = [p for p in setup_apt_packages() if not re.search(rf"\s{re.escape(p)}(\s|$)", post)]
    assert not missing
    torch = re.search(r"^TORCH_VERSION=(\S+)", (ROOT / "scripts/setup").read_text(), re.M)[1]
    assert re.search(rf"^\s+TORCH_VERSION={re.escape(torch)}$", s["arguments"], re.M)
    # Every {{ ARG }} used is declared; every -D option the build passes exists in the project.
    declared = set(re.findall(r"^\s+(\w+)=", s["arguments"], re.M))
    assert set(re.findall(r"\{\{\s*(\w+)\s*\}\}", text)) <= declared
    options = set(re.findall(r"-D(TRAINSCOPE_\w+)=", post))
    assert {"TRAINSCOPE_USE_CUDA", "TRAINSCOPE_USE_NCCL", "TRAINSCOPE_BUILD_TESTS"} <= options
    assert options <= cmake_cache_options() | {"TRAINSCOPE_PYTHON"}
    assert "cmake --install /opt/src/build --prefix /opt/trainscope" in post
    # The hybrid model, as documented: the host's launcher starts the container per rank.
    assert "mpirun -np 8 apptainer exec --nv" in s["help"]
    assert "srun --mpi=pmix" in s["help"]
    assert "export TRAINSCOPE_BINARY=/opt/trainscope/bin/trainscope" in s["environment"]
    # The file the %files section copies is the one docs/install.md says to make.
    src = s["files"].split()[-2]
    assert src == "trainscope-src.tar.gz"
    assert f"git archive --prefix=trainscope/ -o {src} HEAD" in text

