// The helpers the files of the _poseidon module share (module_common.h): exception classes
// by result code, array and tensor views, and name and timeout parsers.
#include "bindings/python/module_common.h"

#include <cmath>
#include <cstdint>

#include "bindings/c/binding_support.h"

namespace poseidon::python {

PyObject* g_errors[psdNumResults] = {nullptr};

[[noreturn]] void Raise(psdResult_t r, const std::string& message) {
  PyObject* type = (r > 0 && r < psdNumResults && g_errors[r]) ? g_errors[r] : g_errors[0];
  // Decoded leniently: a message may carry another rank's text cut at a byte limit, in the
  // middle of a UTF-8 character (PyErr_SetString would raise UnicodeDecodeError instead).
  PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()),
                                        "replace");
  if (text == nullptr) throw py::error_already_set();
  PyErr_SetObject(type, text);
  Py_DECREF(text);
  throw py::error_already_set();
}

void Check(psdResult_t r, psdComm_t comm) {
  if (r == psdSuccess) return;
  Raise(r, std::string(psdGetLastError(comm)) + " [" + psdGetErrorString(r) + "]");
}

[[noreturn]] void BadArg(const std::string& message) { Raise(psdInvalidArgument, message); }

const char* DTypeName(psdDataType_t t) {
  switch (t) {
    case psdFloat32:
      return "float32";
    case psdFloat64:
      return "float64";
    case psdFloat16:
      return "float16";
    case psdBFloat16:
      return "bfloat16";
    case psdInt32:
      return "int32";
    case psdInt64:
      return "int64";
    default:
      return "unknown";
  }
}

// "64 x 32"; "(scalar)" for no dimensions.
std::string ShapeText(const std::vector<size_t>& shape) {
  if (shape.empty()) return "(scalar)";
  std::string text;
  for (size_t d : shape) text += (text.empty() ? "" : " x ") + std::to_string(d);
  return text;
}

namespace {

psdDataType_t DTypeFromFormat(const std::string& fmt, size_t itemsize, const char* what) {
  // Strip byte-order / alignment prefixes; only native order is accepted.
  std::string f = fmt;
  if (!f.empty() && (f[0] == '<' || f[0] == '=' || f[0] == '@')) f = f.substr(1);
  if (f == "f" && itemsize == 4) return psdFloat32;
  if (f == "d" && itemsize == 8) return psdFloat64;
  if (f == "e" && itemsize == 2) return psdFloat16;
  if ((f == "i" || f == "l" || f == "q") && itemsize == 4) return psdInt32;
  if ((f == "i" || f == "l" || f == "q") && itemsize == 8) return psdInt64;
  BadArg(std::string(what) + ": element format '" + fmt + "' (" + std::to_string(itemsize) +
         " bytes) is not supported; expected float32, float64, float16, int32 or int64");
}

psdDataType_t DTypeFromTorch(const std::string& name, const char* what) {
  if (name == "torch.float32") return psdFloat32;
  if (name == "torch.float64") return psdFloat64;
  if (name == "torch.float16") return psdFloat16;
  if (name == "torch.bfloat16") return psdBFloat16;
  if (name == "torch.int32") return psdInt32;
  if (name == "torch.int64") return psdInt64;
  BadArg(std::string(what) + ": tensor dtype " + name +
         " is not supported; expected torch.float32, float64, float16, bfloat16, int32 or int64");
}

bool IsTorchTensor(py::handle obj) {
  return py::hasattr(obj, "data_ptr") && py::hasattr(obj, "is_contiguous") &&
         py::hasattr(obj, "numel");
}

}  // namespace

