// libFuzzer target for the transport records the Context exchanges over the bootstrap
// (lib/transport/records.cpp, kinds 80-84), through the test seam transport/records_testing.hpp.
// Input: byte 0 picks the record (HOST, MEMORY, CONNECT, READY, SEMAPHORE), byte 1 the sender's
// rank (0-7), byte 2 the job size (1-8); the rest is the record. Checked:
//   * a decoder refuses only with Error(ProtocolError);
//   * what decodes encodes back to the same bytes (HOST: the same record in front of the slot's
//     zero padding, which the decoder ignores), and that encoding decodes again to itself.
#include "base/wire.hpp"
#include "fuzz_common.hpp"
#include "transport/records_testing.hpp"

namespace tt = strata::transport::testing;
using strata::Error;
using strata::ErrorCode;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input input(data, size);
  auto record = static_cast<tt::Record>(input.byte() % tt::kRecordTypes);
  int from = input.byte() % 8;
  int jobSize = 1 + input.byte() % 8;
  std::span<const uint8_t> bytes = input.rest();
  std::vector<uint8_t> again;
  try {
    again = tt::decodeAndEncode(record, bytes, from, jobSize);
  } catch (const Error& e) {
    fuzz::expectCode(e, ErrorCode::ProtocolError);
    return 0;
  }
  if (record == tt::Record::Host) {
    FUZZ_CHECK(again.size() == tt::hostSlotBytes());
    size_t used =
        strata::wire::kRecordHeaderSize + strata::wire::loadLe<uint32_t>(again.data() + 8);
    FUZZ_CHECK(used <= again.size() && used <= bytes.size());
    FUZZ_CHECK(fuzz::same(std::span(again).first(used), bytes.first(used)));
  } else {
    FUZZ_CHECK(fuzz::same(again, bytes));
  }
  FUZZ_CHECK(tt::decodeAndEncode(record, again, from, jobSize) == again);
  return 0;
}
