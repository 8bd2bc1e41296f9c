// A program outside strata, compiled against the build tree with nothing but
// `pkg-config --cflags --libs strata-uninstalled` (tests/tools/test_pkgconfig_consumer.sh):
// one allReduce on a Communicator, checked, and the bootstrap backend it ran on.

#include <cstdio>
#include <exception>
#include <string>

#include <strata/bootstrap.hpp>
#include <strata/communicator.hpp>
#include <strata/version.hpp>

int main() {
  try {
    auto comm = strata::Communicator::create();
    int rank = comm->rank(), size = comm->size();
    int value = rank + 1, sum = 0;
    comm->allReduce(&value, &sum, 1, strata::DataType::Int32, strata::ReduceOp::Sum);
    std::string backend(comm->bootstrap().backend());
    if (sum != size * (size + 1) / 2) {
      std::printf("consumer: rank %d of %d: allReduce gave %d, expected %d\n", rank, size, sum,
                  size * (size + 1) / 2);
      return 1;
    }
    std::printf("consumer: strata %s, backend %s, rank %d of %d: allReduce ok\n",
                strata::versionString(), backend.c_str(), rank, size);
    return 0;
  } catch (const std::exception& e) {
    std::printf("consumer: %s\n", e.what());
    return 1;
  }
}
