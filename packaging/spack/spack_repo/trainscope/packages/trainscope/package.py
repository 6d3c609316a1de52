# Spack recipe for trainscope, kept in the project's repository (Spack >= 1.0 repository layout):
#   spack repo add <clone>/packaging/spack/spack_repo/trainscope
#   spack install trainscope@main +cuda +nccl cuda_arch=90 ^openmpi
# docs/install.md says what was checked here (tests/jobscripts/test_recipes.py loads this file with
# a stub of Spack's API: no Spack installation was run) and how a site adds a release.

import glob

from spack_repo.builtin.build_systems.cmake import CMakePackage, generator
from spack_repo.builtin.build_systems.cuda import CudaPackage

from spack.package import *


def _torch_arch(cuda_arch):
    """Spack's cuda_arch value ("90", "90a", "100") as LibTorch's TORCH_CUDA_ARCH_LIST entry."""
    digits = cuda_arch.rstrip("abcdefghijklmnopqrstuvwxyz")
    return "{0}.{1}{2}".format(digits[:-1], digits[-1], cuda_arch[len(digits):])


class Trainscope(CMakePackage, CudaPackage):
    """MPI-launched C++ (LibTorch) training and fine-tuning profiler for HPC clusters: one parallel
    HDF5 file per job with every timing, memory counter and profile, analysed by trainscope-post
    and driven at scale by trainscope-study (Slurm, PBS)."""

    homepage = "https://trainscope.invalid/"
    git = "file://{0}".format(__file__.rsplit("/packaging/spack/", 1)[0])

    # The clone this recipe sits in (no release published yet); a site pins a release with
    # version("0.1.0", sha256=...) and url = ".../trainscope-0.1.0.tar.gz".
    version("main", branch="main")

    variant("nccl", default=False, description="GPU gradient traffic through NCCL (needs +cuda)")
    conflicts("+nccl", when="~cuda", msg="NCCL carries GPU gradients: build with +cuda")

    generator("ninja")

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("cmake@3.25:", type="build")
    depends_on("ninja", type="build")
    depends_on("pkgconfig", type="build")

    depends_on("mpi@3:")
    depends_on("hdf5@1.10:+mpi")
    depends_on("boost@1.71:+program_options")
    depends_on("spdlog@1.9:")
    depends_on("nlohmann-json@3.10:")
    depends_on("zlib-api")
    depends_on("libjpeg-turbo")
    depends_on("libpng")
    depends_on("pcre2")
    depends_on("googletest", type="test")

    # LibTorch: py-torch's C++ libraries and CMake package. Its CUDA (and NCCL) must be the ones
    # trainscope builds against: one CUDA runtime and one NCCL in the process.
    depends_on("py-torch@2.4:")
    depends_on("py-torch~cuda", when="~cuda")
    depends_on("py-torch+cuda", when="+cuda")
    depends_on("py-torch+nccl", when="+nccl")
    depends_on("nccl", when="+nccl")
    for _arch in CudaPackage.cuda_arch_values:
        depends_on("py-torch+cuda cuda_arch={0}".format(_arch),
                   when="+cuda cuda_arch={0}".format(_arch))

    # trainscope-post and trainscope-study (installed under share/trainscope/postprocess) run with
    # this Python and these modules.
    extends("python")
    depends_on("python@3.11:", type=("build", "run"))
    depends_on("py-numpy", type="run")
    depends_on("py-h5py", type="run")
    depends_on("py-pandas", type="run")
    depends_on("py-matplotlib", type="run")

    def _torch_cmake_dir(self):
        """TorchConfig.cmake's directory inside py-torch's site-packages."""
        pattern = join_path(self.spec["py-torch"].prefix, "lib*", "python*", "site-packages",
                            "torch", "share", "cmake", "Torch")
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise InstallError("TorchConfig.cmake not found: expected {0}".format(pattern))
        return matches[0]

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define_from_variant("TRAINSCOPE_USE_CUDA", "cuda"),
            self.define_from_variant("TRAINSCOPE_USE_NCCL", "nccl"),
            self.define("TRAINSCOPE_BUILD_TESTS", self.run_tests),
            self.define("TRAINSCOPE_PYTHON", spec["python"].command.path),
            self.define("Torch_DIR", self._torch_cmake_dir()),
        ]
        if spec.satisfies("+cuda"):
            archs = [a for a in spec.variants["cuda_arch"].value if a != "none"]
            if archs:
                # LibTorch's CMake wants "8.0;9.0a" for cuda_arch=80,90a.
                args.append(self.define("TORCH_CUDA_ARCH_LIST", ";".join(map(_torch_arch, archs))))
            args.append(self.define("CUDAToolkit_ROOT", spec["cuda"].prefix))
        if spec.satisfies("+nccl"):
            args.append(self.define("NCCL_INCLUDE_DIR", spec["nccl"].prefix.include))
            args.append(self.define("NCCL_LIBRARY", join_path(spec["nccl"].prefix.lib,
                                                              "libnccl.so")))
        return args

    def setup_run_environment(self, env):
        # What the generated modulefile (share/modulefiles/trainscope) sets too.
        env.set("TRAINSCOPE_ROOT", join_path(self.prefix, "share", "trainscope"))
        env.set("TRAINSCOPE_BINARY", join_path(self.prefix.bin, "trainscope"))
