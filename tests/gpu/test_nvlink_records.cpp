// The nvlink transport's records (memory descriptor, endpoint) without a GPU: layout, round
// trips, every rejection, and a deterministic mutation loop that must only ever produce
// ProtocolError.

#define BOOST_TEST_MODULE nvlink_records
#include <boost/test/unit_test.hpp>

#include <functional>
#include <random>

#include <strata/error.hpp>

#include "backends/transport/nvlink/nvlink_records.hpp"
#include "base/wire.hpp"

using namespace strata;
using namespace strata::nvlink;

namespace {

MemoryDescriptor sample() {
  MemoryDescriptor d;
  d.handles.push_back({static_cast<uint8_t>(HandleType::Fabric), std::vector<uint8_t>(64, 0xfa)});
  d.handles.push_back(
      {static_cast<uint8_t>(HandleType::RuntimeIpc), std::vector<uint8_t>(64, 0x1c)});
  d.allocationBase = 0x7f0000000000;
  d.allocationSize = 2 << 20;
  d.offset = 4096;
  d.ownerAddress = d.allocationBase + d.offset;
  d.length = 65536;
  for (size_t i = 0; i < d.deviceUuid.size(); ++i) d.deviceUuid[i] = static_cast<uint8_t>(i * 17);
  d.pciBusId = "0000:3b:00.0";
  d.hostId = 0x1234567890abcdefull;
  d.pid = 4242;
  return d;
}

ErrorCode codeOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    BOOST_TEST_MESSAGE(e.what());
    return e.code();
  }
  return ErrorCode::Internal;  // "no error"
}

bool rejects(const MemoryDescriptor& d) {
  auto rec = encodeDescriptor(d);
  return codeOf([&] { decodeDescriptor(rec); }) == ErrorCode::ProtocolError;
}

}  // namespace

BOOST_AUTO_TEST_CASE(descriptor_round_trip) {
  auto d = sample();
  auto rec = encodeDescriptor(d);
  BOOST_TEST(rec.size() < 400u);
  auto h = wire::decodeRecord(rec, kDescriptorKind, kDescriptorVersion, kMaxDescriptorBody, "t");
  BOOST_TEST(h.header.version == 1);
  auto e = decodeDescriptor(rec);
  BOOST_TEST(e.handles.size() == 2u);
  BOOST_TEST(e.handles[0].type == static_cast<uint8_t>(HandleType::Fabric));
  BOOST_TEST((e.handles[1].bytes == d.handles[1].bytes));
  BOOST_TEST(e.find(HandleType::RuntimeIpc) == &e.handles[1]);
  BOOST_TEST(e.allocationBase == d.allocationBase);
  BOOST_TEST(e.allocationSize == d.allocationSize);
  BOOST_TEST(e.offset == d.offset);
  BOOST_TEST(e.ownerAddress == d.ownerAddress);
  BOOST_TEST(e.length == d.length);
  BOOST_TEST((e.deviceUuid == d.deviceUuid));
  BOOST_TEST(e.pciBusId == d.pciBusId);
  BOOST_TEST(e.hostId == d.hostId);
  BOOST_TEST(e.pid == d.pid);
  BOOST_TEST(uuidString(e.deviceUuid) == "GPU-00112233-4455-6677-8899-aabbccddeeff");
}

BOOST_AUTO_TEST_CASE(unknown_handle_types_are_skipped) {
  auto d = sample();
  d.handles.insert(d.handles.begin(), MemoryHandle{99, std::vector<uint8_t>(12, 1)});
  auto e = decodeDescriptor(encodeDescriptor(d));
  BOOST_TEST(e.handles.size() == 3u);
  BOOST_TEST(e.find(HandleType::RuntimeIpc) != nullptr);
}

BOOST_AUTO_TEST_CASE(descriptor_rejections) {
  auto d = sample();
  d.handles.clear();
  BOOST_TEST(rejects(d));
  d = sample();
  d.handles.resize(5, d.handles[0]);
  BOOST_TEST(rejects(d));
  d = sample();
  d.handles[1].bytes.resize(63);  // a known type with the wrong size
  BOOST_TEST(rejects(d));
  d = sample();
  d.length = 0;
  BOOST_TEST(rejects(d));
  d = sample();
  d.length = d.allocationSize - d.offset + 1;
  BOOST_TEST(rejects(d));
  d = sample();
  d.offset = ~uint64_t{0} - 10;  // overflow of offset + length
  d.ownerAddress = d.allocationBase + d.offset;
  BOOST_TEST(rejects(d));
  d = sample();
  d.ownerAddress += 8;
  BOOST_TEST(rejects(d));
  d = sample();
  d.pid = 0;
  BOOST_TEST(rejects(d));
  d = sample();
  d.pciBusId = std::string(40, 'x');
  BOOST_TEST(rejects(d));
  // Another record kind, a newer version, trailing bytes.
  Endpoint ep;
  ep.pid = 7;
  BOOST_TEST((codeOf([&] { decodeDescriptor(encodeEndpoint(ep)); }) == ErrorCode::ProtocolError));
  auto rec = encodeDescriptor(sample());
  rec[4] = 2;  // version u16 at offset 4
  BOOST_TEST((codeOf([&] { decodeDescriptor(rec); }) == ErrorCode::ProtocolError));
  rec = encodeDescriptor(sample());
  rec.push_back(0);
  BOOST_TEST((codeOf([&] { decodeDescriptor(rec); }) == ErrorCode::ProtocolError));
}

BOOST_AUTO_TEST_CASE(endpoint_round_trip_and_rejections) {
  Endpoint ep;
  ep.deviceUuid[3] = 9;
  ep.pciBusId = "0000:c1:00.0";
  ep.hostId = 5;
  ep.pid = 77;
  auto e = decodeEndpoint(encodeEndpoint(ep));
  BOOST_TEST((e.deviceUuid == ep.deviceUuid));
  BOOST_TEST(e.pciBusId == ep.pciBusId);
  BOOST_TEST(e.hostId == 5u);
  BOOST_TEST(e.pid == 77);
  ep.pid = -1;
  BOOST_TEST((codeOf([&] { decodeEndpoint(encodeEndpoint(ep)); }) == ErrorCode::ProtocolError));
  BOOST_TEST(
      (codeOf([&] { decodeEndpoint(encodeDescriptor(sample())); }) == ErrorCode::ProtocolError));
}

BOOST_AUTO_TEST_CASE(mutations_only_give_protocol_errors) {
  const auto good = encodeDescriptor(sample());
  std::mt19937 rng(20261129);
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    auto rec = good;
    switch (i % 4) {
      case 0:
        rec.resize(rng() % rec.size());
        break;
      case 1:
        rec[rng() % rec.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 2:  // forge a length field somewhere in the body
        for (int k = 0; k < 4; ++k) rec[(12 + rng() % (rec.size() - 12))] = 0xff;
        break;
      case 3:
        rec.insert(rec.begin() + rng() % rec.size(), static_cast<uint8_t>(rng()));
        break;
    }
    try {
      auto d = decodeDescriptor(rec);
      ++accepted;  // a flip in a handle byte or the uuid is still a valid record
      BOOST_REQUIRE(d.length > 0 && d.offset + d.length <= d.allocationSize);
    } catch (const Error& e) {
      BOOST_REQUIRE(e.code() == ErrorCode::ProtocolError);
    }
  }
  BOOST_TEST_MESSAGE(accepted << " of 20000 mutations still decoded");
}
