// faults' native kernel (faults/native_kernel.py builds it): the fault emulator's per-call decision (the gate,
// used by faults/emulator.py) and the module scope's labels on autograd nodes (faults/scope.py).
//
// The gate. A rule that names an op family makes one draw on every call of its ops: the healthy-node profile
// sends about half the ops of a step through the emulator. A Python kernel costs each of those calls about 4 us
// (boxing the arguments into Python, the interceptor chain, calling the op again from Python). This kernel runs
// the op below the dispatch key without Python and decides in C++ whether the emulator must see the call: it
// reads the phase as faults.scope does (an op outside the forward and backward is in the optimizer phase while
// an optimizer step runs, and needs nothing otherwise), calls the emulator's clock, and consumes the rules' draws from a buffer
// the emulator pre-drew from its own generator; a rule with a site pattern draws only inside a module it
// matches, which the gate reads off the scope's module stack. A call it cannot settle (a draw that hits, a
// guarded re-run, the clock moved, the buffer ran out) goes to the emulator's Python kernel untouched, which
// replays the consumed draws first: the faults are the same bits as with the Python kernel alone.

// What the kernel uses of torch, header by header: torch/extension.h (the whole C++ frontend) took 29 of the
// 32 s each kernel took to compile.
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_anomaly_mode.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

namespace py = pybind11;

namespace {

constexpr c10::DispatchKey KEY = c10::DispatchKey::TESTING_ONLY_GenericMode;
constexpr int FORWARD = 0, BACKWARD = 1, OPTIMIZER = 2;  // faults.profile.RulePhase's order

// Shared with the emulator, which arms it for each clock and refills its draws; touched only under the GIL.
struct Gate {
  py::object clock;    // the emulator's clock: () -> tuple
  py::object clock_at;  // the clock the masks hold for (None: Python decides every call)
  py::list forward;    // the scope's stack of hooked modules whose forward runs
  py::object backward;  // () -> the paths of the modules the running backward node belongs to
  py::list optimizer;  // the scope's marker: not empty while an optimizer step runs
  uint64_t live[3] = {0, 0, 0};  // rules that may fire now, forward, backward and in an optimizer step
  uint64_t patterned = 0;  // rules with a site pattern
  std::vector<double> p_call;  // per rule
  std::vector<py::object> matched;  // per rule with a pattern: the set of module paths it matches; else None
  std::vector<double> draws;
  size_t used = 0;

  Gate(py::object clock_, py::list forward_, py::object backward_, py::list optimizer_, std::vector<double> p_call_,
       std::vector<py::object> matched_)
      : clock(std::move(clock_)), clock_at(py::none()), forward(std::move(forward_)), backward(std::move(backward_)),
        optimizer(std::move(optimizer_)), p_call(std::move(p_call_)), matched(std::move(matched_)) {
    TORCH_CHECK(matched.size() == p_call.size(), "sdctrace emulator gate: one path set (or None) per rule");
    for (size_t i = 0; i < matched.size(); ++i)
      if (!matched[i].is_none()) patterned |= uint64_t{1} << i;
  }

  // The rules of `mine` (all with a pattern) that no module on `stack` (a list or tuple of paths) matches: they
  // make no draw here.
  uint64_t unmatched(uint64_t mine, PyObject* stack) const {
    uint64_t out = 0;
    for (uint64_t left = mine; left; left &= left - 1) {
      PyObject* paths = matched[__builtin_ctzll(left)].ptr();
      bool hit = false;
      for (Py_ssize_t k = 0, n = PySequence_Fast_GET_SIZE(stack); k < n && !hit; ++k)
        hit = PySet_Contains(paths, PySequence_Fast_GET_ITEM(stack, k)) == 1;
      if (!hit) out |= left & (~left + 1);
    }
    return out;
  }

