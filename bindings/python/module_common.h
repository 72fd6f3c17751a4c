// What the files of the _poseidon module share: result codes as Python exceptions, borrowed
// views of arrays and tensors, and the parsers of strategy / layer kind names and timeouts.
#ifndef POSEIDON_BINDINGS_PYTHON_MODULE_COMMON_H_
#define POSEIDON_BINDINGS_PYTHON_MODULE_COMMON_H_

#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "bindings/c/poseidon.h"

namespace py = pybind11;

namespace poseidon::python {

// Exception classes, one per result code (index = code); [0] is the base class Error.
extern PyObject* g_errors[psdNumResults];

// Raises the exception class of r with the message.
[[noreturn]] void Raise(psdResult_t r, const std::string& message);
// Raises r's exception with psdGetLastError(comm)'s message unless r is psdSuccess.
void Check(psdResult_t r, psdComm_t comm = nullptr);
// Raises InvalidArgumentError.
[[noreturn]] void BadArg(const std::string& message);


// A borrowed view of an array's memory.
struct View {
  void* data = nullptr;
  size_t count = 0;
  psdDataType_t dtype = psdFloat32;
  psdMemory_t memory = psdMemHost;
  std::string device = "cpu";  // a tensor's device type
  std::vector<size_t> shape;
};

const char* DTypeName(psdDataType_t t);
// "64 x 32"; "(scalar)" for no dimensions.
std::string ShapeText(const std::vector<size_t>& shape);
// The array or tensor obj as a view, after the checks (see module.cc); what names it in errors.
View ToView(py::handle obj, const char* what, bool writable);
// Raises unless a and b have the same dtype and memory.
void RequireSame(const View& a, const View& b, const char* call);
psdStrategy_t ParseStrategy(const std::string& s);
const char* StrategyName(psdStrategy_t s);
psdLayerKind_t ParseKind(const std::string& s);
// Handle.wait's timeout as psdWait's milliseconds (-1: for ever).
long long TimeoutMs(py::handle t);

// Binds Handle and Comm (comm.cc).
void BindComm(py::module_& m);

}  // namespace poseidon::python

#endif  // POSEIDON_BINDINGS_PYTHON_MODULE_COMMON_H_
