// What the configuration's parsers share (config.cpp, config_sinks.cpp): a JSON object walked
// field by field, and the parsers of one part each. Internal to them.
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "config/config.hpp"

namespace numastream::detail {

using json = nlohmann::json;

inline std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

inline std::string show(const json& v) {
  // Replace invalid UTF-8 (a config or --set value may hold any bytes) instead of throwing.
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Walks one JSON object: typed getters that name the field in every error, and a final check
// that no key was left unread (a typo is an error, not a silent default).
class Fields {
 public:
  Fields(const json& obj, std::string path) : obj_(obj), path_(std::move(path)) {
    if (!obj_.is_object()) {
      throw ConfigError(path_.empty() ? "<root>" : path_,
                        "must be an object (got " + show(obj_) + ")");
    }
  }

  bool has(const std::string& key) const { return obj_.contains(key); }
  std::string path(const std::string& key) const { return join(path_, key); }

  const json* raw(const std::string& key) {
    seen_.insert(key);
    auto it = obj_.find(key);
    return it == obj_.end() ? nullptr : &*it;
  }

  long long integer(const std::string& key, long long def, long long lo, long long hi) {
    const json* v = raw(key);
    if (!v) return def;
    if (!v->is_number_integer() || v->get<long long>() < lo || v->get<long long>() > hi) {
      throw ConfigError(path(key), "must be an integer from " + std::to_string(lo) + " to " +
                                       std::to_string(hi) + " (got " + show(*v) + ")");
    }
    return v->get<long long>();
  }

  double number(const std::string& key, double def, double lo, double hi) {
    const json* v = raw(key);
    if (!v) return def;
    if (!v->is_number() || v->get<double>() < lo || v->get<double>() > hi) {
      std::ostringstream msg;
      msg << "must be a number from " << lo << " to " << hi << " (got " << show(*v) << ")";
      throw ConfigError(path(key), msg.str());
    }
    return v->get<double>();
  }

  bool boolean(const std::string& key, bool def) {
    const json* v = raw(key);
    if (!v) return def;
    if (!v->is_boolean())
      throw ConfigError(path(key), "must be true or false (got " + show(*v) + ")");
    return v->get<bool>();
  }

  std::string string(const std::string& key, const std::string& def) {
    const json* v = raw(key);
    if (!v) return def;
    if (!v->is_string()) throw ConfigError(path(key), "must be a string (got " + show(*v) + ")");
    return v->get<std::string>();
  }

  std::string required_string(const std::string& key) {
    if (!has(key)) throw ConfigError(path(key), "is required");
    std::string s = string(key, "");
    if (s.empty()) throw ConfigError(path(key), "must not be empty");
    return s;
  }

  std::string choice(const std::string& key, const std::string& def,
                     const std::vector<std::string>& allowed) {
    std::string s = string(key, def);
    for (const auto& a : allowed) {
      if (s == a) return s;
    }
    std::string list;
    for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
    throw ConfigError(path(key), "must be one of " + list + " (got \"" + s + "\")");
  }

  void forbid(const std::string& key, const std::string& why) {
    if (has(key)) throw ConfigError(path(key), why);
    seen_.insert(key);
  }

  void finish() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (!seen_.count(it.key())) throw ConfigError(path(it.key()), "unknown field");
    }
  }

 private:
  const json& obj_;
  std::string path_;
  std::set<std::string> seen_;
};

// A list of 1 to 256 address blocks ("10.0.0.0/8", "192.0.2.7"), each checked.
std::vector<std::string> parse_address_blocks(const json& list, const std::string& path);
// `sink` (one consumer) or `sinks` (several) into c.sink and c.consumers.
void parse_sink(Fields& f, Config& c);

}  // namespace numastream::detail
