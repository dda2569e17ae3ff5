#include "config/config.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "base/error.hpp"
#include "config/cli.hpp"

namespace numastream {
namespace {

using json = nlohmann::json;

json minimal() { return {{"endpoint", "tcp://10.0.0.5:5555"}}; }

// Expects parse_config to refuse `doc` naming `field`.
void expect_refused(const json& doc, Role role, const std::string& field) {
  try {
    parse_config(doc, role);
    ADD_FAILURE() << "accepted " << doc.dump();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos);
  }
}

TEST(Config, MinimalSenderGetsDefaults) {
  Config c = parse_config(minimal(), Role::send);
  EXPECT_EQ(c.connections, 1);
  EXPECT_EQ(c.chunk_bytes, 11059200u);
  EXPECT_EQ(c.codec, Codec::lz4);
  EXPECT_EQ(c.source.kind, SourceConfig::Kind::synthetic);
  EXPECT_TRUE(c.pin);
}

TEST(Config, FullReceiverDocument) {
  json doc = {{"version", 1},
              {"endpoint", "tcp://0.0.0.0:6000"},
              {"connections", 4},
              {"streams", 4},
              {"chunk_bytes", 11059200},
              {"codec", {{"name", "shuffle-lz4"}, {"acceleration", 2}}},
              {"sink", {{"kind", "file"}, {"path", "/data/stream-{stream}.raw"}}},
              {"placement",
               {{"mode", "numa-aware"},
                {"nic", "ens1f0"},
                {"nic_numa_node", 1},
                {"stages",
                 {{"receive", {{"threads", 4}, {"numa", "nic"}}},
                  {"decompress", {{"threads", 8}, {"numa", "spread"}}}}}}},
              {"metrics", {{"listen", "0.0.0.0:9100"}}},
              {"timeouts", {{"connect_s", 5}, {"idle_s", 0}}}};
  Config c = parse_config(doc, Role::receive);
  EXPECT_EQ(c.connections, 4);
  EXPECT_EQ(c.streams, 4);
  EXPECT_EQ(c.codec, Codec::shuffle_lz4);
  EXPECT_EQ(c.acceleration, 2);
  EXPECT_EQ(c.sink.kind, SinkConfig::Kind::file);
  EXPECT_EQ(c.nic_numa_node, 1);
  EXPECT_EQ(c.stages.at(Stage::decompress).threads, 8);
  EXPECT_EQ(c.stages.at(Stage::receive).target.kind, NumaTarget::Kind::nic);
  EXPECT_EQ(c.idle_timeout_s, 0);
}

TEST(Config, EveryProblemNamesItsField) {
  auto with = [](const std::string& path, json value) {
    json d = minimal();
    apply_override(d, path + "=" + value.dump());
    return d;
  };
  expect_refused(json::object(), Role::send, "endpoint");
  expect_refused(with("endpoint", "udp://x:1"), Role::send, "endpoint");
  expect_refused(with("endpoint", "tcp://host:70000"), Role::send, "endpoint");
  expect_refused(with("connections", 0), Role::send, "connections");
  expect_refused(with("connections", "4"), Role::send, "connections");
  expect_refused(with("chunk_bytes", 0), Role::send, "chunk_bytes");
  expect_refused(with("chunk_bytes", 1LL << 40), Role::send, "chunk_bytes");
  expect_refused(with("codec", "zstd"), Role::send, "codec");
  expect_refused(with("codec", json{{"name", "lz4"}, {"level", 3}}), Role::send, "codec.level");
  expect_refused(with("placement.stages.compress.threads", 0), Role::send,
                 "placement.stages.compress.threads");
  expect_refused(with("placement.stages.compress.threads", 5000), Role::send,
                 "placement.stages.compress.threads");
  expect_refused(with("placement.stages.compress.numa", "socket1"), Role::send,
                 "placement.stages.compress.numa");
  expect_refused(with("placement.stages.decompress.threads", 2), Role::send,
                 "placement.stages.decompress");
  expect_refused(with("placement.stages.send.threads", 3), Role::send,
                 "placement.stages.send.threads");
  expect_refused(with("placement.mode", "pinned"), Role::send, "placement.mode");
  expect_refused(with("source.kind", "tiff"), Role::send, "source.kind");
  expect_refused(with("source.kind", "hdf5"), Role::send, "source.path");
  expect_refused(
      with("source", json{{"kind", "hdf5"}, {"path", "/d/scan.h5"}, {"dataset", "exchange/data"}}),
      Role::send, "source.dataset");
  expect_refused(with("source", json{{"kind", "hdf5"}, {"path", "/d/scan.h5"}, {"dtype", "uint8"}}),
                 Role::send, "source.dtype");
  expect_refused(with("source.dtype", "uint12"), Role::send, "source.dtype");
  expect_refused(with("source.shape", json::array({100, 100})), Role::send, "source.shape");
  expect_refused(with("source.shape", json::array({100})), Role::send, "source.shape");
  expect_refused(with("source.dataset", "/exchange/data"), Role::send, "source.dataset");
  expect_refused(with("sink.kind", "hdf5"), Role::receive, "sink.path");
  expect_refused(with("sink", json{{"kind", "file"}, {"path", "/d/x"}, {"dataset", "/x"}}),
                 Role::receive, "sink.dataset");
  expect_refused(with("sink", json{{"kind", "file"}, {"path", "/d/x"}, {"io", "direct"}}),
                 Role::receive, "sink.io");
  expect_refused(with("sink", json{{"kind", "hdf5"}, {"path", "/d/x.h5"}, {"io", "o_direct"}}),
                 Role::receive, "sink.io");
  expect_refused(with("verify", "sometimes"), Role::receive, "verify");
  expect_refused(with("verify", "decode"), Role::send, "verify");
  expect_refused(with("source.kind", "file"), Role::send, "source.path");
  expect_refused(with("sink.kind", "null"), Role::send, "sink");
  expect_refused(with("sink.kind", "zmq"), Role::receive, "sink.endpoint");
  expect_refused(with("source.chunks", 5), Role::receive, "source");
  expect_refused(with("conections", 2), Role::send, "conections");
  expect_refused(with("version", 2), Role::send, "version");
  expect_refused(with("timeouts.connect_s", 0), Role::send, "timeouts.connect_s");
  expect_refused(with("source.change", json{{"at_chunk", 100}}), Role::send,
                 "source.change.flat_field");
  expect_refused(with("source.change", json{{"flat_field", 1}}), Role::send,
                 "source.change.at_chunk");
  expect_refused(with("source.flat_field", 0), Role::send, "source.flat_field");
  expect_refused(with("spill.path", "/var/spill"), Role::send, "spill.max_bytes");
  expect_refused(with("spill", json{{"path", "spill"}, {"max_bytes", 1000}}), Role::send,
                 "spill.path");
  expect_refused(with("spill", json{{"path", "/s"}, {"max_bytes", 0}}), Role::send,
                 "spill.max_bytes");
  expect_refused(with("spill", json{{"path", "/s"}, {"max_bytes", 1000}}), Role::receive, "spill");
  expect_refused(with("source.drain_s", 5), Role::send, "source.drain_s");  // synthetic: not live
  expect_refused(with("source", json{{"kind", "zmq"}, {"endpoint", "tcp://d:1"}, {"drain_s", -1}}),
                 Role::send, "source.drain_s");
  expect_refused(
      with("source", json{{"kind", "stream2"}, {"endpoint", "tcp://d:1"}, {"drain_quiet_ms", 0}}),
      Role::send, "source.drain_quiet_ms");
  expect_refused(with("security.allow_from", json::array({"10.0.0.0/8"})), Role::send,
                 "security.allow_from");
  expect_refused(with("security.allow_from", json::array()), Role::receive, "security.allow_from");
  expect_refused(with("security.allow_from", "10.0.0.0/8"), Role::receive, "security.allow_from");
  expect_refused(with("security.allow_from", json::array({"10.0.0.0/8", "10.0.0.0/33"})),
                 Role::receive, "security.allow_from[1]");
  expect_refused(with("security.allow_from", json::array({"10.0.0.0/8", 10})), Role::receive,
                 "security.allow_from[1]");
  expect_refused(with("security.allow_from", json(std::vector<std::string>(257, "10.0.0.0/8"))),
                 Role::receive, "security.allow_from");
}

TEST(Config, AnHdf5SinkWritesThroughThePageCacheUnlessAskedForDirectIo) {
  json doc = {{"version", 1},
              {"endpoint", "tcp://0.0.0.0:6000"},
              {"sink", {{"kind", "hdf5"}, {"path", "/d/x.h5"}}}};
  EXPECT_FALSE(parse_config(doc, Role::receive).sink.direct_io);
  doc["sink"]["io"] = "direct";
  EXPECT_TRUE(parse_config(doc, Role::receive).sink.direct_io);
  doc["sink"]["io"] = "buffered";
  EXPECT_FALSE(parse_config(doc, Role::receive).sink.direct_io);
}

TEST(Config, AnHdf5SinkWritesNxmxMasterAndDataFilesWhenAskedWithItsNames) {
  json doc = {{"version", 1},
              {"endpoint", "tcp://0.0.0.0:6000"},
              {"sink", {{"kind", "hdf5"}, {"path", "/d/{series}.h5"}}}};
  EXPECT_EQ(parse_config(doc, Role::receive).sink.frames_per_file, 0u)
      << "one file per series unless asked";
  doc["sink"]["layout"] = "nxmx";
  Config c = parse_config(doc, Role::receive);
  EXPECT_EQ(c.sink.frames_per_file, 1000u);
  EXPECT_EQ(c.sink.instrument, "");
  doc["sink"]["frames_per_file"] = 100;
  doc["sink"]["instrument"] = "ID23-2";
  doc["sink"]["source"] = "ESRF";
  doc["sink"]["sample"] = "thaumatin";
  c = parse_config(doc, Role::receive);
  EXPECT_EQ(c.sink.frames_per_file, 100u);
  EXPECT_EQ(c.sink.instrument + "/" + c.sink.source + "/" + c.sink.sample, "ID23-2/ESRF/thaumatin");

  auto with_sink = [](json sink) {
    return json{{"version", 1}, {"endpoint", "tcp://0.0.0.0:6000"}, {"sink", std::move(sink)}};
  };
  const json nx = {{"kind", "hdf5"}, {"path", "/d/x.h5"}, {"layout", "nxmx"}};
  expect_refused(with_sink({{"kind", "file"}, {"path", "/d/x"}, {"layout", "nxmx"}}), Role::receive,
                 "sink.layout");
  expect_refused(with_sink({{"kind", "hdf5"}, {"path", "/d/x.h5"}, {"layout", "dectris"}}),
                 Role::receive, "sink.layout");
  expect_refused(with_sink({{"kind", "hdf5"}, {"path", "/d/x.h5"}, {"frames_per_file", 10}}),
                 Role::receive, "sink.frames_per_file");
  expect_refused(with_sink({{"kind", "hdf5"}, {"path", "/d/x.h5"}, {"instrument", "I24"}}),
                 Role::receive, "sink.instrument");
  for (const json& bad : {json(0), json(-1), json(1000001), json("100"), json(1.5)}) {
    json sink = nx;
    sink["frames_per_file"] = bad;
    expect_refused(with_sink(sink), Role::receive, "sink.frames_per_file");
  }
  json sink = nx;
  sink["sample"] = std::string(1025, 'x');
  expect_refused(with_sink(sink), Role::receive, "sink.sample");
  sink = nx;
  sink["source"] = 7;
  expect_refused(with_sink(sink), Role::receive, "sink.source");
}

TEST(Config, PortRangeMustFitTheConnections) {
  json d = {{"endpoint", "tcp://h:65534"}, {"connections", 3}};
  expect_refused(d, Role::send, "connections");
}

TEST(Config, ShuffleNeedsEvenChunks) {
  json d = minimal();
  d["codec"] = "shuffle-lz4";
  d["chunk_bytes"] = 1001;
  expect_refused(d, Role::send, "chunk_bytes");
}

TEST(Config, OverridesCreatePathsAndParseValues) {
  json d = minimal();
  apply_override(d, "placement.stages.compress.threads=4");
  apply_override(d, "placement.nic=ens1f0");
  apply_override(d, "source.rate_gbps=2.5");
  EXPECT_EQ(d["placement"]["stages"]["compress"]["threads"], 4);
  EXPECT_EQ(d["placement"]["nic"], "ens1f0");
  EXPECT_EQ(d["source"]["rate_gbps"], 2.5);
  EXPECT_THROW(apply_override(d, "novalue"), ConfigError);
  EXPECT_THROW(apply_override(d, "a..b=1"), ConfigError);
  EXPECT_THROW(apply_override(d, "endpoint.host=x"), ConfigError) << "endpoint is a string";
}

TEST(Cli, FlagsOverrideTheFileAndKeepStringsStrings) {
  json d =
      config_from_args({"--endpoint", "tcp://127.0.0.1:5000", "--connections=2", "--threads",
                        "compress=3", "--numa", "receive=1", "--nic", "1234", "--set", "hwm=5"});
  EXPECT_EQ(d["connections"], 2);
  EXPECT_EQ(d["placement"]["stages"]["compress"]["threads"], 3);
  EXPECT_EQ(d["placement"]["stages"]["receive"]["numa"], "1") << "a NUMA target is a string";
  EXPECT_EQ(d["placement"]["nic"], "1234");
  EXPECT_EQ(d["hwm"], 5);
}

TEST(Cli, BadFlagsAreNamed) {
  try {
    config_from_args({"--frobnicate", "1"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "--frobnicate");
  }
  EXPECT_THROW(config_from_args({"--connections"}), ConfigError);
  EXPECT_THROW(config_from_args({"--threads", "compress"}), ConfigError);
  EXPECT_THROW(config_from_args({"stray"}), ConfigError);
  try {
    config_from_args({"--config", "/nonexistent.json"});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "/nonexistent.json");
  }
}

TEST(Cli, SummaryFileIsTakenOutOfTheConfigFlags) {
  std::vector<std::string> args = {"--endpoint", "tcp://a:1", "--summary-file",
                                   "/dev/termination-log", "--streams=2"};
  EXPECT_EQ(take_summary_file(args), "/dev/termination-log");
  EXPECT_EQ(args, (std::vector<std::string>{"--endpoint", "tcp://a:1", "--streams=2"}));
  args = {"--summary-file=/tmp/s.json"};
  EXPECT_EQ(take_summary_file(args), "/tmp/s.json");
  EXPECT_TRUE(args.empty());
  args = {"--summary-file"};
  EXPECT_THROW(take_summary_file(args), ConfigError);
}

TEST(Cli, TerminationSummaryKeepsTheFiguresAndFitsTheKubeletLimit) {
  nlohmann::json s = {{"role", "receive"},
                      {"chunks", 150},
                      {"lost", 0},
                      {"corrupt", 0},
                      {"raw_gbps", 0.97},
                      {"streams", nlohmann::json::array()},
                      {"placement", {{"nic_local", true}, {"threads", nlohmann::json::array()}}},
                      {"error", std::string(10000, 'x')}};
  auto out = nlohmann::json::parse(termination_summary(s));
  EXPECT_EQ(out["chunks"], 150);
  EXPECT_EQ(out["raw_gbps"], 0.97);
  EXPECT_EQ(out["nic_local"], true);
  EXPECT_FALSE(out.contains("streams"));
  EXPECT_LT(termination_summary(s).size(), 4096u);
}

// What the operator reads from an exited gateway (the pipeline's series and gaps once its pods
// are done) is in the summary, and the longest well-formed names still fit the kubelet's limit:
// six gaps and six incomplete series of 1000 characters each beside a 10000-character error.
TEST(Cli, TerminationSummaryKeepsSeriesAndGapsWithinTheLimit) {
  nlohmann::json names = nlohmann::json::array();
  for (int i = 0; i < 6; ++i) names.push_back(std::to_string(i) + std::string(1000, 'n'));
  nlohmann::json s = {{"role", "receive"},
                      {"chunks", 104},
                      {"declared_missing", 3},
                      {"unwritten", 1},
                      {"stream2_series_completed", 2},
                      {"stream2_series_incomplete", 6},
                      {"stream2_series_incomplete_last", names},
                      {"gaps_last", names},
                      {"error", std::string(10000, 'x')}};
  const std::string text = termination_summary(s);
  EXPECT_LT(text.size(), 4096u);
  auto out = nlohmann::json::parse(text);
  EXPECT_EQ(out["stream2_series_completed"], 2);
  EXPECT_EQ(out["stream2_series_incomplete"], 6);
  EXPECT_EQ(out["declared_missing"], 3);
  EXPECT_EQ(out["unwritten"], 1);
  for (const char* k : {"stream2_series_incomplete_last", "gaps_last"}) {
    ASSERT_EQ(out[k].size(), 5u) << k;
    EXPECT_EQ(out[k][0].get<std::string>().substr(0, 1), "1") << k << ": the last five";
    EXPECT_EQ(out[k][4].get<std::string>().size(), 150u) << k;
  }
}

// The configurations the operator renders (agent/tests/golden, written and checked by the Go
// test internal/render TestRenderedConfigsMatchTheGoldenFiles) mean to the agent what they mean
// to the operator: every value the operator writes is the value the agent runs with.
TEST(Config, GoldenConfigsFromTheOperator) {
  namespace fs = std::filesystem;
  int files = 0, previews = 0, nxmx = 0, fanouts = 0, onwards = 0;
  for (const auto& entry : fs::directory_iterator(NUMASTREAM_GOLDEN)) {
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    std::ifstream in(entry.path());
    json doc = json::parse(in);
    const bool gateway = name.find(".gateway-") != std::string::npos;
    Config c = parse_config(doc, gateway ? Role::receive : Role::send);
    ++files;
    EXPECT_EQ(c.endpoint, doc["endpoint"].get<std::string>());
    EXPECT_EQ(c.connections, doc["connections"].get<int>());
    EXPECT_EQ(c.chunk_bytes, doc["chunk_bytes"].get<std::size_t>());
    EXPECT_EQ(codec_name(c.codec), doc["codec"].get<std::string>());
    EXPECT_EQ(c.metrics_listen, doc["metrics"]["listen"].get<std::string>());
    EXPECT_EQ(c.pin, doc["placement"]["mode"] == "numa-aware");
    ASSERT_EQ(c.stages.size(), doc["placement"]["stages"].size());
    for (const auto& [stage_text, want] : doc["placement"]["stages"].items()) {
      const auto stage = stage_from_name(stage_text);
      ASSERT_TRUE(stage && c.stages.count(*stage)) << stage_text;
      EXPECT_EQ(c.stages.at(*stage).threads, want["threads"].get<int>()) << stage_text;
      EXPECT_EQ(c.stages.at(*stage).target.to_string(), want["numa"].get<std::string>())
          << stage_text;
    }
    if (doc["placement"].contains("nic_numa_node")) {
      EXPECT_EQ(c.nic_numa_node, doc["placement"]["nic_numa_node"].get<int>());
    }
    EXPECT_EQ(c.relay, doc.value("relay", false));
    if (gateway) {
      EXPECT_EQ(c.streams, doc["streams"].get<int>());
      const std::string kinds[] = {"null", "file", "zmq", "hdf5", "stream2", "numastream"};
      // One sink, or several consumers (spec.sinks), each with its guarantee.
      const json sinks = doc.contains("sinks") ? doc["sinks"] : json::array({doc["sink"]});
      if (doc.contains("sinks")) {
        ++fanouts;
        ASSERT_EQ(c.consumers.size(), sinks.size());
      }
      for (std::size_t i = 0; i < c.consumers.size(); ++i) {
        const SinkConfig& k = c.consumers[i].sink;
        EXPECT_EQ(kinds[static_cast<int>(k.kind)], sinks[i]["kind"].get<std::string>()) << i;
        EXPECT_EQ(k.path, sinks[i].value("path", "")) << i;
        EXPECT_EQ(k.endpoint, sinks[i].value("endpoint", "")) << i;
        EXPECT_EQ(c.consumers[i].guarantee == ConsumerConfig::Guarantee::latest,
                  sinks[i].value("guarantee", "") == "latest")
            << i;
        if (k.kind ==
            SinkConfig::Kind::numastream) {  // an onward hop: the plan's connections, its keys
          ++onwards;
          EXPECT_EQ(k.connections, sinks[i].value("connections", 1)) << i;
          if (sinks[i].contains("curve")) {
            EXPECT_EQ(k.curve.secret_key_file, sinks[i]["curve"]["secret_key_file"]) << i;
            EXPECT_EQ(k.curve.server_key, sinks[i]["curve"]["server_key"]) << i;
          }
        }
      }
      const json& sink = sinks[0];
      EXPECT_EQ(kinds[static_cast<int>(c.sink.kind)], sink["kind"].get<std::string>());
      EXPECT_EQ(c.sink.path, sink.value("path", ""));
      EXPECT_EQ(c.sink.dataset, sink.value("dataset", "/exchange/data"));
      EXPECT_EQ(c.sink.endpoint, sink.value("endpoint", ""));
      EXPECT_EQ(c.idle_timeout_s, doc["timeouts"]["idle_s"].get<double>());
      const json pv = doc.value("preview", json::object());
      EXPECT_EQ(c.preview.enabled, pv.value("enabled", false));
      EXPECT_EQ(c.preview.max_side, pv.value("max_side", 512));
      EXPECT_EQ(c.preview.interval_ms, pv.value("interval_ms", 500));
      if (c.preview.enabled) ++previews;
      EXPECT_EQ(c.sink.frames_per_file, sink.value("frames_per_file", std::uint64_t{0}));
      EXPECT_EQ(c.sink.instrument, sink.value("instrument", ""));
      if (c.sink.frames_per_file > 0) ++nxmx;
    } else {
      EXPECT_EQ(c.stream_id, doc["stream_id"].get<std::uint32_t>());
      EXPECT_EQ(c.state_dir, doc["state_dir"].get<std::string>());
      if (doc.contains("spill")) {
        EXPECT_EQ(c.spill.path, doc["spill"]["path"].get<std::string>());
        EXPECT_EQ(c.spill.max_bytes, doc["spill"]["max_bytes"].get<std::uint64_t>());
      } else {
        EXPECT_FALSE(c.spill.enabled());
      }
      const std::string kinds[] = {"synthetic", "file", "zmq", "hdf5", "stream2"};
      const json& src = doc["source"];
      EXPECT_EQ(c.source.dataset, src.value("dataset", "/exchange/data"));
      EXPECT_EQ(kinds[static_cast<int>(c.source.kind)], src["kind"].get<std::string>());
      EXPECT_EQ(c.source.chunks, src.value("chunks", std::uint64_t{0}));
      EXPECT_EQ(c.source.rate_gbps, src.value("rate_gbps", 0.0));
      EXPECT_EQ(c.source.path, src.value("path", ""));
      EXPECT_EQ(c.source.endpoint, src.value("endpoint", ""));
    }
    const json sec = doc.value("security", json::object());
    if (sec.contains("curve")) {
      const json& curve = sec["curve"];
      EXPECT_EQ(c.security.secret_key_file, curve["secret_key_file"].get<std::string>());
      EXPECT_EQ(c.security.server_key_file, curve.value("server_key_file", ""));
      EXPECT_EQ(c.security.allowed_keys_file, curve.value("allowed_keys_file", ""));
      EXPECT_EQ(c.security.mode == SecurityConfig::Mode::authenticate,
                curve["mode"] == "authenticate");
    } else {
      EXPECT_FALSE(c.security.curve());
    }
    EXPECT_EQ(c.security.allow_from, sec.value("allow_from", std::vector<std::string>{}));
    if (name.find("hostnetwork") != std::string::npos && name.find("relay") != std::string::npos) {
      EXPECT_FALSE(c.security.allow_from.empty())
          << name << ": a host-network gateway checks addresses";
    }
  }
  EXPECT_GE(files, 12) << "golden configurations in " << NUMASTREAM_GOLDEN;
  EXPECT_GE(previews, 1) << "a golden configuration with the live preview";
  EXPECT_GE(nxmx, 1) << "a golden configuration writing NXmx master and data files";
  EXPECT_GE(fanouts, 1) << "a golden configuration with several consumers (sinks)";
  EXPECT_GE(onwards, 1) << "a golden configuration with an onward hop (sinks kind numastream)";
}

}  // namespace
}  // namespace numastream

