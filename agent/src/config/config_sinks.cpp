// The configuration's sinks: `sink`, or the consumers of `sinks`, each checked field by field.
#include <algorithm>
#include <string>
#include <vector>

#include "base/address.hpp"
#include "base/files.hpp"
#include "config/fields.hpp"
#include "wire/stream_names.hpp"

namespace numastream::detail {

std::vector<std::string> parse_address_blocks(const json& list, const std::string& path) {
  if (!list.is_array() || list.empty() || list.size() > 256) {
    throw ConfigError(path, "must be a list of 1 to 256 address blocks (got " + show(list) + ")");
  }
  std::vector<std::string> out;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    if (!list[i].is_string()) throw ConfigError(at, "must be a string (got " + show(list[i]) + ")");
    try {
      AddressBlocks::parse({list[i].get<std::string>()});
    } catch (const std::invalid_argument& e) {
      throw ConfigError(at, e.what());
    }
    out.push_back(list[i].get<std::string>());
  }
  return out;
}

namespace {

void parse_hdf5_sink(Fields& sf, SinkConfig& out) {
  out.kind = SinkConfig::Kind::hdf5;
  out.path = sf.required_string("path");
  out.dataset = sf.string("dataset", out.dataset);
  out.direct_io = sf.choice("io", "buffered", {"buffered", "direct"}) == "direct";
  if (out.dataset.empty() || out.dataset.front() != '/') {
    throw ConfigError(sf.path("dataset"),
                      "must be an absolute path in the file (got \"" + out.dataset + "\")");
  }
  if (sf.choice("layout", "file", {"file", "nxmx"}) == "nxmx") {
    out.frames_per_file =
        static_cast<std::uint64_t>(sf.integer("frames_per_file", 1000, 1, 1000000));
    for (auto [key, field] : {std::pair{"instrument", &out.instrument},
                              std::pair{"source", &out.source}, std::pair{"sample", &out.sample}}) {
      *field = sf.string(key, "");
      if (field->size() > 1024) throw ConfigError(sf.path(key), "must be at most 1024 bytes");
    }
  }
}

// A relay's or an onward consumer's link keys (checked against relay once the whole document is
// read: parse_config).
void parse_onward_curve(Fields& sf, SinkConfig& out) {
  if (const json* cv = sf.raw("curve")) {
    Fields cf(*cv, sf.path("curve"));
    out.curve.secret_key_file = cf.required_string("secret_key_file");
    // The far receiver's public key: a file, or the key itself (public: it may sit in a manifest).
    out.curve.server_key = cf.string("server_key", "");
    if (out.curve.server_key.empty()) {
      out.curve.server_key_file = cf.required_string("server_key_file");
    } else {
      cf.forbid("server_key_file", "give server_key or server_key_file, not both");
      if (out.curve.server_key.size() != 40) {
        throw ConfigError(cf.path("server_key"), "must be a CURVE public key (40 Z85 characters)");
      }
    }
    out.curve.mode = cf.choice("mode", "encrypt", {"encrypt", "authenticate"}) == "encrypt"
                         ? SinkConfig::Curve::Mode::encrypt
                         : SinkConfig::Curve::Mode::authenticate;
    cf.finish();
  }
}

void parse_consumer_spill(Fields& sf, const std::string& at, ConsumerConfig& k) {
  if (const json* sp = sf.raw("spill")) {
    Fields spf(*sp, at + ".spill");
    k.spill.path = spf.required_string("path");
    if (k.spill.path.empty() || k.spill.path.front() != '/') {
      throw ConfigError(at + ".spill.path",
                        "must be an absolute directory (got \"" + k.spill.path + "\")");
    }
    if (!spf.raw("max_bytes"))
      throw ConfigError(at + ".spill.max_bytes", "is required: the most the spill may hold");
    k.spill.max_bytes =
        static_cast<std::uint64_t>(spf.integer("max_bytes", 0, 1LL << 20, 1LL << 50));
    spf.finish();
    if (k.guarantee == ConsumerConfig::Guarantee::latest) {
      throw ConfigError(
          at + ".spill",
          "a latest-only consumer passes chunks over instead: a spill is for a lossless one");
    }
  }
}

// A consumer `k` (at `at`) writes no file, spills nowhere and sends to no endpoint another of
// `earlier` does, and has the mode every file consumer has.
void check_apart(const std::vector<ConsumerConfig>& earlier, const ConsumerConfig& k,
                 const std::string& at) {
  using K = SinkConfig::Kind;
  for (std::size_t j = 0; j < earlier.size(); ++j) {
    const SinkConfig& o = earlier[j].sink;
    const bool file = k.sink.kind == K::file || k.sink.kind == K::hdf5;
    if (file && (o.kind == K::file || o.kind == K::hdf5) && o.path == k.sink.path) {
      throw ConfigError(at + ".path",
                        "sinks[" + std::to_string(j) + "] writes " + o.path + " already");
    }
    if (file && (o.kind == K::file || o.kind == K::hdf5) && o.mode != k.sink.mode) {
      throw ConfigError(
          at + ".mode",
          "every file consumer of one receiver has the same mode (the process's umask; sinks[" +
              std::to_string(j) + "] has another)");
    }
    if (k.spill.enabled() && earlier[j].spill.path == k.spill.path) {
      throw ConfigError(at + ".spill.path",
                        "sinks[" + std::to_string(j) + "] spills there already");
    }
    if (!file && !o.endpoint.empty() && o.endpoint == k.sink.endpoint) {
      throw ConfigError(at + ".endpoint",
                        "sinks[" + std::to_string(j) + "] uses " + o.endpoint + " already");
    }
  }
}

// One sink object (`sink`, or an entry of `sinks`) into `out`.
void parse_sink_object(Fields& sf, SinkConfig& out) {
  std::string kind =
      sf.choice("kind", "null", {"null", "file", "zmq", "hdf5", "stream2", "numastream"});
  if (kind != "hdf5") sf.forbid("dataset", "only used by the hdf5 sink");
  if (kind != "hdf5") sf.forbid("io", "only used by the hdf5 sink");
  if (kind != "stream2") sf.forbid("redeliver", "only used by the stream2 sink");
  if (kind != "stream2") sf.forbid("allow_from", "only used by the stream2 sink (its consumers)");
  if (kind != "hdf5") sf.forbid("layout", "only used by the hdf5 sink");
  if (kind != "numastream") sf.forbid("connections", "only used by a numastream (onward) consumer");
  if (kind != "file" && kind != "hdf5") sf.forbid("mode", "only used by the file and hdf5 sinks");
  if (const json* m = sf.raw("mode")) {
    if (!m->is_string())
      throw ConfigError(sf.path("mode"), "must be a string of octal digits, like \"0640\"");
    try {
      out.mode = parse_file_mode(m->get<std::string>());
    } catch (const std::invalid_argument& e) {
      throw ConfigError(sf.path("mode"), e.what());
    }
  }
  if (kind == "null") {
    out.kind = SinkConfig::Kind::null;
  } else if (kind == "hdf5") {
    parse_hdf5_sink(sf, out);
  } else if (kind == "file") {
    out.kind = SinkConfig::Kind::file;
    out.path = sf.required_string("path");
  } else if (kind == "stream2") {
    out.kind = SinkConfig::Kind::stream2;
    out.endpoint = sf.required_string("endpoint");
    parse_endpoint(out.endpoint, sf.path("endpoint"));
    sf.forbid("path", "only used by the file and hdf5 sinks");
    out.redeliver = static_cast<int>(sf.integer("redeliver", out.redeliver, 0, 100000));
    if (const json* af = sf.raw("allow_from"))
      out.allow_from = parse_address_blocks(*af, sf.path("allow_from"));
  } else {
    out.kind = kind == "numastream" ? SinkConfig::Kind::numastream : SinkConfig::Kind::zmq;
    out.endpoint = sf.required_string("endpoint");
    parse_endpoint(out.endpoint, sf.path("endpoint"));
    if (kind == "numastream")
      out.connections = static_cast<int>(sf.integer("connections", 1, 1, kMaxOnwardConnections));
    sf.forbid("path", "only used by the file and hdf5 sinks");
  }
  if (out.frames_per_file == 0) {
    for (const char* k : {"frames_per_file", "instrument", "source", "sample"}) {
      sf.forbid(k, "only used by the hdf5 sink's layout \"nxmx\"");
    }
  }
  parse_onward_curve(sf, out);
}

constexpr std::size_t kMaxConsumers = 8;

}  // namespace

