// The agent's configuration: a JSON file (rendered by the operator; schema in
// docs/agent-config.md) with command-line overrides. Every problem is a ConfigError naming the
// field; unknown fields are errors too, so a typo never silently falls back to a default.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "codec/codec.hpp"
#include "host/placement.hpp"

namespace numastream {

enum class Role { send, receive };

struct StageConfig {
  int threads = 0;  // 0: choose a default from the CPUs available
  NumaTarget target;
};

struct SourceConfig {
  // stream2: a DECTRIS Stream V2 detector (its PUSH socket, port 31001): each CBOR message
  // (start, image, end) is carried as it came; series follow series, endlessly.
  enum class Kind { synthetic, file, zmq, hdf5, stream2 } kind = Kind::synthetic;
  std::uint64_t chunks = 0;  // synthetic: chunks to send; 0 = until stopped
  std::uint64_t seed = 1;
  int frames = 4;  // synthetic: distinct projections, cycled
  double flat_field =
      10;  // synthetic: mean photon counts of the open beam (fewer: more compressible)
  // synthetic: from chunk change_at on (0: never), the beam gives change_flat_field counts
  // instead: a stream whose compressibility changes halfway (an exposure or filter change).
  std::uint64_t change_at = 0;
  double change_flat_field = 0;
  std::string path;      // file: a file or a directory of files (sorted by name)
  std::string endpoint;  // zmq: connect a PULL socket here; each message is one chunk, an
                         // empty message ends the stream. stream2: the detector's endpoint
  double rate_gbps = 0;  // 0: as fast as possible; else pace the source (detector emulation)
  // zmq, stream2 (live): a drain (SIGTERM) reads on until the detector pauses for drain_quiet_ms,
  // or drain_s passes: whatever is in transit when the detector socket closes is lost (PUSH/PULL
  // has no acknowledgement), and a pause is when nothing is.
  double drain_s = 15;
  int drain_quiet_ms = 500;
  std::string dataset = "/exchange/data";  // hdf5: the dataset of frames (DXchange's by default)
  // The pixels of a chunk (synthetic, file, zmq; an HDF5 dataset says its own): bslz4 shuffles
  // by their size, an HDF5 sink stores them as that type.
  std::string dtype = "uint16";
  std::vector<std::uint64_t>
      shape;  // rows, cols of a chunk; empty: rows of 2560 (synthetic) or 1-D
};

inline constexpr int kMaxOnwardConnections = 16;

struct SinkConfig {
  // stream2: re-emits the Stream V2 messages its stream carries, byte for byte and in the order
  // the detector sent them, on a bound PUSH socket, for consumers written for the detector.
  // numastream: an acknowledged, resumable hop to a numastream receiver elsewhere (an HPC or
  // analysis site) as one consumer of several (pipeline/onward_sink.hpp): a chunk counts as taken
  // once the far receiver acknowledged it; keyed with `curve` like a relay's onward link.
  enum class Kind { null, file, zmq, hdf5, stream2, numastream } kind = Kind::null;
  std::string path;  // file, hdf5: output path; "{stream}" is replaced by the stream id
  std::string dataset = "/exchange/data";  // hdf5: frames x rows x cols
  // file, hdf5: permission bits of the files written (and, with the search bits, of the
  // directories made above them); the owner reads and writes, others never write.
  unsigned mode = 0640;
  // hdf5: "io": "direct" writes files past the page cache (O_DIRECT; store/direct_io.hpp) where
  // their filesystem allows it, through it where it refuses; "buffered" (the default) through it.
  bool direct_io = false;
  std::string endpoint;  // zmq: downstream consumer endpoint to connect to; stream2: where to bind
  // numastream: the onward link's connections, each to the far receiver's data port `endpoint`'s
  // port + i (its connection i), chunks sent on whichever has room: over a long or lossy path
  // one TCP connection carries less than the link (its window per round trip, its loss recovery).
  int connections = 1;
  // zmq sink of a relay: the onward link to a numastream receiver elsewhere (an HPC or analysis
  // site), keyed: this agent's secret key, the far receiver's public key; encrypt (CURVE) or
  // authenticate only. Unset: plain.
  struct Curve {
    std::string secret_key_file, server_key_file;
    std::string server_key;  // the far receiver's public key itself, instead of server_key_file
    enum class Mode { encrypt, authenticate } mode = Mode::encrypt;
  } curve;
  // stream2: copies of the last messages handed over, sent again after a consumer goes away
  // (stream2_sink.hpp); 0 keeps none.
  int redeliver = 64;
  // stream2: the consumers admitted, by the address blocks they connect from; empty: any that
  // reaches the endpoint. Others are refused at connection (counted), never given a message.
  std::vector<std::string> allow_from;
  // hdf5, Stream V2 series: "layout": "file" (one file per series) or "nxmx": a master file and
  // data files of at most `frames_per_file` images each (pipeline/nxmx_series.hpp), with the
  // NXmx names a detector does not send (written "unknown" when not given).
  std::uint64_t frames_per_file = 0;  // 0: layout "file"
  std::string instrument, source, sample;
};

// receive: one of the places a gateway's verified chunks go at once (`sinks`), with what it is
// promised. lossless: every chunk, and a chunk is acknowledged upstream only once every lossless
// consumer has it (written, or handed on) -- a stopped lossless consumer holds the others back
// (the senders' windows and spills absorb it), it never makes them lose anything. latest: what
// it can take; a chunk it has no room for is passed over (counted), it never holds anyone back
// (a live view, an online analysis that wants the newest frames): zmq sinks only.
// send: chunks written to node-local storage while the pipeline downstream falls behind
// (data/spill.hpp), drained in order once it catches up.
struct SpillConfig {
  std::string path;             // a directory (an emptyDir or hostPath volume); empty = no spill
  std::uint64_t max_bytes = 0;  // the most the spill files may hold
  bool enabled() const { return !path.empty(); }
};

// A lossless consumer with `spill`: what it has no room for goes to its spill on local storage
// (data/spill.hpp) and counts as taken by it once written there, so a slow consumer holds the
// others back only once its spill holds max_bytes; it is handed everything in order from there
// (and what an earlier process left there first).
struct ConsumerConfig {
  SinkConfig sink;
  enum class Guarantee { lossless, latest } guarantee = Guarantee::lossless;
  SpillConfig spill;
};

// Authenticated, encrypted data connections (CURVE). Key files hold one 40-character Z85 key;
// they are read when the agent starts, never logged.
struct SecurityConfig {
  std::string secret_key_file;    // this agent's secret key
  std::string server_key_file;    // send: the receiver's public key
  std::string allowed_keys_file;  // receive: the senders' public keys, one per line (lines starting
                                  // with # are comments)
  // encrypt: CURVE on every frame. authenticate: the same keys only prove who connects (ZeroMQ
  // PLAIN with a token both ends derive from them); frames travel unencrypted, at no cost per byte.
  enum class Mode { encrypt, authenticate } mode = Mode::encrypt;
  bool curve() const { return !secret_key_file.empty(); }
  // receive: the address blocks (CIDR) senders may connect from, checked before any key (with
  // or without curve); empty = any address. Where no NetworkPolicy applies (host networking)
  // the operator lists the senders' nodes.
  std::vector<std::string> allow_from;
};

struct Config {
  Role role = Role::send;
  std::string endpoint;  // tcp://host:port; connection i uses port + i
  int connections = 1;
  std::uint32_t stream_id = 0;  // send: this stream's id
  // send, and a gateway's onward hop: the pipeline its streams belong to (wire/stream_names.hpp);
  // empty = none named
  std::string origin;
  int streams = 1;       // receive: streams to expect before finishing; 0 = until stopped
  int max_streams = 64;  // receive: streams held at most (a new stream id past it is refused)
  std::size_t chunk_bytes = 2560 * 2160 * 2;  // send: chunk size; receive: largest accepted
  Codec codec = Codec::lz4;
  int acceleration = 1;
  SourceConfig source;
  SinkConfig sink;  // receive: the sink, or the first of `sinks`
  // receive (not a relay): every consumer of the verified chunks, `sink` alone (lossless) or the
  // `sinks` list; empty for the null sink. One sink thread each.
  std::vector<ConsumerConfig> consumers;
  bool pin = true;  // placement.mode: numa-aware (true) or os (false)
  bool adaptive =
      true;  // placement.adaptive: the codec stage grows into idle CPUs (pipeline/governor.hpp)
  // placement.wait: how a stage's threads wait on an empty input queue (data/spin.hpp): spin
  // first where a thread has a CPU of its own (auto), never (park), or always (spin).
  enum class Wait { automatic, park, spin };
  Wait wait = Wait::automatic;
  std::string nic;                   // data NIC name (for `nic` targets and the NIC-local report)
  std::optional<int> nic_numa_node;  // overrides sysfs (virtual interfaces in pods)
  std::map<Stage, StageConfig> stages;
  int queue_depth = 4;
  int hwm = 2;                 // ZeroMQ high-water mark per connection, in messages
  int window = 8;              // send: unacknowledged chunks per connection at most (credit)
  int reorder_window = 16;     // file sink: chunks held to restore order
  std::string metrics_listen;  // host:port; empty = no metrics server
  // The SHA-256 (32 bytes) of the token a metrics client off the loopback interface presents
  // (metrics.token_sha256, 64 hex digits); empty: none asked.
  std::string metrics_token_sha256;
  // HTTPS for metrics clients off the loopback interface (metrics.tls), with a self-signed
  // certificate the agent makes at start; plain HTTP off the pod then serves /healthz only.
  bool metrics_tls = false;
  // receive: the latest frame of each stream as a picture (/preview), taken at most every
  // interval_ms, drawn at most max_side pixels a side, on its own `listen` address (host:port;
  // the operator's pods: 127.0.0.1, reached only through the API server's port-forward) or, with
  // none, on the metrics port. Off unless asked: it shows the experiment's data to whoever
  // reaches the address.
  struct Preview {
    bool enabled = false;
    int max_side = 512;
    int interval_ms = 500;
    std::string listen;
  } preview;
  std::string sysfs_root = "/sys";
  std::string cgroup_root = "/sys/fs/cgroup";  // this process's cgroup (v2), for its CPU budget
  std::string state_dir;  // send: keep the acknowledged record here across restarts ("" = no)
  SpillConfig spill;      // send
  SecurityConfig security;
  // receive: checksum (frames that arrived compressed are checked by their checksum over the wire
  // bytes and their framing; the others are decoded, as they must be to check a checksum of the
  // raw bytes) or decode (every frame decoded as well).
  enum class Verify { checksum, decode } verify = Verify::checksum;
  bool relay = false;  // receive: forward frames undecoded to sink.endpoint (the
                       // NIC-local receiving container of a gateway pod)
  double connect_timeout_s = 30;
  double idle_timeout_s = 60;       // receive: fail a started stream silent this long; 0 = never
  double reconnect_timeout_s = 60;  // send: how long a lost receiver may take to come back
  double ack_timeout_s = 60;  // send: a connected receiver acknowledging nothing this long fails

  // Stage names for the role, in pipeline order.
  std::vector<Stage> stage_names() const;
};

// Builds a Config from a JSON document. Throws ConfigError.
Config parse_config(const nlohmann::json& doc, Role role);

// Applies "a.b.c=value" to a JSON document (value parsed as JSON when it is valid JSON, else
// taken as a string). Throws ConfigError for a malformed assignment.
void apply_override(nlohmann::json& doc, const std::string& assignment);

// Reads and parses a JSON file. Throws ConfigError (field "<file>").
nlohmann::json load_config_file(const std::string& path);

// Endpoint helpers: "tcp://host:port".
// "tcp://host:port" (connection i uses port + i) or "ipc:///absolute/path" (connection i > 0
// uses path.i): IPC joins the containers of one pod through a shared emptyDir.
struct Endpoint {
  std::string host;
  int port = 0;
  std::string ipc_path;  // set for ipc:// endpoints
  std::string for_connection(int i) const;
};
Endpoint parse_endpoint(const std::string& text, const std::string& field);

}  // namespace numastream