namespace numastream {
namespace {

// A Stream V2 re-emit may name the consumers it admits, by address block; no other sink takes
// the list, and a block that is not one is refused by its position.
TEST(Config, AReemitNamesItsConsumersByAddressBlock) {
  json doc = {{"endpoint", "tcp://0.0.0.0:6000"},
              {"sink",
               {{"kind", "stream2"},
                {"endpoint", "tcp://*:31001"},
                {"allow_from", {"10.40.0.0/24", "192.0.2.7"}}}}};
  const Config c = parse_config(doc, Role::receive);
  ASSERT_EQ(c.consumers.size(), 1u);
  EXPECT_EQ(c.consumers[0].sink.allow_from,
            (std::vector<std::string>{"10.40.0.0/24", "192.0.2.7"}));
  json bad = doc;
  bad["sink"]["allow_from"] = {"10.40.0.0/24", "not-an-address"};
  expect_refused(bad, Role::receive, "sink.allow_from[1]");
  bad["sink"]["allow_from"] = json::array();
  expect_refused(bad, Role::receive, "sink.allow_from");
  json file = {{"endpoint", "tcp://0.0.0.0:6000"},
               {"sink", {{"kind", "file"}, {"path", "/tmp/x"}, {"allow_from", {"10.0.0.0/8"}}}}};
  expect_refused(file, Role::receive, "sink.allow_from");
}

// The live preview shows the experiment's data: off unless asked, only where frames are decoded,
// and only with an address it is served on (its own, or the metrics port).
TEST(Config, ThePreviewIsAReceiversServedOnTheMetricsPortAndOffUnlessAsked) {
  json doc = {{"endpoint", "tcp://0.0.0.0:6000"}, {"metrics", {{"listen", "127.0.0.1:9100"}}}};
  EXPECT_FALSE(parse_config(doc, Role::receive).preview.enabled);
  doc["preview"] = {{"enabled", true}, {"max_side", 256}, {"interval_ms", 1000}};
  const Config c = parse_config(doc, Role::receive);
  EXPECT_TRUE(c.preview.enabled);
  EXPECT_EQ(c.preview.max_side, 256);
  EXPECT_EQ(c.preview.interval_ms, 1000);
  expect_refused(doc, Role::send, "preview");
  json relay = doc;
  relay["relay"] = true;
  relay["sink"] = {{"kind", "zmq"}, {"endpoint", "ipc:///tmp/x.sock"}};
  expect_refused(relay, Role::receive, "preview.enabled");
  json unserved = doc;
  unserved.erase("metrics");
  expect_refused(unserved, Role::receive, "preview.enabled");
  // Or on an address of its own, metrics or not.
  unserved["preview"]["listen"] = "127.0.0.1:9102";
  EXPECT_EQ(parse_config(unserved, Role::receive).preview.listen, "127.0.0.1:9102");
  for (auto [key, bad] : {std::pair{"max_side", json(8)}, std::pair{"max_side", json(100000)},
                          std::pair{"interval_ms", json(0)}, std::pair{"enabled", json("yes")},
                          std::pair{"colour", json("viridis")}}) {
    json d = doc;
    d["preview"][key] = bad;
    expect_refused(d, Role::receive, std::string("preview.") + key);
  }
}

}  // namespace
}  // namespace numastream

