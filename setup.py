"""Builds the optional C++ extensions ``fastpipe._C`` (TORCH_LIBRARY ops) and ``fastpipe._jpeg``
(the libjpeg-turbo decode-and-crop op, linked with -ljpeg).

Both extensions are optional by design, each on its own: when torch is not importable at build time or the
compiler fails, the package still installs and runs on its Python/Numba fallbacks, and
``fastpipe.ops.EXTENSION_AVAILABLE`` / ``fastpipe.ops.jpeg.JPEG_OP_AVAILABLE`` record that. Set ``FASTPIPE_REQUIRE_EXT=1`` to make a
failed build an error (CI does), or ``FASTPIPE_SKIP_EXT=1`` to skip it altogether.
"""

import glob
import os
import sys

from setuptools import setup


def _extension_kwargs() -> dict:
    if os.environ.get("FASTPIPE_SKIP_EXT") == "1":
        return {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        if os.environ.get("FASTPIPE_REQUIRE_EXT") == "1":
            raise
        print("fastpipe: torch is not importable at build time; skipping the C++ extension", file=sys.stderr)
        return {}

    class OptionalBuildExtension(BuildExtension):
        """A compile failure degrades to the fallbacks instead of failing the install.

        Each extension fails on its own (``fastpipe._jpeg`` needs libjpeg's headers, ``fastpipe._C``
        does not), and a failed one is left out of what is copied in place and reported as built,
        which would otherwise fail on its missing file.
        """

        def build_extension(self, ext):  # noqa: D401 - setuptools hook
            try:
                super().build_extension(ext)
            except Exception as exc:  # the compiler's errors vary by toolchain
                if os.environ.get("FASTPIPE_REQUIRE_EXT") == "1":
                    raise
                self._failed = getattr(self, "_failed", set()) | {ext.name}
                print(f"fastpipe: C++ extension {ext.name} not built ({exc}); using fallbacks", file=sys.stderr)

        def _built_only(self, method, *args):
            failed = getattr(self, "_failed", set())
            everything = self.extensions
            self.extensions = [ext for ext in everything if ext.name not in failed]
            try:
                return method(*args)
            finally:
                self.extensions = everything

        def copy_extensions_to_source(self):  # noqa: D401 - setuptools hook (build_ext --inplace)
            return self._built_only(super().copy_extensions_to_source)

        def get_outputs(self):  # noqa: D401 - setuptools hook (wheels, editable installs)
            return self._built_only(super().get_outputs)

        def get_output_mapping(self):  # noqa: D401 - setuptools hook (editable installs)
            return self._built_only(super().get_output_mapping)

    sources = sorted(glob.glob(os.path.join("csrc", "*.cpp")))
    extension = CppExtension(
        "fastpipe._C",
        sources,
        extra_compile_args={"cxx": ["-O3"]},
    )
    # The decode-and-crop op links the system's libjpeg-turbo (libjpeg62-turbo-dev / libjpeg-turbo8-dev);
    # without its headers this one extension fails and fastpipe.ops.jpeg falls back to PIL.
    jpeg_extension = CppExtension(
        "fastpipe._jpeg",
        sorted(glob.glob(os.path.join("csrc", "jpeg", "*.cpp"))),
        libraries=["jpeg"],
        extra_compile_args={"cxx": ["-O3"]},
    )
    return {"ext_modules": [extension, jpeg_extension], "cmdclass": {"build_ext": OptionalBuildExtension.with_options(use_ninja=False)}}


setup(**_extension_kwargs())
