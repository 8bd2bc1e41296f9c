#include "transport/records_testing.hpp"

#include "records.hpp"

namespace strata::transport::testing {

size_t hostSlotBytes() {
  return kHostSlot;
}

std::vector<uint8_t> decodeAndEncode(Record record, std::span<const uint8_t> bytes, int from,
                                     int size) {
  switch (record) {
    case Record::Host:
      return encodeHost(decodeHost(bytes, from, size));
    case Record::Memory:
      return encodeMemory(decodeMemory(bytes));
    case Record::Connect:
      return encodeConnect(decodeConnect(bytes, from));
    case Record::Ready:
      return encodeReady(decodeReady(bytes, from));
    case Record::Semaphore:
      return encodeSemaphore(decodeSemaphore(bytes, from));
  }
  return {};
}

}  // namespace strata::transport::testing