  // True when the call needs nothing from the emulator: no phase, no rule live for it, or every draw a miss.
  bool passes(uint64_t rules) {
    int phase;
    if (torch::autograd::get_current_graph_task_id() != -1) {
      phase = BACKWARD;
    } else if (PyList_GET_SIZE(forward.ptr()) > 0 || c10::GradMode::is_enabled()) {
      phase = FORWARD;
    } else if (PyList_GET_SIZE(optimizer.ptr()) > 0) {
      phase = OPTIMIZER;  // the update
    } else {
      return true;  // clipping, bookkeeping: never corrupted
    }
    PyObject* now = PyObject_CallNoArgs(clock.ptr());
    if (now == nullptr) {
      PyErr_Clear();  // Python calls the clock again and raises
      return false;
    }
    int same = PyObject_RichCompareBool(now, clock_at.ptr(), Py_EQ);
    Py_DECREF(now);
    if (same != 1) {
      PyErr_Clear();
      return false;  // a new step or microbatch: the emulator arms for it
    }
    uint64_t mine = rules & live[phase];
    if (mine == 0) return true;
    if (phase == OPTIMIZER) {
      mine &= ~patterned;  // no module runs in an optimizer step: a rule with a site pattern draws nothing
    } else if (mine & patterned) {
      py::object stack = phase == FORWARD
                             ? py::object(forward)
                             : py::reinterpret_steal<py::object>(PyObject_CallNoArgs(backward.ptr()));
      if (!stack || !(PyList_Check(stack.ptr()) || PyTuple_Check(stack.ptr()))) {
        PyErr_Clear();
        return false;  // Python reads the stack again and raises
      }
      mine &= ~unmatched(mine & patterned, stack.ptr());
    }
    size_t k = used;
    for (uint64_t left = mine; left; left &= left - 1) {
      if (k >= draws.size() || draws[k] < p_call[__builtin_ctzll(left)]) return false;
      ++k;
    }
    used = k;
    return true;
  }
};

bool is_kind(const c10::Argument& arg, c10::TypeKind kind) {
  const auto& t = arg.real_type();
  if (t->kind() == kind) return true;
  auto optional = t->cast<c10::OptionalType>();
  return optional && optional->getElementType()->kind() == kind;
}

// An argument as a Python kernel receives it (the boxed stack holds dtypes, layouts and memory formats as ints).
py::object to_python(const c10::Argument& arg, const c10::IValue& value) {
  if (value.isNone()) return py::none();
  if (is_kind(arg, c10::ScalarTypeType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPDtype(static_cast<c10::ScalarType>(value.toInt()))));
  }
  if (is_kind(arg, c10::LayoutType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(value.toInt()))));
  }
  if (is_kind(arg, c10::MemoryFormatType::Kind)) {
    return py::reinterpret_borrow<py::object>(
        torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(value.toInt())));
  }
  return torch::jit::toPyObject(value);
}

struct GateKernel final : c10::OperatorKernel {
  std::shared_ptr<Gate> gate;
  uint64_t rules;  // the rules that name this op
  py::object python;  // the op's Python kernel (tracer.intercept's), for the calls the gate cannot settle

  GateKernel(std::shared_ptr<Gate> gate_, uint64_t rules_, py::object python_)
      : gate(std::move(gate_)), rules(rules_), python(std::move(python_)) {}

  ~GateKernel() override {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire hold;
      python = py::object();
      gate.reset();
    } else {  // the interpreter is gone: leak rather than touch it
      python.release();
      new std::shared_ptr<Gate>(std::move(gate));
    }
  }

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    bool passes;
    {
      py::gil_scoped_acquire hold;
      passes = gate->passes(rules);
    }
    if (passes) {
      // As the Python kernel's call: the key off for everything the op runs.
      c10::impl::ExcludeDispatchKeyGuard off(KEY);
      op.redispatchBoxed(keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, KEY), stack);
      return;
    }
    const auto& schema = op.schema();
    auto arguments = torch::jit::pop(*stack, schema.arguments().size());
    py::gil_scoped_acquire hold;
    py::list args;
    py::dict kwargs;
    for (size_t i = 0; i < arguments.size(); ++i) {
      const auto& arg = schema.arguments()[i];
      py::object value = to_python(arg, arguments[i]);
      if (arg.kwarg_only()) {
        kwargs[py::str(arg.name())] = value;
      } else {
        args.append(value);
      }
    }
    py::object out = python(*py::tuple(args), **kwargs);
    const auto& returns = schema.returns();
    if (returns.size() == 1) {
      stack->push_back(torch::jit::toIValue(out, returns[0].real_type()));
    } else if (returns.size() > 1) {
      auto results = out.cast<py::tuple>();
      for (size_t i = 0; i < returns.size(); ++i) {
        stack->push_back(torch::jit::toIValue(results[i], returns[i].real_type()));
      }
    }
  }
};

