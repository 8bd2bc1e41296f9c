#pragma once
#ifndef STRATA_INTERNAL_HEADERS
#error "transport/records_testing.hpp is internal to strata: applications include <strata/...> only"
#endif

// A test seam over the transport records (lib/transport/records.cpp, docs/wire-format.md kinds
// 80-84), whose types stay private to lib/transport: decode bytes as one of the records, the way
// the Context decodes what a peer sent, and encode what was decoded again. Only tests (the fuzz
// target and its replay) include this header.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace strata::transport::testing {

enum class Record : uint8_t { Host = 0, Memory = 1, Connect = 2, Ready = 3, Semaphore = 4 };
inline constexpr int kRecordTypes = 5;

/// Bytes of one rank's slot in the Context's host allGather (a HOST record is zero-padded to it).
size_t hostSlotBytes();

/// Decodes `bytes` as `record` sent by rank `from` in a job of `size` ranks (Host: `bytes` is
/// rank `from`'s slot) and returns the record encoded again from the decoded fields. Throws what
/// the decoder throws (ProtocolError for anything malformed).
std::vector<uint8_t> decodeAndEncode(Record record, std::span<const uint8_t> bytes, int from,
                                     int size);

}  // namespace strata::transport::testing
