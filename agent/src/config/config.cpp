#include "config/config.hpp"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <set>
#include <sstream>

#include "base/address.hpp"
#include "base/error.hpp"
#include "base/files.hpp"
#include "codec/dtype.hpp"
#include "config/fields.hpp"
#include "wire/stream_names.hpp"

namespace numastream {
using namespace detail;
namespace {

constexpr long long kMaxChunk = 256LL << 20;

void parse_codec_field(Fields& f, Config& c) {
  const json* v = f.raw("codec");
  if (!v) return;
  std::string name;
  if (v->is_string()) {
    name = v->get<std::string>();
  } else {
    Fields cf(*v, f.path("codec"));
    name = cf.string("name", "lz4");
    c.acceleration = static_cast<int>(cf.integer("acceleration", 1, 1, 65537));
    cf.finish();
  }
  auto codec = parse_codec(name);
  if (!codec) {
    throw ConfigError(f.path(v->is_string() ? "codec" : "codec.name"),
                      "must be one of lz4, shuffle-lz4, bslz4, none (got \"" + name + "\")");
  }
  c.codec = *codec;
}

void forbid_synthetic(Fields& sf) {
  for (const char* k : {"chunks", "seed", "frames", "flat_field", "change"})
    sf.forbid(k, "only used by the synthetic source");
}

void parse_hdf5_source(Fields& sf, Config& c) {
  c.source.kind = SourceConfig::Kind::hdf5;
  c.source.path = sf.required_string("path");
  c.source.dataset = sf.string("dataset", c.source.dataset);
  if (c.source.dataset.empty() || c.source.dataset.front() != '/') {
    throw ConfigError(sf.path("dataset"),
                      "must be an absolute path in the file (got \"" + c.source.dataset + "\")");
  }
  forbid_synthetic(sf);
  for (const char* k : {"dtype", "shape"}) sf.forbid(k, "the HDF5 dataset says it");
  sf.forbid("endpoint", "only used by the zmq source");
}

void parse_synthetic_source(Fields& sf, Config& c) {
  c.source.kind = SourceConfig::Kind::synthetic;
  c.source.chunks = static_cast<std::uint64_t>(sf.integer("chunks", 0, 0, 1LL << 48));
  c.source.seed = static_cast<std::uint64_t>(sf.integer("seed", 1, 0, 1LL << 62));
  c.source.frames = static_cast<int>(sf.integer("frames", 4, 1, 64));
  c.source.flat_field = sf.number("flat_field", c.source.flat_field, 0.1, 10000);
  if (const json* ch = sf.raw("change")) {
    Fields cf(*ch, sf.path("change"));
    c.source.change_at = static_cast<std::uint64_t>(cf.integer("at_chunk", 0, 1, 1LL << 48));
    c.source.change_flat_field = cf.number("flat_field", 0, 0.1, 10000);
    if (!cf.has("at_chunk"))
      throw ConfigError(cf.path("at_chunk"), "is required: the chunk the change comes at");
    if (!cf.has("flat_field"))
      throw ConfigError(cf.path("flat_field"), "is required: the beam's counts after the change");
    cf.finish();
  }
}

void parse_source(Fields& f, Config& c) {
  const json* v = f.raw("source");
  if (!v) return;
  Fields sf(*v, f.path("source"));
  std::string kind =
      sf.choice("kind", "synthetic", {"synthetic", "file", "zmq", "hdf5", "stream2"});
  c.source.rate_gbps = sf.number("rate_gbps", 0, 0, 1e6);
  const bool live = kind == "zmq" || kind == "stream2";
  if (!live) {
    for (const char* k : {"drain_s", "drain_quiet_ms"})
      sf.forbid(k, "only used by the live sources (zmq, stream2)");
  }
  c.source.drain_s = sf.number("drain_s", c.source.drain_s, 0, 3600);
  c.source.drain_quiet_ms =
      static_cast<int>(sf.integer("drain_quiet_ms", c.source.drain_quiet_ms, 10, 600000));
  if (kind == "hdf5") {
    parse_hdf5_source(sf, c);
    sf.finish();
    return;
  }
  sf.forbid("dataset", "only used by the hdf5 source");
  if (kind == "stream2") {
    c.source.kind = SourceConfig::Kind::stream2;
    c.source.endpoint = sf.required_string("endpoint");
    parse_endpoint(c.source.endpoint, sf.path("endpoint"));
    forbid_synthetic(sf);
    for (const char* k : {"dtype", "shape"})
      sf.forbid(k, "a Stream V2 series says it in its start message");
    sf.forbid("path", "only used by the file and hdf5 sources");
    sf.finish();
    return;
  }
  c.source.dtype = sf.string("dtype", c.source.dtype);
  if (!dtype_known(c.source.dtype)) {
    throw ConfigError(sf.path("dtype"),
                      "must be one of uint8, uint16, uint32, uint64, int8, int16, int32, int64, "
                      "float32, float64 (got \"" +
                          c.source.dtype + "\")");
  }
  if (const json* sh = sf.raw("shape")) {
    if (!sh->is_array() || sh->size() != 2 || !(*sh)[0].is_number_unsigned() ||
        !(*sh)[1].is_number_unsigned() || (*sh)[0].get<std::uint64_t>() == 0 ||
        (*sh)[1].get<std::uint64_t>() == 0) {
      throw ConfigError(sf.path("shape"), "must be [rows, cols], both positive");
    }
    c.source.shape = {(*sh)[0].get<std::uint64_t>(), (*sh)[1].get<std::uint64_t>()};
  }
  if (kind == "synthetic") {
    parse_synthetic_source(sf, c);
    sf.forbid("path", "only used by the file source");
    sf.forbid("endpoint", "only used by the zmq source");
  } else if (kind == "file") {
    c.source.kind = SourceConfig::Kind::file;
    c.source.path = sf.required_string("path");
    forbid_synthetic(sf);
    sf.forbid("endpoint", "only used by the zmq source");
  } else {
    c.source.kind = SourceConfig::Kind::zmq;
    c.source.endpoint = sf.required_string("endpoint");
    parse_endpoint(c.source.endpoint, sf.path("endpoint"));
    forbid_synthetic(sf);
    sf.forbid("path", "only used by the file source");
  }
  sf.finish();
}

void parse_placement(Fields& f, Config& c) {
  const json* v = f.raw("placement");
  if (!v) return;
  Fields pf(*v, f.path("placement"));
  c.pin = pf.choice("mode", "numa-aware", {"numa-aware", "os"}) == "numa-aware";
  if (const json* a = pf.raw("adaptive")) {
    if (!a->is_boolean()) throw ConfigError(pf.path("adaptive"), "must be true or false");
    c.adaptive = a->get<bool>();
  }
  const std::string wait = pf.choice("wait", "auto", {"auto", "park", "spin"});
  c.wait = wait == "park"   ? Config::Wait::park
           : wait == "spin" ? Config::Wait::spin
                            : Config::Wait::automatic;
  c.nic = pf.string("nic", "");
  if (pf.has("nic_numa_node")) {
    c.nic_numa_node = static_cast<int>(pf.integer("nic_numa_node", -1, 0, 4095));
  }
  if (const json* stages = pf.raw("stages")) {
    Fields sf(*stages, pf.path("stages"));
    for (Stage stage : c.stage_names()) {
      const std::string name(stage_name(stage));
      const json* s = sf.raw(name);
      if (!s) continue;
      Fields one(*s, sf.path(name));
      StageConfig sc;
      sc.threads = static_cast<int>(one.integer("threads", 0, 1, 1024));
      if (one.has("numa")) {
        std::string t = one.string("numa", "any");
        try {
          sc.target = NumaTarget::parse(t);
        } catch (const std::invalid_argument& e) {
          throw ConfigError(one.path("numa"), e.what());
        }
      }
      one.finish();
      c.stages[stage] = sc;
    }
    sf.finish();
  }
  pf.finish();
}

void check_stage_threads(const Config& c, Stage stage, int must_be, const std::string& why) {
  auto it = c.stages.find(stage);
  if (it != c.stages.end() && it->second.threads != 0 && it->second.threads != must_be) {
    throw ConfigError("placement.stages." + stage + ".threads",
                      "must be " + std::to_string(must_be) + " (" + why + "; got " +
                          std::to_string(it->second.threads) + ")");
  }
}

void parse_spill(Fields& f, Config& c) {
  const bool send = c.role == Role::send;
  if (const json* sp = f.raw("spill")) {
    if (!send) throw ConfigError("spill", "is a sender setting");
    Fields spf(*sp, "spill");
    c.spill.path = spf.required_string("path");
    if (c.spill.path.front() != '/') {
      throw ConfigError("spill.path", "must be an absolute path (got \"" + c.spill.path + "\")");
    }
    c.spill.max_bytes = static_cast<std::uint64_t>(spf.integer("max_bytes", 0, 1, 1LL << 50));
    if (!spf.has("max_bytes"))
      throw ConfigError("spill.max_bytes", "is required: the most the spill may hold");
    spf.finish();
  }
}

// 64 hex digits as their 32 bytes ("" stays "").
std::string sha256_hex(const std::string& hex, const char* field) {
  if (hex.empty()) return "";
  if (hex.size() != 64) {
    throw ConfigError(field, "must be a SHA-256 digest: 64 hex digits, got " +
                                 std::to_string(hex.size()) + " characters");
  }
  std::string out(32, '\0');
  for (std::size_t i = 0; i < 64; ++i) {
    const char ch = hex[i];
    int v = ch >= '0' && ch <= '9'   ? ch - '0'
            : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
            : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                     : -1;
    if (v < 0) throw ConfigError(field, "must be 64 hex digits, has '" + std::string(1, ch) + "'");
    out[i / 2] = static_cast<char>(out[i / 2] << 4 | v);
  }
  return out;
}

void parse_metrics_and_preview(Fields& f, Config& c) {
  if (const json* m = f.raw("metrics")) {
    Fields mf(*m, "metrics");
    c.metrics_listen = mf.string("listen", "");
    c.metrics_token_sha256 = sha256_hex(mf.string("token_sha256", ""), "metrics.token_sha256");
    c.metrics_tls = mf.boolean("tls", false);
    mf.finish();
  }
  if (const json* pv = f.raw("preview")) {
    Fields pf(*pv, "preview");
    if (const json* e = pf.raw("enabled")) {
      if (!e->is_boolean()) throw ConfigError("preview.enabled", "must be true or false");
      c.preview.enabled = e->get<bool>();
    }
    c.preview.max_side = static_cast<int>(pf.integer("max_side", c.preview.max_side, 16, 4096));
    c.preview.interval_ms =
        static_cast<int>(pf.integer("interval_ms", c.preview.interval_ms, 50, 60000));
    c.preview.listen = pf.string("listen", "");
    pf.finish();
    if (c.preview.enabled && c.metrics_listen.empty() && c.preview.listen.empty()) {
      throw ConfigError("preview.enabled",
                        "the preview needs an address: set preview.listen or metrics.listen");
    }
  }
}

void parse_timeouts(Fields& f, Config& c) {
  if (const json* t = f.raw("timeouts")) {
    Fields tf(*t, "timeouts");
    c.connect_timeout_s = tf.number("connect_s", c.connect_timeout_s, 0.1, 86400);
    c.idle_timeout_s = tf.number("idle_s", c.idle_timeout_s, 0, 86400);
    c.reconnect_timeout_s = tf.number("reconnect_s", c.reconnect_timeout_s, 0.1, 86400);
    c.ack_timeout_s = tf.number("ack_s", c.ack_timeout_s, 0.1, 86400);
    tf.finish();
  }
}

void parse_security(Fields& f, Config& c) {
  const bool send = c.role == Role::send;
  if (const json* sec = f.raw("security")) {
    Fields secf(*sec, "security");
    if (const json* cv = secf.raw("curve")) {
      Fields cf(*cv, "security.curve");
      c.security.secret_key_file = cf.required_string("secret_key_file");
      c.security.mode = cf.choice("mode", "encrypt", {"encrypt", "authenticate"}) == "encrypt"
                            ? SecurityConfig::Mode::encrypt
                            : SecurityConfig::Mode::authenticate;
      if (send) {
        c.security.server_key_file = cf.required_string("server_key_file");
        cf.forbid("allowed_keys_file", "only used by receive (the senders it accepts)");
      } else {
        c.security.allowed_keys_file = cf.required_string("allowed_keys_file");
        cf.forbid("server_key_file", "only used by send (the receiver's public key)");
      }
      cf.finish();
    }
    if (const json* af = secf.raw("allow_from")) {
      if (send)
        throw ConfigError(secf.path("allow_from"),
                          "only used by receive (the addresses senders connect from)");
      c.security.allow_from = parse_address_blocks(*af, secf.path("allow_from"));
    }
    secf.finish();
  }
}

// A receiver's own fields: streams, relay, reordering, verification, sinks, and what they exclude.
void parse_receive(Fields& f, Config& c) {
  c.streams = static_cast<int>(f.integer("streams", 1, 0, 4096));
  c.max_streams = static_cast<int>(f.integer("max_streams", std::max(64, c.streams), 1, 4096));
  if (c.max_streams < c.streams) {
    throw ConfigError("max_streams", std::to_string(c.max_streams) + " is below streams (" +
                                         std::to_string(c.streams) + ")");
  }
  if (const json* r = f.raw("relay")) {
    if (!r->is_boolean()) throw ConfigError("relay", "must be true or false");
    c.relay = r->get<bool>();
  }
  c.reorder_window = static_cast<int>(f.integer("reorder_window", c.reorder_window, 1, 4096));
  c.verify = f.choice("verify", "checksum", {"checksum", "decode"}) == "decode"
                 ? Config::Verify::decode
                 : Config::Verify::checksum;
  parse_sink(f, c);
  for (const char* k : {"source", "stream_id"}) f.forbid(k, "only used by send");
  if (c.relay && c.preview.enabled) {
    throw ConfigError(
        "preview.enabled",
        "a relay forwards frames undecoded: the preview is the decompressing receiver's");
  }
  if (!c.sink.curve.secret_key_file.empty() && !c.relay &&
      c.sink.kind != SinkConfig::Kind::numastream) {
    throw ConfigError(
        "sink.curve",
        "only a relay's onward link (relay: true, a zmq sink to a numastream receiver) "
        "is acknowledged, and so can be keyed; a plain zmq sink pushes to a consumer");
  }
  if (c.relay && c.consumers.size() > 1) {
    throw ConfigError("sinks",
                      "a relay forwards frames undecoded to one place (sink); the decompressing "
                      "receiver fans out");
  }
  if (c.relay && c.sink.kind != SinkConfig::Kind::zmq) {
    throw ConfigError("sink.kind", "a relay forwards frames: it needs a zmq sink");
  }
}

// What no single field says: threads per stage, chunk sizes against samples and shapes.
void check_consistent(const Config& c) {
  const bool send = c.role == Role::send;
  if (send) {
    check_stage_threads(c, Stage::send, c.connections, "one sending thread per connection");
    check_stage_threads(c, Stage::source, 1, "the source is one thread");
  } else {
    check_stage_threads(c, Stage::receive, c.connections, "one receiving thread per connection");
    check_stage_threads(c, Stage::sink, std::max<int>(1, static_cast<int>(c.consumers.size())),
                        "one sink thread per consumer");
  }
  if (send && c.codec == Codec::bslz4 && c.source.kind != SourceConfig::Kind::hdf5 &&
      c.chunk_bytes % dtype_size(c.source.dtype)) {
    throw ConfigError("chunk_bytes",
                      "must be a whole number of " + c.source.dtype + " samples for codec bslz4");
  }
  if (send && !c.source.shape.empty() &&
      c.source.shape[0] * c.source.shape[1] * dtype_size(c.source.dtype) != c.chunk_bytes) {
    throw ConfigError("source.shape",
                      "rows x cols x " + std::to_string(dtype_size(c.source.dtype)) +
                          " bytes must be chunk_bytes (" + std::to_string(c.chunk_bytes) + ")");
  }
  if (c.codec == Codec::shuffle_lz4 && c.chunk_bytes % 2) {
    throw ConfigError("chunk_bytes", "must be even for codec shuffle-lz4 (16-bit samples)");
  }
}

}  // namespace

std::vector<Stage> Config::stage_names() const {
  if (role == Role::send) return {Stage::source, Stage::compress, Stage::send, Stage::io};
  if (relay) return {Stage::receive, Stage::sink, Stage::io};  // a relay forwards frames undecoded
  return {Stage::receive, Stage::decompress, Stage::sink, Stage::io};
}

std::string Endpoint::for_connection(int i) const {
  if (!ipc_path.empty()) return "ipc://" + ipc_path + (i == 0 ? "" : "." + std::to_string(i));
  return "tcp://" + host + ":" + std::to_string(port + i);
}

Endpoint parse_endpoint(const std::string& text, const std::string& field) {
  if (text.rfind("ipc://", 0) == 0) {
    Endpoint e;
    e.ipc_path = text.substr(6);
    if (e.ipc_path.empty() || e.ipc_path[0] != '/' || e.ipc_path.size() > 100) {
      throw ConfigError(
          field,
          "ipc endpoints need an absolute path of at most 100 characters (got \"" + text + "\")");
    }
    return e;
  }
  const std::string prefix = "tcp://";
  if (text.rfind(prefix, 0) != 0) {
    throw ConfigError(field, "must be tcp://host:port or ipc:///path (got \"" + text + "\")");
  }
  std::string rest = text.substr(prefix.size());
  auto colon = rest.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    throw ConfigError(field, "must be tcp://host:port (got \"" + text + "\")");
  }
  Endpoint e;
  e.host = rest.substr(0, colon);
  std::string port = rest.substr(colon + 1);
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), e.port);
  if (ec != std::errc() || end != port.data() + port.size() || e.port < 1 || e.port > 65535) {
    throw ConfigError(field, "port must be from 1 to 65535 (got \"" + port + "\")");
  }
  return e;
}