void parse_sink(Fields& f, Config& c) {
  const json* one = f.raw("sink");
  const json* many = f.raw("sinks");
  if (one && many)
    throw ConfigError("sinks", "give either sink (one) or sinks (several at once), not both");
  if (one) {
    Fields sf(*one, f.path("sink"));
    parse_sink_object(sf, c.sink);
    sf.finish();
    if (c.sink.kind != SinkConfig::Kind::null)
      c.consumers.push_back({c.sink, ConsumerConfig::Guarantee::lossless, {}});
    return;
  }
  if (!many) return;
  if (!many->is_array() || many->empty() || many->size() > kMaxConsumers) {
    throw ConfigError("sinks", "must be a list of 1 to " + std::to_string(kMaxConsumers) +
                                   " sinks (got " + show(*many) + ")");
  }
  for (std::size_t i = 0; i < many->size(); ++i) {
    const std::string at = "sinks[" + std::to_string(i) + "]";
    Fields sf((*many)[i], at);
    ConsumerConfig k;
    parse_sink_object(sf, k.sink);
    k.guarantee = sf.choice("guarantee", "lossless", {"lossless", "latest"}) == "latest"
                      ? ConsumerConfig::Guarantee::latest
                      : ConsumerConfig::Guarantee::lossless;
    parse_consumer_spill(sf, at, k);
    sf.finish();
    using K = SinkConfig::Kind;
    if (k.sink.kind == K::null)
      throw ConfigError(at + ".kind",
                        "a consumer of the stream needs a kind (file, hdf5, zmq, stream2)");
    if (!k.sink.curve.secret_key_file.empty() && k.sink.kind != K::numastream) {
      throw ConfigError(
          at + ".curve",
          "only an onward link is keyed: a numastream consumer, or a relay's one sink");
    }
    if (k.guarantee == ConsumerConfig::Guarantee::latest && k.sink.kind != K::zmq) {
      throw ConfigError(
          at + ".guarantee",
          "latest-only is for a live zmq consumer (numastream frames, each naming its "
          "sequence); a file, an hdf5 file and a Stream V2 series are written whole");
    }
    check_apart(c.consumers, k, at);
    c.consumers.push_back(std::move(k));
  }
  if (std::none_of(c.consumers.begin(), c.consumers.end(), [](const ConsumerConfig& k) {
        return k.guarantee == ConsumerConfig::Guarantee::lossless;
      })) {
    throw ConfigError("sinks",
                      "a chunk is acknowledged once its lossless consumers have it: at least one "
                      "must be lossless");
  }
  c.sink = c.consumers.front().sink;
}

}  // namespace numastream::detail
