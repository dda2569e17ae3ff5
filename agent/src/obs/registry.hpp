// The agent's metrics, declared once and read at each scrape: a family is a name, a type and a
// help text (all required), and a function that reads its samples from the pipeline's counters
// when /metrics is asked. The registry writes the Prometheus text format (0.0.4): one HELP and one
// TYPE line per family, its labels escaped, the registry's own labels (role="send") on every
// sample. A family declared twice, a counter not named `_total`, an empty help text, or a label
// name Prometheus would refuse is a programming error: it throws std::logic_error when declared
// (or, for a label, when first written), so a test that scrapes once finds it.
#pragma once

#include <functional>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace numastream {

enum class MetricType { counter, gauge };
const char* metric_type_name(MetricType t);

// A metric family as the catalog declares it (obs/metric_catalog.hpp).
struct MetricDef {
  std::string_view name;
  MetricType type;
  std::string_view help;
};

// Labels of one sample beyond the registry's own, in the order they are written.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// What a family's reader writes at a scrape: zero or more samples. A family with none is left out
// of the text.
class MetricSamples {
 public:
  void add(double value) { samples_.push_back({{}, value}); }
  void add(MetricLabels labels, double value) { samples_.push_back({std::move(labels), value}); }

 private:
  friend class MetricRegistry;
  std::vector<std::pair<MetricLabels, double>> samples_;
};

class MetricRegistry {
 public:
  using Read = std::function<void(MetricSamples&)>;
  // `common`: the labels every sample carries, first.
  MetricRegistry() = default;
  explicit MetricRegistry(MetricLabels common);
  MetricRegistry(std::initializer_list<MetricLabels::value_type> common)
      : MetricRegistry(MetricLabels(common)) {}
  MetricRegistry(const MetricRegistry&) = delete;
  MetricRegistry& operator=(const MetricRegistry&) = delete;

  // Declares a family. May be called while another thread scrapes; `read` must stay callable for
  // as long as the registry can be scraped.
  void add(std::string name, MetricType type, std::string help, Read read);
  // A family of the catalog; counter() and gauge() refuse a family of the other type.
  void add(const MetricDef& def, Read read);
  void counter(const MetricDef& def, std::function<double()> value);
  void gauge(const MetricDef& def, std::function<double()> value);
  // A family of one sample without labels of its own.
  void counter(std::string name, std::string help, std::function<double()> value);
  void gauge(std::string name, std::string help, std::function<double()> value);

  // The exposition, families in the order they were declared.
  std::string text() const;

  struct Family {
    std::string name;
    MetricType type;
    std::string help;
  };
  std::vector<Family> families() const;

 private:
  struct Entry {
    Family family;
    Read read;
  };
  MetricLabels common_;
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

// A Prometheus label value, escaped (backslash, double quote, newline).
std::string escape_label_value(const std::string& v);

}  // namespace numastream
