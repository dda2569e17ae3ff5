#include "config/cli.hpp"

#include <map>

#include "base/error.hpp"

namespace numastream {
namespace {

// Shortcut flags and the config field each one sets.
const std::map<std::string, std::string>& shortcuts() {
  static const std::map<std::string, std::string> m = {
      {"--endpoint", "endpoint"},
      {"--connections", "connections"},
      {"--chunk-bytes", "chunk_bytes"},
      {"--codec", "codec"},
      {"--stream-id", "stream_id"},
      {"--streams", "streams"},
      {"--chunks", "source.chunks"},
      {"--seed", "source.seed"},
      {"--rate-gbps", "source.rate_gbps"},
      {"--source", "source.kind"},
      {"--source-path", "source.path"},
      {"--source-endpoint", "source.endpoint"},
      {"--source-dataset", "source.dataset"},
      {"--dtype", "source.dtype"},
      {"--sink-dataset", "sink.dataset"},
      {"--verify", "verify"},
      {"--sink", "sink.kind"},
      {"--sink-path", "sink.path"},
      {"--sink-endpoint", "sink.endpoint"},
      {"--sink-layout", "sink.layout"},
      {"--frames-per-file", "sink.frames_per_file"},
      {"--instrument", "sink.instrument"},
      {"--source-name", "sink.source"},
      {"--sample", "sink.sample"},
      {"--placement", "placement.mode"},
      {"--nic", "placement.nic"},
      {"--nic-numa-node", "placement.nic_numa_node"},
      {"--metrics-listen", "metrics.listen"},
      {"--queue-depth", "queue_depth"},
      {"--hwm", "hwm"},
      {"--window", "window"},
      {"--reconnect-timeout", "timeouts.reconnect_s"},
      {"--ack-timeout", "timeouts.ack_s"},
      {"--sysfs-root", "sysfs_root"},
      {"--cgroup-root", "cgroup_root"},
      {"--spill-path", "spill.path"},
      {"--spill-max-bytes", "spill.max_bytes"},
      {"--connect-timeout", "timeouts.connect_s"},
      {"--idle-timeout", "timeouts.idle_s"},
  };
  return m;
}

}  // namespace

std::string run_usage() {
  std::string s =
      "flags (each sets a config field; --set FIELD=VALUE sets any field):\n"
      "  --config FILE          JSON config (docs/agent-config.md); flags override it\n"
      "  --threads STAGE=N      threads of a stage (placement.stages.STAGE.threads)\n"
      "  --numa STAGE=TARGET    NUMA target of a stage: node id, nic, spread or any\n"
      "  --summary-file PATH    also write the run's counts and rates there on exit (in a pod:\n"
      "                         /dev/termination-log, read back by the operator)\n";
  for (const auto& [flag, field] : shortcuts()) {
    s += "  " + flag + std::string(flag.size() < 23 ? 23 - flag.size() : 1, ' ') + field + "\n";
  }
  return s;
}

std::string take_summary_file(std::vector<std::string>& args) {
  std::string path;
  for (std::size_t i = 0; i < args.size();) {
    if (args[i] == "--summary-file") {
      if (i + 1 >= args.size()) throw ConfigError("--summary-file", "needs a value");
      path = args[i + 1];
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i),
                 args.begin() + static_cast<std::ptrdiff_t>(i) + 2);
    } else if (args[i].rfind("--summary-file=", 0) == 0) {
      path = args[i].substr(15);
      args.erase(args.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  return path;
}

std::string termination_summary(const nlohmann::json& summary) {
  static const char* kKeys[] = {"role",
                                "verified",
                                "chunks",
                                "delivered_before",
                                "acknowledged",
                                "lost",
                                "corrupt",
                                "duplicates",
                                "raw_bytes",
                                "wire_bytes",
                                "seconds",
                                "raw_gbps",
                                "wire_gbps",
                                "resumes",
                                "complete",
                                "drained",
                                "lost_at_least",
                                "declared_missing",
                                "unwritten",
                                "stream2_series_completed",
                                "stream2_series_incomplete"};
  // Lists of names (the last declared gaps, the last incomplete series): at most 5 entries of at
  // most 150 characters each, so that with the error below the whole fits the kubelet's 4096.
  static const char* kNameLists[] = {"gaps_last", "stream2_series_incomplete_last"};
  nlohmann::json out = nlohmann::json::object();
  for (const char* k : kKeys) {
    if (summary.contains(k)) out[k] = summary[k];
  }
  for (const char* k : kNameLists) {
    if (!summary.contains(k) || !summary[k].is_array()) continue;
    nlohmann::json names = nlohmann::json::array();
    const auto& all = summary[k];
    for (std::size_t i = all.size() > 5 ? all.size() - 5 : 0; i < all.size(); ++i) {
      if (!all[i].is_string()) continue;
      std::string n = all[i].get<std::string>();
      if (n.size() > 150) n = n.substr(0, 147) + "...";
      names.push_back(n);
    }
    out[k] = names;
  }
  if (summary.contains("placement") && summary["placement"].is_object() &&
      summary["placement"].contains("nic_local")) {
    out["nic_local"] = summary["placement"]["nic_local"];
  }
  if (summary.contains("error") && summary["error"].is_string()) {
    std::string e = summary["error"].get<std::string>();
    if (e.size() > 1536) e = e.substr(0, 1536) + "...";
    out["error"] = e;
  }
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json config_from_args(const std::vector<std::string>& args) {
  nlohmann::json doc = nlohmann::json::object();
  std::vector<std::string> overrides;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::string value;
    bool has_value = false;
    if (auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      has_value = true;
    }
    if (flag.rfind("--", 0) != 0) throw ConfigError(flag, "unexpected argument");
    if (!has_value) {
      if (i + 1 >= args.size()) throw ConfigError(flag, "needs a value");
      value = args[++i];
    }
    if (flag == "--config") {
      doc = load_config_file(value);
    } else if (flag == "--set") {
      overrides.push_back(value);
    } else if (flag == "--threads" || flag == "--numa") {
      auto eq = value.find('=');
      if (eq == std::string::npos || eq == 0) {
        throw ConfigError(flag, "must look like STAGE=VALUE (got \"" + value + "\")");
      }
      std::string field = flag == "--threads" ? "threads" : "numa";
      std::string v = value.substr(eq + 1);
      if (field == "numa")
        v = nlohmann::json(v).dump(-1, ' ', false,
                                   nlohmann::json::error_handler_t::replace);  // always a string
      overrides.push_back("placement.stages." + value.substr(0, eq) + "." + field + "=" + v);
    } else if (auto it = shortcuts().find(flag); it != shortcuts().end()) {
      // String-valued fields stay strings even when they look like numbers.
      static const char* kStrings[] = {
          "endpoint",    "codec",          "source.kind",    "source.path",    "source.endpoint",
          "sink.kind",   "source.dataset", "source.dtype",   "sink.dataset",   "verify",
          "sink.path",   "sink.endpoint",  "placement.mode", "sink.layout",    "sink.instrument",
          "sink.source", "sink.sample",    "placement.nic",  "metrics.listen", "sysfs_root",
          "cgroup_root"};
      bool is_string = false;
      for (const char* s : kStrings) is_string = is_string || it->second == s;
      overrides.push_back(it->second + "=" +
                          (is_string ? nlohmann::json(value).dump(
                                           -1, ' ', false, nlohmann::json::error_handler_t::replace)
                                     : value));
    } else {
      throw ConfigError(flag, "unknown flag (see --help)");
    }
  }
  for (const auto& o : overrides) apply_override(doc, o);
  return doc;
}

}  // namespace numastream
