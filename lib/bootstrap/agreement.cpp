// The start-up agreement: every rank of a new bootstrap sends the choices that must match
// (backend, job size, version, frame format, every mustMatch key) and all fail together, naming
// the key and the ranks, when one differs.

#include "agreement.hpp"

#include <cstring>
#include <map>

#include <fmt/format.h>

#include <strata/backend/module.hpp>
#include <strata/error.hpp>
#include <strata/version.hpp>

#include "base/config_keys.hpp"
#include "base/crypto.hpp"
#include "base/wire.hpp"
#include "mesh/frames.hpp"

namespace strata::bootstrap {
namespace {

constexpr size_t kAgreementSlot = 1024;

using Settings = std::vector<std::pair<std::string, std::string>>;

/// The choices every rank must share (design: "Ranks check at start-up that they agree").
Settings mustMatch(const Bootstrap& b, const Config& config) {
  Settings s;
  s.emplace_back("bootstrap backend", std::string(b.backend()));
  s.emplace_back("job size", std::to_string(b.size()));
  s.emplace_back("strata version", STRATA_VERSION_STRING);
  s.emplace_back("module ABI", std::to_string(STRATA_MODULE_ABI_VERSION));
  s.emplace_back("frame format", std::to_string(mesh::kFrameVersion));
  for (const auto& k : config::keys()) {
    if (k.mustMatch && k.key != "bootstrap.backend") {
      s.emplace_back(std::string(k.key), config.get(k.key).value_or(""));
    }
  }
  return s;
}

std::vector<uint8_t> encodeSlot(const Settings& s) {
  wire::Writer w;
  w.u16(static_cast<uint16_t>(s.size()));
  for (auto& [k, v] : s) w.str(k).str(v.substr(0, 200));
  auto rec = wire::encodeRecord(20, 1, w.data());
  if (rec.size() > kAgreementSlot) {
    // Too many settings to send in full: agree on a digest (the message then names no key).
    auto d = crypto::sha256(w.data());
    wire::Writer h;
    h.u16(1).str("settings digest").str(crypto::toHex(d));
    rec = wire::encodeRecord(20, 1, h.data());
  }
  rec.resize(kAgreementSlot, 0);
  return rec;
}

Settings decodeSlot(const uint8_t* slot, int rank) {
  std::string what = fmt::format("start-up agreement record of rank {}", rank);
  auto h = wire::decodeHeader({slot, wire::kRecordHeaderSize}, 1, kAgreementSlot, what);
  if (h.kind != 20 || h.length > kAgreementSlot - wire::kRecordHeaderSize) {
    throw Error(ErrorCode::ProtocolError, fmt::format("malformed {}", what), rank);
  }
  wire::Reader r({slot + wire::kRecordHeaderSize, h.length}, what);
  Settings s;
  uint16_t n = r.u16();
  for (uint16_t i = 0; i < n; ++i) {
    std::string k = r.str(256);
    std::string v = r.str(256);
    s.emplace_back(std::move(k), std::move(v));
  }
  r.expectEnd();
  return s;
}

}  // namespace

void checkAgreement(Bootstrap& b, const Config& config) {
  if (b.size() == 1) return;
  auto mine = encodeSlot(mustMatch(b, config));
  std::vector<uint8_t> all(kAgreementSlot * static_cast<size_t>(b.size()));
  std::memcpy(all.data() + kAgreementSlot * static_cast<size_t>(b.rank()), mine.data(),
              kAgreementSlot);
  b.allGather(all.data(), kAgreementSlot);
  // Every rank holds the same table and reaches the same verdict, so all fail together.
  Settings ref = decodeSlot(all.data(), 0);
  for (int r = 1; r < b.size(); ++r) {
    Settings other = decodeSlot(all.data() + kAgreementSlot * static_cast<size_t>(r), r);
    std::map<std::string, std::string> om(other.begin(), other.end());
    for (auto& [k, v] : ref) {
      auto it = om.find(k);
      std::string ov = it == om.end() ? "<missing>" : it->second;
      if (ov != v) {
        throw Error(ErrorCode::InvalidConfig,
                    fmt::format("ranks disagree on {}: rank 0 has '{}', rank {} has '{}'. Every "
                                "rank must use the same value: check the STRATA_* environment "
                                "and strata.toml on every node",
                                k, v, r, ov),
                    r);
      }
    }
    if (om.size() != ref.size()) {
      throw Error(ErrorCode::InvalidConfig,
                  fmt::format("rank {} runs a different strata build than rank 0 (its start-up "
                              "record has {} settings, rank 0's has {})",
                              r, om.size(), ref.size()),
                  r);
    }
  }
}

}  // namespace strata::bootstrap
