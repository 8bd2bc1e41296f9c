// strata_torch: `import strata_torch` registers the torch.distributed backend "strata".

#include <chrono>
#include <string>

#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include <strata/version.hpp>

#include "process_group.hpp"

namespace py = pybind11;
using strata::torchbind::ProcessGroupStrata;

namespace {

c10::intrusive_ptr<ProcessGroupStrata> create(const c10::intrusive_ptr<c10d::Store>& store,
                                              int rank, int size,
                                              std::chrono::milliseconds timeout) {
  return c10::make_intrusive<ProcessGroupStrata>(store, rank, size, timeout);
}

}  // namespace

PYBIND11_MODULE(strata_torch, m) {
  m.doc() =
      "strata as a torch.distributed backend: import strata_torch, then "
      "torch.distributed.init_process_group('strata', ...)";
  // The base classes (ProcessGroup, Store) are registered by torch.distributed.
  py::module_ dist = py::module_::import("torch.distributed");

  py::class_<ProcessGroupStrata, c10d::ProcessGroup, c10::intrusive_ptr<ProcessGroupStrata>>(
      m, "ProcessGroupStrata",
      "A torch.distributed process group over a strata Communicator (one worker thread runs its "
      "calls in the order issued).")
      .def(py::init(&create), py::arg("store"), py::arg("rank"), py::arg("size"),
           py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def("last_algorithm", &ProcessGroupStrata::lastAlgorithm,
           "'backend/name' of the strata algorithm that ran the last collective")
      .def("describe", &ProcessGroupStrata::describe);

  // The creator torch calls as creator(prefix_store, rank, world_size, timeout). The rendezvous
  // blocks until every rank arrives, so the GIL is released meanwhile.
  m.def("_create_process_group", &create, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"), py::call_guard<py::gil_scoped_release>());
  m.attr("__version__") = STRATA_VERSION_STRING;

  py::object backend = dist.attr("Backend");
  if (!py::hasattr(backend, "STRATA")) {
    backend.attr("register_backend")("strata", m.attr("_create_process_group"));
  }
}