View ToView(py::handle obj, const char* what, bool writable) {
  View v;
  if (obj.is_none()) BadArg(std::string(what) + " is None; expected an array or tensor");
  if (IsTorchTensor(obj)) {
    if (!obj.attr("is_contiguous")().cast<bool>()) {
      BadArg(std::string(what) +
             ": tensor is not contiguous; expected a contiguous tensor "
             "(call .contiguous() on a copy and copy the result back)");
    }
    if (py::hasattr(obj, "is_sparse") && obj.attr("is_sparse").cast<bool>()) {
      BadArg(std::string(what) + ": sparse tensors are not supported; expected a dense tensor");
    }
    v.dtype = DTypeFromTorch(py::str(obj.attr("dtype")).cast<std::string>(), what);
    std::string device = py::str(obj.attr("device").attr("type")).cast<std::string>();
    v.device = device;
    if (device == "cpu") {
      v.memory = psdMemHost;
    } else if (device == "cuda") {
      v.memory = psdMemDevice;
    } else {
      BadArg(std::string(what) + ": tensor on device '" + device + "'; expected cpu or cuda");
    }
    v.data = reinterpret_cast<void*>(obj.attr("data_ptr")().cast<uintptr_t>());
    v.count = obj.attr("numel")().cast<size_t>();
    for (auto d : obj.attr("shape")) v.shape.push_back(d.cast<size_t>());
    return v;
  }
  if (!PyObject_CheckBuffer(obj.ptr())) {
    BadArg(std::string(what) + ": " + py::str(py::type::of(obj)).cast<std::string>() +
           " is neither a buffer (numpy array) nor a torch tensor");
  }
  Py_buffer buf;
  int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj.ptr(), &buf, flags) != 0) {
    PyErr_Clear();
    // Find out which requirement failed, for a precise message.
    if (writable && PyObject_GetBuffer(obj.ptr(), &buf, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
      PyBuffer_Release(&buf);
      BadArg(std::string(what) + ": array is read-only; expected a writable array");
    }
    PyErr_Clear();
    BadArg(std::string(what) +
           ": array is not C-contiguous; expected a contiguous array "
           "(numpy.ascontiguousarray)");
  }
  // The memory stays valid while `obj` lives: callers keep a reference for async use.
  v.data = buf.buf;
  v.count = buf.itemsize > 0 ? static_cast<size_t>(buf.len / buf.itemsize) : 0;
  std::string fmt = buf.format ? buf.format : "B";
  size_t itemsize = static_cast<size_t>(buf.itemsize);
  for (int i = 0; i < buf.ndim; ++i) v.shape.push_back(static_cast<size_t>(buf.shape[i]));
  PyBuffer_Release(&buf);
  v.dtype = DTypeFromFormat(fmt, itemsize, what);
  return v;
}

void RequireSame(const View& a, const View& b, const char* call) {
  if (a.dtype != b.dtype || a.memory != b.memory) {
    BadArg(std::string(call) + ": send and recv differ in dtype or device; expected the same");
  }
}

psdStrategy_t ParseStrategy(const std::string& s) {
  if (s == "auto") return psdStrategyAuto;
  if (s == "allreduce") return psdStrategyAllReduce;
  if (s == "ps") return psdStrategyPs;
  if (s == "sfb") return psdStrategySfb;
  if (s == "topk") return psdStrategyTopk;
  BadArg("strategy '" + s + "' is unknown; expected auto, allreduce, ps, sfb or topk");
}

const char* StrategyName(psdStrategy_t s) {
  switch (s) {
    case psdStrategyAllReduce:
      return "allreduce";
    case psdStrategyPs:
      return "ps";
    case psdStrategySfb:
      return "sfb";
    case psdStrategyTopk:
      return "topk";
    default:
      return "auto";
  }
}

psdLayerKind_t ParseKind(const std::string& s) {
  if (s == "dense") return psdLayerDense;
  if (s == "fc" || s == "fully_connected") return psdLayerFullyConnected;
  if (s == "sparse") return psdLayerSparse;
  BadArg("layer kind '" + s + "' is unknown; expected dense, fc or sparse");
}

// Handle.wait's timeout as psdWait's milliseconds: None, a negative number, an infinity or
// anything beyond 10^10 ms (psdWait's own limit; a Python int may not even fit a long long)
// waits for ever (-1); a fraction of a millisecond rounds up (0 alone only checks). NaN and
// non-numbers are refused.
long long TimeoutMs(py::handle t) {
  constexpr long long kForever = -1;
  if (t.is_none()) return kForever;
  if (PyIndex_Check(t.ptr())) {  // int, bool, numpy integers
    py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(t.ptr()));
    if (!index) throw py::error_already_set();
    int overflow = 0;
    long long ms = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (overflow != 0) return kForever;
    if (ms == -1 && PyErr_Occurred()) throw py::error_already_set();
    return ms < 0 || ms > poseidon::capi::kWaitForeverMs ? kForever : ms;
  }
  double ms = PyFloat_AsDouble(t.ptr());  // float, numpy floats, anything with __float__
  if (ms == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    BadArg("Handle.wait: timeout_ms is a " + py::str(py::type::of(t)).cast<std::string>() +
           "; expected a number of milliseconds, or None to wait for ever");
  }
  if (std::isnan(ms)) {
    BadArg(
        "Handle.wait: timeout_ms is nan; expected a number of milliseconds (negative, inf or "
        "None: for ever)");
  }
  if (ms < 0 || ms > static_cast<double>(poseidon::capi::kWaitForeverMs)) return kForever;
  return static_cast<long long>(std::ceil(ms));
}

}  // namespace poseidon::python
