// The communicators of tensor and context parallelism in fp8mla._C (fp8mla/mla_parallel.hpp,
// docs/parallelism.md): the in-process CPU group, NCCL ones (a group of this process, or over a
// caller's ncclComm_t) and their collectives. This file only converts.
//
// Every collective may block in a rendezvous with the other ranks (the CPU group's threads, or
// NCCL's group), so each releases the GIL once its arguments are converted: ranks on Python
// threads would deadlock otherwise.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "fp8mla/mla_parallel.hpp"
#include "params.hpp"

namespace fp8mla_python {

using namespace nb::literals;

namespace {

nb::list wrap_all(std::vector<std::unique_ptr<fp8mla::MlaCommunicator>> comms) {
  nb::list list;
  for (auto& c : comms) list.append(nb::cast(Communicator{std::move(c)}));
  return list;
}

void all_reduce_sum(Communicator& self, nb::handle inout, std::uintptr_t stream) {
  Args args("MlaCommunicator.all_reduce_sum");
  const TensorView inout_view = args.output(inout, "inout");
  nb::gil_scoped_release release;
  self.c->all_reduce_sum(inout_view, to_stream(stream));
}

void reduce_scatter_sum(Communicator& self, nb::handle in, nb::handle out, std::uintptr_t stream) {
  Args args("MlaCommunicator.reduce_scatter_sum");
  const TensorView in_view = args.input(in, "in");
  const TensorView out_view = args.output(out, "out");
  nb::gil_scoped_release release;
  self.c->reduce_scatter_sum(in_view, out_view, to_stream(stream));
}

void all_gather(Communicator& self, nb::handle in, nb::handle out, std::uintptr_t stream) {
  Args args("MlaCommunicator.all_gather");
  // In place, `in` is this rank's rows of `out` (a view of the same buffer).
  const TensorView in_view = args.input(in, "in");
  const TensorView out_view = args.output(out, "out");
  nb::gil_scoped_release release;
  self.c->all_gather(in_view, out_view, to_stream(stream));
}

}  // namespace

void def_parallel_bindings(nb::module_& m) {
  nb::class_<Communicator>(m, "MlaCommunicator",
                           "One rank's communicator of a tensor- or context-parallel group "
                           "(fp8mla/mla_parallel.hpp)")
      .def_prop_ro("rank", [](const Communicator& self) { return self.c->rank(); })
      .def_prop_ro("size", [](const Communicator& self) { return self.c->size(); })
      .def("all_reduce_sum", &all_reduce_sum, "inout"_a, "stream"_a = 0)
      .def("reduce_scatter_sum", &reduce_scatter_sum, "in"_a, "out"_a, "stream"_a = 0)
      .def("all_gather", &all_gather, "in"_a, "out"_a, "stream"_a = 0);
  m.def(
      "make_cpu_communicators",
      [](int size) { return wrap_all(fp8mla::make_cpu_communicators(size)); }, "size"_a);
  m.def(
      "make_nccl_communicators",
      [](const std::vector<int>& devices) {
        std::vector<std::unique_ptr<fp8mla::MlaCommunicator>> comms;
        {
          nb::gil_scoped_release release;  // ncclCommInitAll may take seconds
          comms = fp8mla::make_nccl_communicators(devices);
        }
        return wrap_all(std::move(comms));
      },
      "devices"_a);
  // Borrowed: the caller's ncclComm_t (an address) must outlive the communicator.
  m.def(
      "nccl_communicator",
      [](std::uintptr_t comm) {
        return Communicator{fp8mla::make_nccl_communicator(reinterpret_cast<void*>(comm))};
      },
      "comm_ptr"_a);
}

}  // namespace fp8mla_python
