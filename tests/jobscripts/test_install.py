"""Installing like HPC software (docs/install.md): `cmake --install` into a prefix, the prefix
moved elsewhere, then, as a user on a cluster would, Debian's environment-modules loads its
generated modulefile in a clean shell, the quickstart runs from PATH on 2 MPI ranks and
trainscope-post summarises its file. The moved prefix must not name the old one anywhere, and the
moved binary must still find every library (RPATH $ORIGIN/../lib plus its dependencies' absolute
directories)."""

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import h5py
import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("TRAINSCOPE_BUILD_DIR", ROOT / "build"))
VERSION = re.search(r"project\(trainscope VERSION (\S+)", (ROOT / "CMakeLists.txt").read_text())[1]
MODULES_INIT = Path("/usr/share/modules/init/bash")  # Debian's environment-modules
CACHE = Path(os.environ.get("TRAINSCOPE_CACHE", Path.home() / ".cache" / "trainscope"))
LMOD = CACHE / "lmod" / "usr" / "share" / "lmod" / "lmod" / "libexec" / "lmod"  # scripts/setup
SHORT = ["--train.max_iters=5", "--profile.warmup_iters=1", "--log.every=0",
         "--telemetry.enabled=false", "--train.eval=false"]


def clean_env(**extra):
    """A login-like environment: nothing from the clone or the venv (no PYTHONPATH, no
    TRAINSCOPE_*), so that only the module can make trainscope and its tools work."""
    env = {k: os.environ[k] for k in ("HOME", "USER", "LANG", "TMPDIR") if k in os.environ}
    env.update(PATH="/usr/local/bin:/usr/bin:/bin", OMP_NUM_THREADS="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", **extra)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def module_shell(script, prefix, cwd, timeout=300, lmod=False, modulepath=None, **env):
    """Runs `script` in bash after `module use <prefix>/share/modulefiles; module load trainscope`
    (or `module use <modulepath>`) with environment-modules, or with Lmod."""
    if lmod:
        assert LMOD.is_file(), f"Lmod missing ({LMOD}): scripts/setup --tests unpacks it"
        init = f'module() {{ eval "$({LMOD} bash "$@")"; }}'
    else:
        assert MODULES_INIT.is_file(), "environment-modules missing: scripts/setup --tests"
        init = f"source {MODULES_INIT}"
    head = (f"set -euo pipefail; {init}; "
            f"module use {modulepath or prefix / 'share/modulefiles'}; module load trainscope\n")
    return subprocess.run(["bash", "--noprofile", "--norc", "-c", head + script], cwd=cwd,
                          env=clean_env(**env), capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    """(old prefix, moved prefix): installed into p1, then moved to p2 (p1 no longer exists)."""
    assert (BUILD / "app" / "trainscope").is_file(), f"{BUILD} not built: run scripts/build"
    base = tmp_path_factory.mktemp("install")
    p1, p2 = base / "p1", base / "elsewhere" / "p2"
    t0 = time.monotonic()
    proc = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(p1)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    print(f"cmake --install: {time.monotonic() - t0:.1f} s")
    p2.parent.mkdir()
    shutil.move(p1, p2)
    return p1, p2


def test_layout(moved):
    _, p = moved
    for f in ["bin/trainscope", "bin/trainscope-post", "bin/trainscope-study",
              f"share/modulefiles/trainscope/{VERSION}", "share/trainscope/README.md",
              "share/trainscope/inputs/quickstart.ini", "share/trainscope/jobscripts/sweep",
              "share/trainscope/jobscripts/slurm/train.sbatch", "share/trainscope/docs/install.md",
              "share/trainscope/postprocess/trainscope_post/findings.toml",
              "share/trainscope/postprocess/trainscope_jobs/schedulers/slurm.py"]:
        assert (p / f).is_file(), f
    for exe in ["bin/trainscope", "bin/trainscope-post", "bin/trainscope-study",
                "share/trainscope/jobscripts/sweep", "share/trainscope/jobscripts/study"]:
        assert os.access(p / exe, os.X_OK), exe
    # Every tracked input and job script, none of the clone's build or cache files.
    tracked = subprocess.run(["git", "ls-files", "inputs", "jobscripts"], cwd=ROOT,
                             capture_output=True, text=True).stdout.split()
    if tracked:  # a source tarball without .git: nothing to compare with
        missing = [f for f in tracked if not (p / "share/trainscope" / f).exists()]
        assert not missing
    assert not list(p.rglob("__pycache__")) and not list(p.rglob("*.egg-info"))


def test_nothing_names_the_old_prefix(moved):
    old, p = moved
    needle = str(old).encode()
    hits = [f for f in p.rglob("*") if f.is_file() and needle in f.read_bytes()]
    assert not hits, hits


def test_moved_binary_finds_its_libraries(moved):
    _, p = moved
    exe = p / "bin" / "trainscope"
    dyn = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True).stdout
    runpath = re.search(r"\((?:RUNPATH|RPATH)\)\s+Library r(?:un)?path: \[(.*)\]", dyn)
    assert runpath, dyn
    # The CUDA/NCCL wheels' directories lead (cmake/TrainscopeDependencies.cmake), then
    # trainscope's own $ORIGIN/../lib and the link directories of LibTorch, Open MPI, HDF5.
    entries = [e for e in runpath[1].split(":") if e]
    assert "$ORIGIN/../lib" in entries, entries
    # Nothing from the build tree; the external libraries' directories are absolute.
    assert not [e for e in entries if str(BUILD.resolve()) in e or str(ROOT) in e], entries
    assert all(e.startswith("/") for e in entries if e != "$ORIGIN/../lib"), entries
    # libstdc++ is needed before libtorch, so that std::filesystem binds to the system's and not
    # to the copy some LibTorch wheels export (cmake/TrainscopeDependencies.cmake).
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dyn)
    assert needed.index("libstdc++.so.6") < min(
        i for i, n in enumerate(needed) if n.startswith("libtorch")), needed
    ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True, env=clean_env())
    assert ldd.returncode == 0 and "not found" not in ldd.stdout, ldd.stdout
    assert "libtorch" in ldd.stdout and "libmpi" in ldd.stdout, ldd.stdout


