// The nvlink transport's pre-flight lines (strata-info --check) from recorded CUDA facts, without
// a GPU: no driver, a driver without devices, an 8-GPU NVSwitch node, a PCIe node whose GPUs
// are not peers, a prohibited GPU and one without GPUDirect RDMA.

#define BOOST_TEST_MODULE nvlink_check
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <string>

#include "backends/transport/nvlink/nvlink_check.hpp"

using namespace strata::nvlink;
using strata::backend::CheckLine;
using State = CheckLine::State;

namespace {

const CheckLine& line(const std::vector<CheckLine>& lines, const std::string& what) {
  auto it =
      std::find_if(lines.begin(), lines.end(), [&](const CheckLine& l) { return l.what == what; });
  BOOST_REQUIRE_MESSAGE(it != lines.end(), "no line " << what);
  return *it;
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// n GPUs that are all peers, with GPUDirect RDMA and multicast as given.
NodeFacts node(int n, int gdr, int multicast) {
  NodeFacts f;
  f.driver = true;
  for (int i = 0; i < n; ++i) {
    f.gpus.push_back(
        {"NVIDIA H100 80GB HBM3", "0000:" + std::to_string(0x18 + i) + ":00.0", 0, gdr, multicast});
  }
  f.peer.assign(size_t(n), std::vector<int>(size_t(n), 1));
  return f;
}

}  // namespace

BOOST_AUTO_TEST_CASE(no_driver_and_no_device) {
  NodeFacts none;
  auto lines = checkLines(none);
  BOOST_REQUIRE(lines.size() == 1u);
  BOOST_TEST((lines[0].state == State::Ok));
  BOOST_TEST(has(lines[0].found, "no CUDA driver"));

  NodeFacts hidden;
  hidden.driver = true;
  hidden.visible = "";
  hidden.error = "cudaErrorNoDevice: no CUDA-capable device is detected";
  lines = checkLines(hidden);
  BOOST_REQUIRE(lines.size() == 1u);
  BOOST_TEST((lines[0].state == State::Warn));
  BOOST_TEST(has(lines[0].found, "cudaErrorNoDevice"));
  BOOST_TEST(has(lines[0].fallback, "host memory works"));

  NodeFacts empty;
  empty.driver = true;
  empty.visible = "7";
  lines = checkLines(empty);
  BOOST_TEST(has(lines.at(0).found, "CUDA_VISIBLE_DEVICES=7"), lines.at(0).found);
}

BOOST_AUTO_TEST_CASE(an_nvswitch_node_is_all_ok) {
  const auto lines = checkLines(node(8, 1, 1));
  BOOST_TEST(lines.size() == 8u + 3u);  // 8 GPUs, peer access, GPUDirect RDMA, multicast
  BOOST_TEST(std::none_of(lines.begin(), lines.end(),
                          [](const CheckLine& l) { return l.state != State::Ok; }));
  BOOST_TEST(has(line(lines, "GPU 7").found, "compute mode default"));
  BOOST_TEST(has(line(lines, "GPU peer access").found, "every pair of the 8 GPUs"));
  BOOST_TEST(has(line(lines, "NVLink multicast (NVLS)").found, "supported on GPU 0, 1, 2"));
  BOOST_TEST(has(line(lines, "NVLink multicast (NVLS)").fallback, "no NVLS algorithm"));
}

BOOST_AUTO_TEST_CASE(what_is_missing_is_named_with_the_fallback) {
  // Four PCIe GPUs on two sockets: 0-1 and 2-3 are peers, across the sockets they are not; GPU
  // 3 is prohibited, GPU 2 has no GPUDirect RDMA, GPU 1's peer query failed; no multicast.
  NodeFacts f = node(4, 1, 0);
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 4; ++b) f.peer[size_t(a)][size_t(b)] = (a / 2 == b / 2) ? 1 : 0;
  }
  f.peer[1][0] = -1;
  f.gpus[3].computeMode = 2;
  f.gpus[0].computeMode = 3;
  f.gpus[2].gpuDirectRdma = 0;
  const auto lines = checkLines(f);
  const CheckLine& prohibited = line(lines, "GPU 3");
  BOOST_TEST((prohibited.state == State::Warn));
  BOOST_TEST(has(prohibited.found, "prohibited"));
  BOOST_TEST(has(line(lines, "GPU 0").fallback, "one process per GPU"));
  // The missing pairs, one warning; the failed query, one unknown line.
  auto peer = std::find_if(lines.begin(), lines.end(), [](const CheckLine& l) {
    return l.what == "GPU peer access" && l.state == State::Warn;
  });
  BOOST_REQUIRE(peer != lines.end());
  BOOST_TEST(
      peer->found == "none from GPU 0 -> 2, 0 -> 3, 1 -> 2, 1 -> 3, 2 -> 0, 2 -> 1, 3 -> 0, 3 -> 1",
      peer->found);
  BOOST_TEST(has(peer->fallback, "no host-staged path"));
  BOOST_TEST(std::any_of(lines.begin(), lines.end(), [](const CheckLine& l) {
    return l.what == "GPU peer access" && l.state == State::Unknown && has(l.found, "1 -> 0");
  }));
  const CheckLine& gdr = line(lines, "GPUDirect RDMA");
  BOOST_TEST((gdr.state == State::Warn));
  BOOST_TEST(gdr.found == "not supported on GPU 2");
  BOOST_TEST(has(gdr.fallback, "bounce buffers"));
  BOOST_TEST(has(line(lines, "NVLink multicast (NVLS)").found, "not supported"));
}
