// strata_torch: `import strata_torch` registers the torch.distributed backend "strata".

#include <chrono>
#include <string>
#include <vector>

#include <pybind11/stl.h>

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
      .def("describe", &ProcessGroupStrata::describe)
      .def("shrink", &ProcessGroupStrata::shrink, py::arg("exclude") = std::vector<int>{},
           py::call_guard<py::gil_scoped_release>(),
           "a new group of the ranks not excluded (exclude, and every rank found lost), in "
           "their order; revokes this one first (docs/fault-tolerance.md)")
      .def("grow_invitation", &ProcessGroupStrata::growInvitation, py::arg("new_size"),
           "rank 0: the invitation (a line of text) a newcomer passes to join_group")
      .def("grow", &ProcessGroupStrata::grow, py::arg("new_size"),
           py::call_guard<py::gil_scoped_release>(),
           "a group of new_size ranks with the newcomers; this group's ranks keep their numbers")
      .def("revoke", &ProcessGroupStrata::revoke, py::arg("reason"),
           py::call_guard<py::gil_scoped_release>(),
           "every rank's calls on this group fail, naming this rank and the reason")
      .def("lost_ranks", &ProcessGroupStrata::lostRanks,
           "the ranks this rank found lost or stuck, ascending");

  // The creator torch calls as creator(prefix_store, rank, world_size, timeout). The rendezvous
  // blocks until every rank arrives, so the GIL is released meanwhile.
  m.def("_create_process_group", &create, py::arg("store"), py::arg("rank"), py::arg("size"),
        py::arg("timeout"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "shrink_group",
      [](const c10::intrusive_ptr<ProcessGroupStrata>& group, const std::vector<int>& exclude) {
        return group->shrink(exclude);
      },
      py::arg("group"), py::arg("exclude") = std::vector<int>{},
      py::call_guard<py::gil_scoped_release>(),
      "The survivors' group after a loss: strata_torch.shrink_group(dist.group.WORLD) returns a "
      "ProcessGroupStrata of the ranks not excluded (and not found lost), in their order; "
      "rebuild DDP on it (docs/fault-tolerance.md, \"PyTorch\")");
  m.def(
      "grow_group",
      [](const c10::intrusive_ptr<ProcessGroupStrata>& group, int newSize) {
        return group->grow(newSize);
      },
      py::arg("group"), py::arg("new_size"), py::call_guard<py::gil_scoped_release>(),
      "The grown group (after group.grow_invitation(new_size) on rank 0, and join_group on "
      "each newcomer): this group's ranks keep their numbers, newcomers take the rest");
  m.def("join_group", &ProcessGroupStrata::join, py::arg("invitation"), py::arg("index"),
        py::arg("timeout") = std::chrono::milliseconds(1800000),
        py::call_guard<py::gil_scoped_release>(),
        "A newcomer's group: joins the grow whose invitation rank 0 gave, as newcomer index");
  m.attr("__version__") = STRATA_VERSION_STRING;

  py::object backend = dist.attr("Backend");
  if (!py::hasattr(backend, "STRATA")) {
    backend.attr("register_backend")("strata", m.attr("_create_process_group"));
  }
}