// One op's kernel on the key, removed by close() (or when the registration is collected).
struct Registration {
  std::unique_ptr<torch::Library> library;
  void close() { library.reset(); }
};

Registration register_kernel(std::shared_ptr<Gate> gate, const std::string& op, uint64_t rules,
                             py::object python) {
  auto library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", KEY, __FILE__, __LINE__);
  library->impl(op.c_str(), torch::CppFunction::makeFromBoxedFunctor(
                                std::make_unique<GateKernel>(std::move(gate), rules, std::move(python))));
  return Registration{std::move(library)};
}

// faults.scope's `_label`: prepend `path` to the `key` entry of the metadata of every autograd node reachable
// from `outputs` with a sequence number in [start, end), those a module's forward created. A tiny step's modules
// label a few thousand nodes; in Python that was about 3 % of the step.
void label(const std::vector<at::Tensor>& outputs, const py::str& path, int64_t start, int64_t end,
           const py::str& key) {
  std::vector<torch::autograd::Node*> todo;
  for (const auto& t : outputs)
    if (t.defined() && t.grad_fn()) todo.push_back(t.grad_fn().get());
  std::unordered_set<torch::autograd::Node*> seen;
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    const uint64_t nr = node->sequence_nr();  // UINT64_MAX for nodes outside any forward (AccumulateGrad)
    if (nr < static_cast<uint64_t>(start) || nr >= static_cast<uint64_t>(end) || !seen.insert(node).second) continue;
    PyObject* dict = static_cast<torch::autograd::PyAnomalyMetadata*>(node->metadata())->dict();
    PyObject* old = PyDict_GetItemWithError(dict, key.ptr());
    if (old == nullptr && PyErr_Occurred()) throw py::error_already_set();
    const Py_ssize_t n = old != nullptr && PyTuple_Check(old) ? PyTuple_GET_SIZE(old) : 0;
    py::tuple now(n + 1);
    now[0] = path;
    for (Py_ssize_t k = 0; k < n; ++k) now[k + 1] = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(old, k));
    if (PyDict_SetItem(dict, key.ptr(), now.ptr()) != 0) throw py::error_already_set();
    for (const auto& edge : node->next_edges())
      if (edge.function) todo.push_back(edge.function.get());
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("label", &label, py::arg("outputs"), py::arg("path"), py::arg("start"), py::arg("end"), py::arg("key"),
        "Label the autograd nodes a module's forward created with its path (faults.scope).");
  py::class_<Gate, std::shared_ptr<Gate>>(m, "Gate")
      .def(py::init<py::object, py::list, py::object, py::list, std::vector<double>, std::vector<py::object>>(),
           py::arg("clock"), py::arg("forward"), py::arg("backward"), py::arg("optimizer"), py::arg("p_call"),
           py::arg("matched"))
      .def(
          "arm",
          [](Gate& g, py::object clock_at, uint64_t forward, uint64_t backward, uint64_t optimizer) {
            g.clock_at = std::move(clock_at);
            g.live[FORWARD] = forward;
            g.live[BACKWARD] = backward;
            g.live[OPTIMIZER] = optimizer;
          },
          "The clock the masks hold for (None: Python decides every call) and the rules live in each phase.")
      .def(
          "fill",
          [](Gate& g, std::vector<double> draws) {
            size_t used = g.used;
            g.draws = std::move(draws);
            g.used = 0;
            return used;
          },
          "Hand over the next draws of the emulator's generator; returns how many of the last ones were used.");
  py::class_<Registration>(m, "Registration").def("close", &Registration::close);
  m.def("register", &register_kernel, py::arg("gate"), py::arg("op"), py::arg("rules"), py::arg("python"),
        "Register the gate's kernel for one aten overload on the interceptors' dispatch key.");
}
