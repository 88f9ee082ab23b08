// fastpipe's C++ CPU ops. Schemas live in TORCH_LIBRARY, kernels in TORCH_LIBRARY_IMPL;
// the Python side (fastpipe/ops) holds wrappers and fake kernels.
#include <Python.h>
#include <torch/library.h>
#include <ATen/ATen.h>

extern "C" {
// Importing fastpipe._C from Python is what loads the library and runs the registrations below.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

namespace fastpipe {

// A trivial first op that proves the library loads; the real kernels come with the transforms.
at::Tensor ping(const at::Tensor& x) { return x.clone(); }

TORCH_LIBRARY(fastpipe, m) { m.def("ping(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(fastpipe, CPU, m) { m.impl("ping", &ping); }

}  // namespace fastpipe