@pytest.mark.parametrize("lmod", [False, True], ids=["environment-modules", "lmod"])
def test_modulefile_sets_the_moved_prefix(moved, lmod):
    _, p = moved
    proc = module_shell('echo "PATH=$PATH"; echo "ROOT=$TRAINSCOPE_ROOT"; '
                        'echo "BINARY=$TRAINSCOPE_BINARY"; command -v trainscope', p, p,
                        lmod=lmod)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    real = p.resolve()
    assert f"PATH={real}/bin:" in proc.stdout
    assert f"ROOT={real}/share/trainscope\n" in proc.stdout
    assert f"BINARY={real}/bin/trainscope\n" in proc.stdout
    assert proc.stdout.rstrip().endswith(f"{real}/bin/trainscope")


@pytest.mark.parametrize("lmod", [False, True], ids=["environment-modules", "lmod"])
def test_modulefile_linked_into_a_site_tree(moved, tmp_path, lmod):
    """A site links the modulefile into its own module tree: the link is followed to the prefix."""
    _, p = moved
    site = tmp_path / "site-modules"
    (site / "trainscope").mkdir(parents=True)
    target = p / "share" / "modulefiles" / "trainscope" / VERSION
    (site / "trainscope" / VERSION).symlink_to(os.path.relpath(target, site / "trainscope"))
    proc = module_shell('echo "BINARY=$TRAINSCOPE_BINARY"', p, tmp_path, lmod=lmod,
                        modulepath=site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"BINARY={p.resolve()}/bin/trainscope\n" in proc.stdout


def test_quickstart_from_the_module(moved, tmp_path):
    """The README's quick start, from PATH, in a directory of the user's, then the summary."""
    _, p = moved
    t0 = time.monotonic()
    proc = module_shell(
        f'mpirun -np 2 trainscope --config "$TRAINSCOPE_ROOT/inputs/quickstart.ini" '
        f'--output.file=q.h5 {" ".join(SHORT)}\n'
        "trainscope-post summary q.h5\n", p, tmp_path, timeout=600)
    print(f"module load + quickstart ({SHORT[0]}) + summary: {time.monotonic() - t0:.1f} s")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with h5py.File(tmp_path / "q.h5", "r") as f:
        assert f.attrs["status"] in ("completed", b"completed")
        assert int(f.attrs["world_size"]) == 2
    # The summary's table: a header and one row, this run file's, completed on 2 ranks.
    lines = proc.stdout.splitlines()
    header = [i for i, line in enumerate(lines) if line.split()[:2] == ["file", "workload"]]
    assert len(header) == 1, proc.stdout
    rows = [line.split() for line in lines[header[0] + 1:] if line.strip()]
    assert len(rows) == 1, proc.stdout
    assert rows[0][:7] == ["q.h5", "cv", "ddp-ds", "fp32", "2", "1", "fashion-mnist"], rows
    assert "completed" in rows[0], rows


def test_wrappers_use_the_installed_package(moved, tmp_path):
    """trainscope-post runs the package under <prefix>/share/trainscope/postprocess with the
    configured Python; TRAINSCOPE_PYTHON names another interpreter (here a stub that reports)."""
    _, p = moved
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\necho "args=$*"\necho "PYTHONPATH=$PYTHONPATH"\n'
                    'echo "ROOT=$TRAINSCOPE_ROOT"\n')
    stub.chmod(0o755)
    proc = module_shell("trainscope-post summary x.h5; trainscope-study --help", p, tmp_path,
                        TRAINSCOPE_PYTHON=str(stub))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    real = p.resolve()
    assert "args=-m trainscope_post summary x.h5" in proc.stdout
    assert "args=-m trainscope_jobs.study_cmd --help" in proc.stdout
    assert f"PYTHONPATH={real}/share/trainscope/postprocess\n" in proc.stdout
    # The real interpreter: the study runner starts from the installed job-script templates.
    proc = module_shell("trainscope-study --help", p, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_sweep_defaults_to_the_installed_binary(moved, tmp_path):
    """A job script rendered from the installed templates runs the module's binary."""
    _, p = moved
    proc = module_shell(
        '"$TRAINSCOPE_ROOT/jobscripts/sweep" --config "$TRAINSCOPE_ROOT/inputs/quickstart.ini" '
        "--scheduler slurm --nodes 1 --ranks-per-node 2 --mode strong --global-batch 64 "
        "--out study --dry-run", p, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    scripts = list((tmp_path / "study").rglob("job.sbatch"))
    assert scripts
    assert f"{p.resolve()}/bin/trainscope" in scripts[0].read_text()


def test_wrappers_and_modulefile_are_clean(moved):
    _, p = moved
    exe = shutil.which("shellcheck")
    assert exe, "shellcheck missing: scripts/setup --tests installs it"
    proc = subprocess.run([exe, "-x", "-S", "warning", str(p / "bin/trainscope-post"),
                           str(p / "bin/trainscope-study")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    # Tcl syntax as environment-modules reads it (module show parses without loading).
    proc = module_shell(f"module show trainscope/{VERSION}", p, p)
    assert proc.returncode == 0 and "TRAINSCOPE_BINARY" in proc.stderr + proc.stdout, proc.stderr
