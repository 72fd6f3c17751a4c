"""Builds the _poseidon extension with the project's CMake (the repository root is two levels
up) and puts it inside the `poseidon` package. Used by pip through pyproject.toml:
    pip install ./bindings/python
POSEIDON_CMAKE_ARGS (environment) adds configure flags, e.g. "-DPOSEIDON_WITH_CUDA=OFF"."""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.path.join(os.path.abspath(self.build_temp), "cmake")
        os.makedirs(build_dir, exist_ok=True)
        args = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                "-DPOSEIDON_BUILD_PYTHON=ON", "-DPOSEIDON_BUILD_TESTS=OFF",
                "-DPOSEIDON_BUILD_BENCH=OFF", "-DPOSEIDON_BUILD_EXAMPLES=OFF",
                "-DPython3_EXECUTABLE=" + sys.executable]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("POSEIDON_CMAKE_ARGS", ""))
        subprocess.check_call(args)
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "_poseidon", "-j",
                               str(os.cpu_count() or 2)])
        built = [f for f in os.listdir(os.path.join(build_dir, "bindings", "python"))
                 if f.startswith("_poseidon") and f.endswith(".so")]
        if not built:
            raise RuntimeError("the CMake build produced no _poseidon module")
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(build_dir, "bindings", "python", built[0]), target)


setup(ext_modules=[CMakeExtension("poseidon._poseidon")], cmdclass={"build_ext": CMakeBuild})
