// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) with strata's own
// encoders, so that every seed is a valid input the decoder accepts:
//   build/tests/fuzz/make-fuzz-corpus tests/fuzz/corpus
// Run it again after a record format changes and commit the result (docs/testing.md).
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "backends/transport/fabric/fabric_records.hpp"
#include "backends/transport/nvlink/nvlink_records.hpp"
#include "backends/transport/shm/shm_transport.hpp"
#include "base/config_keys.hpp"
#include "base/wire.hpp"
#include "collectives/host/chunk_header.hpp"
#include "core/failure_note_testing.hpp"
#include "mesh/frames.hpp"
#include "net/handshake_codec.hpp"
#include "transport/records_testing.hpp"
#include "watch/codec.hpp"

namespace fs = std::filesystem;
namespace hs = strata::handshake;
namespace wire = strata::wire;

namespace {

fs::path root;

using Bytes = std::vector<uint8_t>;

void put(const std::string& target, const std::string& name, const Bytes& bytes) {
  fs::create_directories(root / target);
  std::ofstream out(root / target / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

Bytes text(std::string_view s) {
  return Bytes(s.begin(), s.end());
}

Bytes cat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Bytes seq(size_t n, uint8_t from) {
  Bytes b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(from + i);
  return b;
}

void wireSeeds() {
  wire::Writer w;
  Bytes blob = text("blob");
  w.u8(1).u16(2).u32(3).u64(4).i32(-5).i64(-6).f64(7.5).bytes(blob).str("name").raw(seq(32, 0));
  put("wire", "schema-v1", wire::encodeRecord(3, 1, w.data()));
  put("wire", "schema-v2", wire::encodeRecord(3, 2, w.data()));
  // Driven reads: 4 ops (u8, u32, str, expectEnd) over a small body.
  put("wire", "driven", Bytes{4, 0, 2, 8, 10, 9, 1, 2, 3, 4, 3, 0, 0, 0, 'a', 'b', 'c'});
}

void handshakeSeeds() {
  // The fixed exchange of fuzz_handshake.cpp: secret "fuzz-secret", listener rank 1 of 4, mesh.
  const std::string_view secret = "fuzz-secret";
  hs::Challenge c;
  c.purpose = hs::Purpose::Mesh;
  c.listenerRank = 1;
  for (size_t i = 0; i < c.nonceL.size(); ++i) c.nonceL[i] = static_cast<uint8_t>(i);
  hs::Auth a;
  a.purpose = hs::Purpose::Mesh;
  a.rank = 2;
  a.size = 4;
  for (size_t i = 0; i < a.nonceC.size(); ++i) a.nonceC[i] = static_cast<uint8_t>(0x80 + i);
  a.mac =
      hs::authMac(secret, 'C', c.purpose, c.nonceL, a.nonceC, a.rank, a.size, c.listenerRank, 0);
  put("handshake", "challenge-mesh", hs::encode(c));
  hs::Challenge r = c;
  r.purpose = hs::Purpose::Rendezvous;
  r.listenerRank = 0;
  put("handshake", "challenge-rendezvous", hs::encode(r));
  put("handshake", "auth-valid", hs::encode(a));
  put("handshake", "result-accept", hs::encode(hs::acceptResult(secret, c, a)));
  hs::Result reject;
  reject.reason = "failed authentication (wrong job secret or not a strata peer)";
  put("handshake", "result-reject", hs::encode(reject));
}

Bytes frame(strata::mesh::FrameType type, int32_t tag, const Bytes& payload) {
  Bytes b(strata::mesh::kFrameHeaderSize);
  strata::mesh::encodeFrameHeader(b.data(), type, tag, payload.size());
  return cat(b, payload);
}

void meshSeeds() {
  using strata::mesh::FrameType;
  Bytes data = frame(FrameType::Data, 7, text("hello"));
  Bytes bye = frame(FrameType::Goodbye, 0, {});
  Bytes abort = frame(FrameType::Abort, 0, strata::mesh::encodeAbort(2, "rank 2 failed"));
  Bytes lost = frame(FrameType::Lost, 0, strata::mesh::encodeLost(3));
  put("mesh-frames", "data", data);
  put("mesh-frames", "abort", abort);
  put("mesh-frames", "lost", lost);
  put("mesh-frames", "goodbye-failed",
      frame(FrameType::Goodbye, 0,
            strata::mesh::encodeGoodbye("allReduce timed out waiting for rank 2")));
  put("mesh-frames", "stream",
      cat(cat(cat(frame(FrameType::Data, -2, seq(16, 0)), lost), abort), bye));
}

void chunkSeeds() {
  namespace coll = strata::collectives;
  coll::ChunkHeader h;
  h.op = static_cast<uint16_t>(coll::OpKind::AllReduce);
  h.type = 7;
  h.redop = 1;
  h.root = -1;
  h.count = 1 << 20;
  h.offset = 65536;
  h.bytes = 65536;
  h.seq = 3;
  Bytes one(coll::kChunkHeaderBytes);
  coll::encodeChunkHeader(h, reinterpret_cast<char*>(one.data()));
  put("chunk-header", "allreduce", one);
  put("chunk-header", "allreduce-expected", cat(one, one));
  coll::ChunkHeader other = h;
  other.op = static_cast<uint16_t>(coll::OpKind::Broadcast);
  other.root = 2;
  other.seq = 4;
  Bytes two(coll::kChunkHeaderBytes);
  coll::encodeChunkHeader(other, reinterpret_cast<char*>(two.data()));
  put("chunk-header", "broadcast-vs-allreduce", cat(two, one));
}

// The transport records are private to lib/transport; build them with the wire codec, as
// docs/wire-format.md lays them out, and check each through the seam.
void transportSeeds() {
  namespace tt = strata::transport::testing;
  auto seed = [](const std::string& name, tt::Record which, int from, int size,
                 const Bytes& record) {
    tt::decodeAndEncode(which, record, from, size);  // throws if the seed is not valid
    put("transport-records", name,
        cat(Bytes{static_cast<uint8_t>(which), static_cast<uint8_t>(from),
                  static_cast<uint8_t>(size - 1)},
            record));
  };
  wire::Writer host;
  host.i32(1).u64(0x1234).i32(4242).str("node17").u16(2).str("shm").str("fabric");
  seed("host", tt::Record::Host, 1, 4, wire::encodeRecord(84, 1, host.data()));
  Bytes shmDesc = strata::shm::encodeDescriptor({});
  wire::Writer mem;
  mem.i32(1).u64(0x1234).i32(4242).u8(1).u64(4096).u64(9).u16(1).str("shm").bytes(shmDesc);
  Bytes memory = wire::encodeRecord(80, 1, mem.data());
  seed("memory", tt::Record::Memory, 1, 4, memory);
  wire::Writer conn;
  conn.i32(2).i32(0).str("shm").bytes(strata::shm::encodeEndpoint({4242, 0x1234})).bytes(memory);
  seed("connect", tt::Record::Connect, 2, 4, wire::encodeRecord(81, 1, conn.data()));
  wire::Writer ready;
  ready.i32(3).i32(0).str("fabric");
  seed("ready", tt::Record::Ready, 3, 4, wire::encodeRecord(82, 1, ready.data()));
  wire::Writer sem;
  sem.i32(0).i32(1).u32(2).str("shm").u32(0).u64(0).str("shm").u32(1).u64(17);
  seed("semaphore", tt::Record::Semaphore, 0, 4, wire::encodeRecord(83, 1, sem.data()));
}

void shmSeeds() {
  strata::shm::MemoryDescriptor d;
  d.mode = strata::shm::DescriptorMode::Memfd;
  d.pid = 4242;
  d.hostId = 0x1234;
  d.nonce = 99;
  d.address = 0x7f0000000000;
  d.size = 1 << 20;
  d.fd = 12;
  d.inode = 777;
  d.offset = 4096;
  put("shm-records", "descriptor-memfd", strata::shm::encodeDescriptor(d));
  d.mode = strata::shm::DescriptorMode::User;
  d.fd = -1;
  d.inode = 0;
  d.offset = 0;
  put("shm-records", "descriptor-user", strata::shm::encodeDescriptor(d));
  put("shm-records", "endpoint", strata::shm::encodeEndpoint({4242, 0x1234}));
}

void fabricSeeds() {
  strata::fabric::EndpointRecord e;
  e.provider = "tcp;ofi_rxm";
  e.fabric = "127.0.0.0/8";
  e.domain = "lo";
  e.address = seq(16, 2);
  e.mrMode = 0x3c;
  e.cqDataSize = 8;
  e.probeKey = 5;
  e.probeVa = 0x7f0000001000;
  put("fabric-records", "endpoint", strata::fabric::encode(e));
  strata::fabric::MemoryRecord m{77, 0x7f0000002000, 8192, 0x3c, 1};
  put("fabric-records", "memory", strata::fabric::encode(m));
}

void nvlinkSeeds() {
  namespace nv = strata::nvlink;
  nv::MemoryDescriptor d;
  d.handles.push_back({static_cast<uint8_t>(nv::HandleType::RuntimeIpc), seq(64, 1)});
  d.handles.push_back({static_cast<uint8_t>(nv::HandleType::Fabric), seq(64, 100)});
  d.allocationBase = 0x7f0000000000;
  d.allocationSize = 1 << 21;
  d.offset = 4096;
  d.ownerAddress = d.allocationBase + d.offset;
  d.length = 8192;
  for (size_t i = 0; i < d.deviceUuid.size(); ++i) d.deviceUuid[i] = static_cast<uint8_t>(i);
  d.pciBusId = "0000:3b:00.0";
  d.hostId = 0x1234;
  d.pid = 4242;
  put("nvlink-records", "descriptor", nv::encodeDescriptor(d));
  nv::Endpoint e;
  e.deviceUuid = d.deviceUuid;
  e.pciBusId = d.pciBusId;
  e.hostId = d.hostId;
  e.pid = d.pid;
  put("nvlink-records", "endpoint", nv::encodeEndpoint(e));
}

void configSeeds() {
  namespace cfg = strata::config;
  // A file that sets every key with a default to it, written the way docs/configuration.md
  // shows; and one per section header style.
  std::string all;
  auto keys = cfg::keys();
  bool seen[6] = {};
  for (size_t i = 0; i < keys.size(); ++i) {
    const cfg::KeyInfo& k = keys[i];
    std::string value(k.defaultValue);
    // The environment: one seed per type (byte 0 picks the key, the value follows).
    if (!value.empty() && !seen[static_cast<int>(k.type)]) {
      seen[static_cast<int>(k.type)] = true;
      put("config-env", std::string(k.key), cat(Bytes{static_cast<uint8_t>(i)}, text(value)));
    }
    if (value.empty()) continue;
    bool quoted =
        k.type == cfg::Type::String || k.type == cfg::Type::Enum || k.type == cfg::Type::Bytes;
    all += std::string(k.key) + " = " + (quoted ? "\"" + value + "\"" : value) + "\n";
  }
  put("config-toml", "defaults.toml", text(all));
  put("config-toml", "sections.toml",
      text("# strata.toml\n[bootstrap]\ntimeout = 60.5\nbackend = \"tcp\"\n\n[bootstrap.tcp]\n"
           "interface = \"^docker,lo\"\n\n[log]\nlevel = \"debug\"\n"));
  put("config-toml", "empty.toml", text(""));
}

void textSeeds() {
  put("hostlist", "nodes", text("n[01-03,07],gpu-a[1-2]-ib,login"));
  put("hostlist", "two-groups", text("rack[1-2]-n[09-11]"));
  put("hostlist", "tasks", text("2(x3),1"));
  put("hostlist", "ports", text("12000-12003,12010"));
  put("netif", "prefixes", cat(Bytes{0, 0, 0xff}, text("eth,ib")));
  put("netif", "negated", cat(Bytes{1, 1, 10, 1, 2, 99, 0x02}, text("^docker")));
  put("netif", "exact", cat(Bytes{2, 0, 0x80}, text("=eth0")));
  put("netif", "negated-exact", cat(Bytes{0, 0, 0}, text("^=docker0,lo")));
  put("netif", "default", Bytes{0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 1, 2, 200, 0x7e});
}

// The status service's records (fuzz_watch.cpp): byte 0 picks the record (0 request, 1 reply,
// 2 exchange), byte 1 the rank of an exchange slot.
void watchSeeds() {
  namespace w = strata::watch;
  auto seed = [](const std::string& name, uint8_t which, uint8_t rank, const Bytes& record) {
    put("watch", name, cat(Bytes{which, rank}, record));
  };
  seed("request-status", 0, 0,
       w::encodeRequest(w::makeRequest(w::RequestType::Status, 0x5eed0123456789abull)));
  seed("request-list", 0, 0, w::encodeRequest(w::makeRequest(w::RequestType::List, 0)));
  seed("request-dump", 0, 0,
       w::encodeRequest(w::makeRequest(w::RequestType::Dump, 0x5eed0123456789abull)));
  w::Request revoke = w::makeRequest(w::RequestType::Revoke, 0x5eed0123456789abull);
  revoke.domain = "communicator 0";
  revoke.origin = 2;
  revoke.reason = "allReduce needs rank 3: it exited";
  revoke.suspects = {3};
  revoke.code = 4;  // PeerLost
  seed("request-revoke", 0, 0, w::encodeRequest(revoke));
  w::RankReport stalled;
  stalled.rank = 1;
  stalled.size = 4;
  stalled.pid = 4242;
  stalled.host = "node17";
  stalled.jobId = 0x5eed0123456789abull;
  w::CallReport comm;
  comm.domain = "communicator 0";
  comm.op = "allReduce";
  comm.seq = 41;
  comm.seconds = 5.25;
  comm.waitingFor = 2;
  comm.waitingSeconds = 5.0;
  comm.detail = "0 of 3 pieces from it received";
  comm.failed = true;
  w::CallReport boot;
  boot.domain = "bootstrap";
  boot.op = "barrier";
  boot.seq = 3;
  boot.seconds = 0.5;
  stalled.calls = {comm, boot};
  w::RankReport idle = stalled;
  idle.rank = 3;
  idle.calls.clear();
  w::Reply states;
  states.reports = {stalled, idle};
  seed("reply-states", 1, 0, w::encodeReply(states));
  w::Reply text;
  text.reports = {stalled};
  text.text = "job 5eed0123456789ab: 4 ranks, asked from rank 1\nverdict: rank 2 ...\n";
  seed("reply-text", 1, 0, w::encodeReply(text));
  w::Reply error;
  error.error = "this process (pid 4242) has no job 0000000000000007";
  seed("reply-error", 1, 0, w::encodeReply(error));
  seed("exchange-rank0", 2, 0,
       w::encodeExchange(
           {0x5eed0123456789abull, std::string(48, 'f'), {"127.0.0.1:40123", "node17", 4242}}));
  seed("exchange-rank3", 2, 3, w::encodeExchange({0x1111, "", {"[::1]:40124", "node18", 77}}));
}

// The failure note (fuzz_failure_note.cpp): byte 0 the job size - 1, byte 1 the sender's rank.
void failureNoteSeeds() {
  namespace n = strata::core::testing;
  auto seed = [](const std::string& name, uint8_t sizeLess1, uint8_t from, const n::Note& note) {
    Bytes slot = n::encode(note);
    n::decode(slot, from, sizeLess1 + 1);  // throws if the seed is not valid
    put("failure-note", name, cat(Bytes{sizeLess1, from}, slot));
  };
  seed("culprit-other", 3, 1,
       {2, "rank 2 on host node17 (pid 4242) is not answering", 1,
        "allReduce: Timeout after 6 s waiting for rank 2"});
  seed("culprit-self", 3, 3,
       {3, "rank 3 on host node17 (pid 77) is in broadcast #3 while ranks 0-2 are in allReduce #3",
        3, "broadcast: ProtocolError: a chunk of allReduce from rank 0"});
  seed("no-verdict", 1, 0, {-1, "", 0, "send: lost rank 1 (its bootstrap connection closed)"});
  seed("longest", 7, 5, {0, std::string(n::maxVerdictBytes(), 'v'), 5, std::string(4096, 'e')});
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  root = argv[1];
  wireSeeds();
  handshakeSeeds();
  meshSeeds();
  chunkSeeds();
  transportSeeds();
  shmSeeds();
  fabricSeeds();
  nvlinkSeeds();
  configSeeds();
  textSeeds();
  watchSeeds();
  failureNoteSeeds();
  std::printf("seeds written under %s\n", argv[1]);
  return 0;
}
