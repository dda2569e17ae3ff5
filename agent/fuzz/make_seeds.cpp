// Writes the fuzzers' seed corpus (agent/fuzz/corpus/): valid frames of every type and codec,
// and a few damaged ones; valid configurations for both roles. Run once; the output is kept in
// the repository.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "codec/codec.hpp"
#include "wire/wire.hpp"

using namespace numastream;

namespace {

void put(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> data_frame(Codec codec, std::size_t raw_size,
                                  bool payload_checksum = false) {
  std::vector<std::byte> raw(raw_size);
  for (std::size_t i = 0; i < raw_size; ++i) raw[i] = static_cast<std::byte>((i * 7) % 13);
  Compressor comp(codec, 1, raw_size, 2);
  std::vector<std::byte> out(wire::kHeaderSize + max_encoded_size(raw_size));
  auto res = comp.compress(raw, {out.data() + wire::kHeaderSize, out.size() - wire::kHeaderSize});
  wire::Header h;
  h.codec = res.codec;
  h.connections = 2;
  h.connection = 1;
  h.sequence = 42;
  h.raw_size = static_cast<std::uint32_t>(raw_size);
  h.payload_size = static_cast<std::uint32_t>(res.size);
  h.checksum = wire::checksum(raw);
  h.element_size = res.codec == Codec::bslz4 ? 2 : 0;
  if (payload_checksum) {
    h.payload_checksum = true;
    h.checksum = wire::checksum({out.data() + wire::kHeaderSize, res.size});
  }
  wire::encode_header(h, out.data());
  out.resize(wire::kHeaderSize + res.size);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "agent/fuzz/corpus";
  std::filesystem::create_directories(dir + "/frame");
  std::filesystem::create_directories(dir + "/config");
  put(dir + "/frame/data-lz4", data_frame(Codec::lz4, 4096));
  put(dir + "/frame/data-shuffle", data_frame(Codec::shuffle_lz4, 4096));
  put(dir + "/frame/data-none", data_frame(Codec::none, 64));
  put(dir + "/frame/data-bslz4", data_frame(Codec::bslz4, 20000));
  put(dir + "/frame/data-bslz4-as-stored", data_frame(Codec::bslz4, 20000, true));
  put(dir + "/frame/origin", wire::encode_metadata(0, 0, 1, R"({"origin":"beamline-7.p1"})"));
  put(dir + "/frame/metadata",
      wire::encode_metadata(3, 0, 1, R"({"dtype":"uint16","shape":[2160,2560]})"));
  auto truncated = data_frame(Codec::lz4, 4096);
  truncated.resize(truncated.size() / 2);
  put(dir + "/frame/data-truncated", truncated);
  std::vector<std::byte> eos(wire::kHeaderSize + wire::kEndOfStreamPayload);
  wire::Header h;
  h.type = wire::FrameType::end_of_stream;
  h.connections = 1;
  h.sequence = 300;
  h.payload_size = wire::kEndOfStreamPayload;
  wire::encode_header(h, eos.data());
  wire::encode_end_of_stream({300, 300u << 20, 150}, eos.data() + wire::kHeaderSize);
  put(dir + "/frame/end-of-stream", eos);
  std::vector<std::uint64_t> seqs = {5, 7, 9};
  put(dir + "/frame/ack",
      wire::encode_ack(wire::FrameType::ack, 0, 0, 1, 4, wire::kAckEndOfStream, seqs));
  put(dir + "/frame/resume", wire::encode_ack(wire::FrameType::resume, 3, 1, 2, 100, 0, seqs));
  auto write_text = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/config/" + name) << text;
  };
  write_text(
      "send.json",
      R"({"version": 1, "endpoint": "tcp://gw:5555", "connections": 4, "chunk_bytes": 11059200,
  "codec": "lz4", "stream_id": 2, "window": 8, "source": {"kind": "synthetic", "chunks": 100, "rate_gbps": 25},
  "placement": {"mode": "numa-aware", "stages": {"compress": {"threads": 8, "numa": "spread"}}},
  "timeouts": {"connect_s": 30, "reconnect_s": 60, "ack_s": 60}, "metrics": {"listen": "0.0.0.0:9100"}})");
  write_text("receive.json",
             R"({"version": 1, "endpoint": "tcp://0.0.0.0:5555", "connections": 4, "streams": 1,
  "sink": {"kind": "file", "path": "/data/s-{stream}.raw"}, "reorder_window": 32,
  "placement": {"mode": "numa-aware", "nic_numa_node": 1,
    "stages": {"receive": {"threads": 4, "numa": "nic"}, "decompress": {"threads": 8, "numa": "0"}}}})");
  write_text("relay.json", R"(sink.endpoint=ipc:///run/numastream/stream.sock
{"version": 1, "endpoint": "tcp://0.0.0.0:5555", "relay": true, "sink": {"kind": "zmq", "endpoint": "ipc:///run/x.sock"},
  "placement": {"stages": {"receive": {"threads": 1, "numa": "nic"}}}})");
  return 0;
}