Config parse_config(const json& doc, Role role) {
  Config c;
  c.role = role;
  const bool send = role == Role::send;
  Fields f(doc, "");
  f.integer("version", 1, 1, 1);
  c.endpoint = f.required_string("endpoint");
  Endpoint ep = parse_endpoint(c.endpoint, "endpoint");
  c.connections = static_cast<int>(f.integer("connections", 1, 1, 64));
  if (ep.ipc_path.empty() && ep.port + c.connections - 1 > 65535) {
    throw ConfigError("connections", "endpoint port " + std::to_string(ep.port) + " + " +
                                         std::to_string(c.connections) +
                                         " connections runs past port 65535");
  }
  c.chunk_bytes = static_cast<std::size_t>(f.integer("chunk_bytes", c.chunk_bytes, 1, kMaxChunk));
  parse_codec_field(f, c);
  c.queue_depth = static_cast<int>(f.integer("queue_depth", c.queue_depth, 1, 1024));
  c.hwm = static_cast<int>(f.integer("hwm", c.hwm, 1, 1000));
  c.window = static_cast<int>(f.integer("window", c.window, 1, 4096));
  c.sysfs_root = f.string("sysfs_root", c.sysfs_root);
  c.cgroup_root = f.string("cgroup_root", c.cgroup_root);
  c.state_dir = f.string("state_dir", "");
  if (!c.state_dir.empty() && c.state_dir.front() != '/') {
    throw ConfigError("state_dir", "must be an absolute path (got \"" + c.state_dir + "\")");
  }
  if (!c.state_dir.empty() && !send) throw ConfigError("state_dir", "is a sender setting");
  parse_spill(f, c);
  parse_metrics_and_preview(f, c);
  parse_timeouts(f, c);
  parse_security(f, c);
  c.origin = f.string("origin", "");
  if (auto why = origin_name_problem(c.origin); !c.origin.empty() && !why.empty())
    throw ConfigError("origin", why);
  if (send) {
    c.stream_id = static_cast<std::uint32_t>(f.integer("stream_id", 0, 0, 0xFFFFFFFFLL));
    parse_source(f, c);
    for (const char* k : {"sink", "sinks", "streams", "max_streams", "reorder_window", "relay",
                          "verify", "preview"}) {
      f.forbid(k, "only used by receive");
    }
  } else {
    parse_receive(f, c);
  }
  parse_placement(f, c);
  f.finish();

  check_consistent(c);
  return c;
}

void apply_override(json& doc, const std::string& assignment) {
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw ConfigError(assignment, "override must look like field.path=value");
  }
  std::string path = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  json parsed = json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) parsed = value;
  json* node = &doc;
  std::size_t start = 0;
  while (true) {
    auto dot = path.find('.', start);
    std::string key =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (key.empty()) throw ConfigError(path, "empty component in field path");
    if (!node->is_object()) {
      if (!node->is_null()) throw ConfigError(path, "'" + key + "' is inside a non-object value");
      *node = json::object();
    }
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  *node = std::move(parsed);
}

json load_config_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError(path, "cannot open config file");
  json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw ConfigError(path, "not valid JSON");
  return doc;
}

}  // namespace numastream
