#include "obs/registry.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace numastream {
namespace {

bool name_char(char c, bool first, bool colon) {
  const bool alpha =
      (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
  return alpha || (!first && c >= '0' && c <= '9');
}

bool valid_name(const std::string& n, bool colon) {
  if (n.empty()) return false;
  for (std::size_t i = 0; i < n.size(); ++i) {
    if (!name_char(n[i], i == 0, colon)) return false;
  }
  return true;
}

void check_label_name(const std::string& family, const std::string& n) {
  if (!valid_name(n, false) || n.rfind("__", 0) == 0) {
    throw std::logic_error("metric " + family + ": label name '" + n +
                           "' is not a Prometheus label name");
  }
}

// HELP text: backslash and newline escaped.
std::string escape_help(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void write_labels(std::string& out, const std::string& family, const MetricLabels& common,
                  const MetricLabels& own) {
  if (common.empty() && own.empty()) return;
  out += '{';
  bool first = true;
  for (const auto* set : {&common, &own}) {
    for (const auto& [k, v] : *set) {
      if (set == &own) {
        check_label_name(family, k);
        for (const auto& [ck, cv] : common) {
          if (ck == k)
            throw std::logic_error("metric " + family + ": label '" + k +
                                   "' is the registry's own");
        }
      }
      if (!first) out += ',';
      first = false;
      out += k;
      out += "=\"";
      out += escape_label_value(v);
      out += '"';
    }
  }
  out += '}';
}

// A sample value as Prometheus reads it (+Inf, -Inf, NaN spelled its way).
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char num[64];
  std::snprintf(num, sizeof num, "%.17g", v);
  return num;
}

}  // namespace

const char* metric_type_name(MetricType t) {
  return t == MetricType::counter ? "counter" : "gauge";
}

std::string escape_label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

MetricRegistry::MetricRegistry(MetricLabels common) : common_(std::move(common)) {
  for (const auto& [k, v] : common_) check_label_name("registry", k);
}

void MetricRegistry::add(std::string name, MetricType type, std::string help, Read read) {
  if (!valid_name(name, true))
    throw std::logic_error("metric '" + name + "' is not a Prometheus metric name");
  if (help.empty()) throw std::logic_error("metric " + name + " has no help text");
  const bool total = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
  if ((type == MetricType::counter) != total) {
    throw std::logic_error(
        "metric " + name +
        (total ? ": a name ending in _total is a counter's" : ": a counter's name ends in _total"));
  }
  std::lock_guard lock(mu_);
  for (const auto& e : entries_) {
    if (e.family.name == name) throw std::logic_error("metric " + name + " is declared twice");
  }
  entries_.push_back({{std::move(name), type, std::move(help)}, std::move(read)});
}

void MetricRegistry::counter(std::string name, std::string help, std::function<double()> value) {
  add(std::move(name), MetricType::counter, std::move(help),
      [value = std::move(value)](MetricSamples& s) { s.add(value()); });
}

void MetricRegistry::gauge(std::string name, std::string help, std::function<double()> value) {
  add(std::move(name), MetricType::gauge, std::move(help),
      [value = std::move(value)](MetricSamples& s) { s.add(value()); });
}

void MetricRegistry::add(const MetricDef& def, Read read) {
  add(std::string(def.name), def.type, std::string(def.help), std::move(read));
}

void MetricRegistry::counter(const MetricDef& def, std::function<double()> value) {
  if (def.type != MetricType::counter)
    throw std::logic_error("metric " + std::string(def.name) + " is not a counter");
  counter(std::string(def.name), std::string(def.help), std::move(value));
}

void MetricRegistry::gauge(const MetricDef& def, std::function<double()> value) {
  if (def.type != MetricType::gauge)
    throw std::logic_error("metric " + std::string(def.name) + " is not a gauge");
  gauge(std::string(def.name), std::string(def.help), std::move(value));
}

std::string MetricRegistry::text() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& e : entries_) {
    MetricSamples samples;
    e.read(samples);
    if (samples.samples_.empty()) continue;
    const Family& f = e.family;
    out += "# HELP " + f.name + " " + escape_help(f.help) + "\n";
    out += "# TYPE " + f.name + " " + metric_type_name(f.type) + "\n";
    for (const auto& [labels, value] : samples.samples_) {
      out += f.name;
      write_labels(out, f.name, common_, labels);
      out += ' ';
      out += number(value);
      out += '\n';
    }
  }
  return out;
}

std::vector<MetricRegistry::Family> MetricRegistry::families() const {
  std::lock_guard lock(mu_);
  std::vector<Family> out;
  for (const auto& e : entries_) out.push_back(e.family);
  return out;
}

}  // namespace numastream
