// _poseidon: the Python extension over the C API (bindings/c/poseidon.h), linked statically.
//
// Arrays: anything with the buffer protocol (numpy) or a PyTorch tensor (duck-typed through
// data_ptr() / numel() / dtype / is_contiguous() / device, so no torch headers are needed). No
// copies: the C API gets the array's own memory, after checks that it is contiguous, of a known
// dtype, writable where written, and of the expected element count; each failed check raises
// InvalidArgumentError naming the argument and what was expected.
// Comm.submit: the engine reads and writes the arrays after submit returns, so the Handle holds
// the Python objects, and a handle freed before its exchange completes hands them to its Comm,
// which drops them, with the GIL held, once the exchange is done. A refused submit argument
// fails the engine on every rank (FailSubmit), so no peer waits for the missing submission.
// Errors: a psdResult_t other than psdSuccess raises the matching poseidon exception with
// psdGetLastError's message. Blocking calls release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "bindings/c/poseidon.h"
#include "bindings/python/module_common.h"

using poseidon::python::Check;
using poseidon::python::g_errors;

PYBIND11_MODULE(_poseidon, m) {
  m.doc() = "Poseidon collective communication runtime (C API bindings)";

  // Exceptions: Error(RuntimeError) and one subclass per result code.
  PyObject* base = PyErr_NewException("poseidon.Error", PyExc_RuntimeError, nullptr);
  g_errors[0] = base;
  m.attr("Error") = py::handle(base);
  struct Sub {
    psdResult_t code;
    const char* name;
    PyObject* extra;  // a built-in class it also derives from
  } subs[] = {
      {psdInvalidArgument, "InvalidArgumentError", PyExc_ValueError},
      {psdMismatch, "MismatchError", nullptr},
      {psdBackendError, "BackendError", nullptr},
      {psdTimeout, "TimeoutError", PyExc_TimeoutError},
      {psdAborted, "AbortedError", nullptr},
      {psdUnavailable, "UnavailableError", nullptr},
      {psdInternalError, "InternalError", nullptr},
      {psdUnimplemented, "UnimplementedError", PyExc_NotImplementedError},
      {psdPeerLost, "PeerLostError", nullptr},
  };
  for (const Sub& s : subs) {
    PyObject* bases = s.extra ? PyTuple_Pack(2, base, s.extra) : PyTuple_Pack(1, base);
    std::string qual = std::string("poseidon.") + s.name;
    PyObject* cls = PyErr_NewException(qual.c_str(), bases, nullptr);
    Py_DECREF(bases);
    g_errors[s.code] = cls;
    // The psdResult_t it stands for, e.g. PeerLostError.code == 9.
    if (PyObject_SetAttrString(cls, "code", py::int_(static_cast<int>(s.code)).ptr()) != 0) {
      throw py::error_already_set();
    }
    m.attr(s.name) = py::handle(cls);
  }
  // The class Raise uses for a result code (tests check the table).
  m.def("_error_class", [](int code) {
    PyObject* type =
        (code > 0 && code < psdNumResults && g_errors[code]) ? g_errors[code] : g_errors[0];
    return py::reinterpret_borrow<py::object>(type);
  });

  m.def(
      "init", [] { Check(psdInit()); }, "Initializes MPI (MPI_THREAD_MULTIPLE) unless it is.");
  m.def(
      "finalize",
      [] {
        py::gil_scoped_release release;
        Check(psdFinalize());
      },
      "Destroys every communicator; finalizes MPI if init() started it.");
  // For poseidon._finalize_at_exit: this process's rank in MPI_COMM_WORLD and its size (0 and 1
  // when MPI is not running), and MPI_Abort on the world (does not return while MPI runs).
  auto mpi_running = [] {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    return initialized && !finalized;
  };
  m.def("_world_rank", [mpi_running] {
    int rank = 0;
    if (mpi_running()) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
  });
  m.def("_world_size", [mpi_running] {
    int size = 1;
    if (mpi_running()) MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
  });
  m.def("_abort", [mpi_running](int code) {
    if (mpi_running()) MPI_Abort(MPI_COMM_WORLD, code);
  });
  m.def("version", [] {
    int v = 0;
    Check(psdGetVersion(&v));
    return v;
  });
  m.attr("VERSION_CODE") = PSD_VERSION_CODE;
  m.def("set_setting", [](const std::string& name, const std::string& value) {
    Check(psdSetSetting(name.c_str(), value.c_str()));
  });
  m.def("get_setting", [](const std::string& name) {
    size_t need = 0;
    Check(psdGetSetting(name.c_str(), nullptr, &need));
    std::string text(need, '\0');
    Check(psdGetSetting(name.c_str(), text.data(), &need));
    text.resize(need - 1);
    return text;
  });

  poseidon::python::BindComm(m);
}