namespace numastream {
namespace {

// A relay's onward link may be keyed; nothing else takes sink.curve (a plain zmq sink pushes to
// a consumer with no acknowledgement to key).
TEST(Config, OnlyARelaysOnwardLinkTakesKeys) {
  json doc = {
      {"endpoint", "tcp://0.0.0.0:6000"},
      {"relay", true},
      {"sink",
       {{"kind", "zmq"},
        {"endpoint", "tcp://hpc-dtn:7000"},
        {"curve",
         {{"secret_key_file", "/keys/gw.secret"}, {"server_key_file", "/keys/hpc.public"}}}}}};
  const Config c = parse_config(doc, Role::receive);
  EXPECT_EQ(c.sink.curve.secret_key_file, "/keys/gw.secret");
  EXPECT_EQ(c.sink.curve.server_key_file, "/keys/hpc.public");
  EXPECT_EQ(c.sink.curve.mode, SinkConfig::Curve::Mode::encrypt);
  json plain = doc;
  plain.erase("relay");
  expect_refused(plain, Role::receive, "sink.curve");
  json no_server = doc;
  no_server["sink"]["curve"].erase("server_key_file");
  expect_refused(no_server, Role::receive, "sink.curve.server_key_file");
  json bad_mode = doc;
  bad_mode["sink"]["curve"]["mode"] = "none";
  expect_refused(bad_mode, Role::receive, "sink.curve.mode");
}

// sinks: several consumers at once, each with its guarantee; `sink` alone is one lossless one.
TEST(Config, SinksListsTheConsumersEachWithItsGuarantee) {
  json doc = minimal();
  doc["sinks"] = json::array(
      {{{"kind", "hdf5"}, {"path", "/data/s-{series}.h5"}},
       {{"kind", "stream2"}, {"endpoint", "tcp://0.0.0.0:9999"}},
       {{"kind", "zmq"}, {"endpoint", "tcp://10.0.0.9:7000"}, {"guarantee", "latest"}}});
  Config c = parse_config(doc, Role::receive);
  ASSERT_EQ(c.consumers.size(), 3u);
  EXPECT_EQ(c.consumers[0].sink.kind, SinkConfig::Kind::hdf5);
  EXPECT_EQ(c.consumers[0].guarantee, ConsumerConfig::Guarantee::lossless);
  EXPECT_EQ(c.consumers[1].sink.endpoint, "tcp://0.0.0.0:9999");
  EXPECT_EQ(c.consumers[2].guarantee, ConsumerConfig::Guarantee::latest);
  EXPECT_EQ(c.sink.kind, SinkConfig::Kind::hdf5) << "sink is the first consumer";

  json one = minimal();
  one["sink"] = {{"kind", "file"}, {"path", "/data/x.raw"}};
  Config o = parse_config(one, Role::receive);
  ASSERT_EQ(o.consumers.size(), 1u);
  EXPECT_EQ(o.consumers[0].guarantee, ConsumerConfig::Guarantee::lossless);
  EXPECT_TRUE(parse_config(minimal(), Role::receive).consumers.empty())
      << "the null sink has no consumer";
}

// An onward consumer's connections: 1 unless given, at most 16, and only an onward consumer's.
TEST(Config, AnOnwardConsumerTakesItsConnections) {
  json doc = minimal();
  doc["sinks"] = json::array(
      {{{"kind", "file"}, {"path", "/data/a.raw"}},
       {{"kind", "numastream"}, {"endpoint", "tcp://hpc-dtn:7000"}, {"connections", 8}}});
  EXPECT_EQ(parse_config(doc, Role::receive).consumers[1].sink.connections, 8);
  doc["sinks"][1].erase("connections");
  EXPECT_EQ(parse_config(doc, Role::receive).consumers[1].sink.connections, 1);
  for (int bad : {0, 17, -1}) {
    doc["sinks"][1]["connections"] = bad;
    expect_refused(doc, Role::receive, "sinks[1].connections");
  }
  doc["sinks"][1]["connections"] = 2;
  doc["sinks"][0]["connections"] = 2;
  expect_refused(doc, Role::receive, "sinks[0].connections");
  doc["sinks"][0].erase("connections");
  // The far receiver's public key itself, or a file: one of them.
  const std::string key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
  doc["sinks"][1]["curve"] = {{"secret_key_file", "/keys/gateway.secret"}, {"server_key", key}};
  EXPECT_EQ(parse_config(doc, Role::receive).consumers[1].sink.curve.server_key, key);
  doc["sinks"][1]["curve"]["server_key_file"] = "/keys/far.public";
  expect_refused(doc, Role::receive, "sinks[1].curve.server_key_file");
  doc["sinks"][1]["curve"].erase("server_key_file");
  doc["sinks"][1]["curve"]["server_key"] = "short";
  expect_refused(doc, Role::receive, "sinks[1].curve.server_key");
}

// A lossless consumer's spill: an absolute directory and a budget of at least 1 MiB, its own
// directory; a latest-only consumer has none (it passes chunks over instead).
TEST(Config, ALosslessConsumerTakesASpillOfItsOwn) {
  json doc = minimal();
  doc["sinks"] = json::array({{{"kind", "file"}, {"path", "/data/a.raw"}},
                              {{"kind", "zmq"},
                               {"endpoint", "tcp://analysis:7000"},
                               {"spill", {{"path", "/spill/analysis"}, {"max_bytes", 64 << 20}}}}});
  const Config c = parse_config(doc, Role::receive);
  EXPECT_EQ(c.consumers[1].spill.path, "/spill/analysis");
  EXPECT_EQ(c.consumers[1].spill.max_bytes, 64u << 20);
  EXPECT_FALSE(c.consumers[0].spill.enabled());
  for (const auto& [spill, field] : std::vector<std::pair<json, std::string>>{
           {{{"path", "relative"}, {"max_bytes", 64 << 20}}, "sinks[1].spill.path"},
           {{{"path", "/spill/a"}}, "sinks[1].spill.max_bytes"},
           {{{"path", "/spill/a"}, {"max_bytes", 1000}}, "sinks[1].spill.max_bytes"},
           {{{"path", "/spill/a"}, {"max_bytes", 64 << 20}, {"extra", 1}}, "sinks[1].spill.extra"},
       }) {
    json bad = doc;
    bad["sinks"][1]["spill"] = spill;
    expect_refused(bad, Role::receive, field);
  }
  json latest = doc;
  latest["sinks"][1]["guarantee"] = "latest";
  expect_refused(latest, Role::receive, "sinks[1].spill");
  json shared = doc;
  shared["sinks"][0]["spill"] = doc["sinks"][1]["spill"];
  expect_refused(shared, Role::receive, "sinks[1].spill.path");
}

TEST(Config, SinksThatCannotBeKeptAreRefusedNamingTheEntry) {
  auto with = [](json sinks) {
    json doc = minimal();
    doc["sinks"] = std::move(sinks);
    return doc;
  };
  const json file = {{"kind", "file"}, {"path", "/data/a.raw"}};
  json both = with(json::array({file}));
  both["sink"] = file;
  expect_refused(both, Role::receive, "sinks");
  expect_refused(with(json::array()), Role::receive, "sinks");
  expect_refused(with(json::array({file, file, file, file, file, file, file, file, file})),
                 Role::receive, "sinks");
  expect_refused(with(file), Role::receive, "sinks");
  // A file written whole cannot pass chunks by.
  expect_refused(
      with(json::array({{{"kind", "file"}, {"path", "/data/a.raw"}, {"guarantee", "latest"}}})),
      Role::receive, "sinks[0].guarantee");
  expect_refused(
      with(json::array(
          {{{"kind", "stream2"}, {"endpoint", "tcp://0.0.0.0:9"}, {"guarantee", "latest"}}})),
      Role::receive, "sinks[0].guarantee");
  expect_refused(
      with(json::array(
          {file, {{"kind", "zmq"}, {"endpoint", "tcp://1.2.3.4:5"}, {"guarantee", "sometimes"}}})),
      Role::receive, "sinks[1].guarantee");
  // Nobody would acknowledge anything.
  expect_refused(
      with(json::array(
          {{{"kind", "zmq"}, {"endpoint", "tcp://1.2.3.4:5"}, {"guarantee", "latest"}}})),
      Role::receive, "sinks");
  // Two consumers on one file, one endpoint; modes a single umask cannot give.
  expect_refused(with(json::array({file, {{"kind", "hdf5"}, {"path", "/data/a.raw"}}})),
                 Role::receive, "sinks[1].path");
  expect_refused(with(json::array({{{"kind", "zmq"}, {"endpoint", "tcp://1.2.3.4:5"}},
                                   {{"kind", "zmq"}, {"endpoint", "tcp://1.2.3.4:5"}}})),
                 Role::receive, "sinks[1].endpoint");
  expect_refused(
      with(json::array({file, {{"kind", "file"}, {"path", "/data/b.raw"}, {"mode", "0600"}}})),
      Role::receive, "sinks[1].mode");
  expect_refused(with(json::array({file, {{"kind", "null"}}})), Role::receive, "sinks[1].kind");
  // An onward numastream hop: acknowledged by the far receiver, keyed; never latest-only, never
  // a path; only it (or a relay's one sink) takes keys.
  const json keys = {{"secret_key_file", "/keys/gw.secret"},
                     {"server_key_file", "/keys/hpc.public"}};
  const json onward = {{"kind", "numastream"}, {"endpoint", "tcp://hpc-dtn:7000"}, {"curve", keys}};
  const Config hop = parse_config(with(json::array({file, onward})), Role::receive);
  EXPECT_EQ(hop.consumers[1].sink.kind, SinkConfig::Kind::numastream);
  EXPECT_EQ(hop.consumers[1].sink.curve.server_key_file, "/keys/hpc.public");
  json latest_hop = onward;
  latest_hop["guarantee"] = "latest";
  expect_refused(with(json::array({file, latest_hop})), Role::receive, "sinks[1].guarantee");
  json hop_path = onward;
  hop_path["path"] = "/data/x";
  expect_refused(with(json::array({file, hop_path})), Role::receive, "sinks[1].path");
  expect_refused(
      with(json::array(
          {file, {{"kind", "zmq"}, {"endpoint", "tcp://hpc-dtn:7000"}, {"curve", keys}}})),
      Role::receive, "sinks[1].curve");
  expect_refused(
      with(json::array({file, {{"kind", "file"}, {"path", "/data/b.raw"}, {"colour", "red"}}})),
      Role::receive, "sinks[1].colour");
  expect_refused(
      with(json::array({{{"kind", "zmq"},
                         {"endpoint", "tcp://1.2.3.4:5"},
                         {"curve", {{"secret_key_file", "/k"}, {"server_key_file", "/s"}}}}})),
      Role::receive, "sinks[0].curve");
  json relay = with(json::array({{{"kind", "zmq"}, {"endpoint", "tcp://1.2.3.4:5"}},
                                 {{"kind", "zmq"}, {"endpoint", "tcp://1.2.3.4:6"}}}));
  relay["relay"] = true;
  expect_refused(relay, Role::receive, "sinks");
  json send = with(json::array({file}));
  expect_refused(send, Role::send, "sinks");
  // One sink thread per consumer.
  json threads = with(json::array({file, {{"kind", "file"}, {"path", "/data/b.raw"}}}));
  threads["placement"] = {{"stages", {{"sink", {{"threads", 1}}}}}};
  expect_refused(threads, Role::receive, "placement.stages.sink.threads");
}

// The metrics token's digest: 64 hex digits (either case) become its 32 bytes; anything else is
// refused naming the field, never taken as "no token".
TEST(Config, TheMetricsTokenDigestIsSixtyFourHexDigits) {
  json doc = {{"endpoint", "tcp://0.0.0.0:6000"}, {"metrics", {{"listen", "0.0.0.0:9100"}}}};
  EXPECT_EQ(parse_config(doc, Role::receive).metrics_token_sha256, "");
  doc["metrics"]["token_sha256"] = std::string(62, '0') + "aF";
  const std::string d = parse_config(doc, Role::send).metrics_token_sha256;
  ASSERT_EQ(d.size(), 32u);
  EXPECT_EQ(static_cast<unsigned char>(d[31]), 0xafu);
  EXPECT_EQ(d[0], '\0');
  for (const std::string& bad : {std::string(63, 'a'), std::string(65, 'a'),
                                 std::string(63, 'a') + "g", std::string(64, ' ')}) {
    json b = doc;
    b["metrics"]["token_sha256"] = bad;
    expect_refused(b, Role::receive, "metrics.token_sha256");
  }
}

// metrics.tls: off unless true; anything but a boolean is refused naming it (never taken as off).
TEST(Config, MetricsTlsIsABoolean) {
  json doc = {{"endpoint", "tcp://0.0.0.0:6000"}, {"metrics", {{"listen", "0.0.0.0:9100"}}}};
  EXPECT_FALSE(parse_config(doc, Role::receive).metrics_tls);
  doc["metrics"]["tls"] = true;
  EXPECT_TRUE(parse_config(doc, Role::send).metrics_tls);
  for (const json& bad : {json("true"), json(1), json(nullptr)}) {
    json b = doc;
    b["metrics"]["tls"] = bad;
    expect_refused(b, Role::receive, "metrics.tls");
  }
}

}  // namespace
}  // namespace numastream
