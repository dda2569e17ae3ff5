// The metrics registry: what a scrape writes (Prometheus text format 0.0.4), and the declarations
// it refuses.
#include "obs/registry.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "obs/metric_catalog.hpp"

namespace numastream {
namespace {

TEST(MetricRegistry, WritesHelpTypeAndSamplesWithItsOwnLabelsFirst) {
  MetricRegistry m({{"role", "send"}});
  double chunks = 3;
  m.counter("numastream_chunks_total", "Chunks.", [&] { return chunks; });
  m.add("numastream_depth", MetricType::gauge, "Items in a queue.", [](MetricSamples& s) {
    s.add({{"queue", "raw"}}, 1);
    s.add({{"queue", "wire"}}, 2.5);
  });
  EXPECT_EQ(m.text(),
            "# HELP numastream_chunks_total Chunks.\n"
            "# TYPE numastream_chunks_total counter\n"
            "numastream_chunks_total{role=\"send\"} 3\n"
            "# HELP numastream_depth Items in a queue.\n"
            "# TYPE numastream_depth gauge\n"
            "numastream_depth{role=\"send\",queue=\"raw\"} 1\n"
            "numastream_depth{role=\"send\",queue=\"wire\"} 2.5\n");
  chunks = 12345678901234.0;  // read at each scrape, written exactly
  EXPECT_NE(m.text().find("numastream_chunks_total{role=\"send\"} 12345678901234\n"),
            std::string::npos);
}

TEST(MetricRegistry, EscapesLabelValuesAndHelpAndSpellsNonFiniteValuesAsPrometheusDoes) {
  MetricRegistry m;
  m.add("numastream_gaps", MetricType::gauge, "A help text with a \\ and a\nnewline.",
        [](MetricSamples& s) {
          s.add({{"gap", "stream 0: \"chunks\" 1-2\\3\nnext"}},
                std::numeric_limits<double>::quiet_NaN());
          s.add({{"gap", "b"}}, std::numeric_limits<double>::infinity());
          s.add({{"gap", "c"}}, -std::numeric_limits<double>::infinity());
        });
  EXPECT_EQ(m.text(),
            "# HELP numastream_gaps A help text with a \\\\ and a\\nnewline.\n"
            "# TYPE numastream_gaps gauge\n"
            "numastream_gaps{gap=\"stream 0: \\\"chunks\\\" 1-2\\\\3\\nnext\"} NaN\n"
            "numastream_gaps{gap=\"b\"} +Inf\n"
            "numastream_gaps{gap=\"c\"} -Inf\n");
}

TEST(MetricRegistry, LeavesOutAFamilyWithNoSamples) {
  MetricRegistry m;
  m.add("numastream_gaps_last", MetricType::gauge, "The last gaps.", [](MetricSamples&) {});
  m.gauge("numastream_up", "Up.", [] { return 1; });
  EXPECT_EQ(m.text(), "# HELP numastream_up Up.\n# TYPE numastream_up gauge\nnumastream_up 1\n");
  ASSERT_EQ(m.families().size(), 2u);
  EXPECT_EQ(m.families()[0].name, "numastream_gaps_last");
}

TEST(MetricRegistry, RefusesWhatAScraperWouldMisreadNamingTheMetric) {
  MetricRegistry m({{"role", "receive"}});
  m.gauge("numastream_up", "Up.", [] { return 1; });
  auto refused = [&](auto declare, const std::string& says) {
    try {
      declare();
      ADD_FAILURE() << "accepted; wanted an error saying: " << says;
    } catch (const std::logic_error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused([&] { m.gauge("numastream_up", "Again.", [] { return 0; }); },
          "numastream_up is declared twice");
  refused([&] { m.gauge("numastream_no_help", "", [] { return 0; }); },
          "numastream_no_help has no help text");
  refused([&] { m.counter("numastream_chunks", "Chunks.", [] { return 0; }); },
          "a counter's name ends in _total");
  refused([&] { m.gauge("numastream_chunks_total", "Chunks.", [] { return 0; }); },
          "ending in _total is a counter's");
  refused([&] { m.gauge("numastream-bad", "Bad.", [] { return 0; }); },
          "'numastream-bad' is not a Prometheus metric name");
  refused([&] { m.gauge("9numastream", "Bad.", [] { return 0; }); },
          "not a Prometheus metric name");
  refused([] { MetricRegistry bad({{"ro le", "x"}}); }, "label name 'ro le'");

  // A label is checked when written: the first scrape finds it.
  MetricRegistry bad_label({{"role", "receive"}});
  bad_label.add("numastream_a", MetricType::gauge, "A.", [](MetricSamples& s) {
    s.add({{"__reserved", "x"}}, 1);
  });
  refused([&] { (void)bad_label.text(); }, "numastream_a: label name '__reserved'");
  MetricRegistry own_label({{"role", "receive"}});
  own_label.add("numastream_b", MetricType::gauge, "B.", [](MetricSamples& s) {
    s.add({{"role", "send"}}, 1);
  });
  refused([&] { (void)own_label.text(); }, "label 'role' is the registry's own");
}

// A family may be declared while another thread scrapes (the adaptive controller declares its
// families once it starts, after the metrics server).
TEST(MetricRegistry, DeclaringWhileScrapingIsSafe) {
  MetricRegistry m({{"role", "send"}});
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (!done) (void)m.text();
  });
  for (int i = 0; i < 500; ++i)
    m.gauge("numastream_g" + std::to_string(i), "G.", [i] { return i; });
  done = true;
  scraper.join();
  EXPECT_EQ(m.families().size(), 500u);
  EXPECT_NE(m.text().find("numastream_g499{role=\"send\"} 499\n"), std::string::npos);
}

// Every family the agent writes is declared once, in the catalog: the registry takes it whole
// (name, type, help), the sources name no metric themselves, and the user docs describe exactly
// the catalog's families.
TEST(MetricCatalog, IsEveryMetricTheAgentWritesAndWhatItsDocsDescribe) {
  std::set<std::string> names;
  for (const MetricDef* d : metric::kAll) {
    EXPECT_TRUE(names.insert(std::string(d->name)).second) << d->name << " declared twice";
    MetricRegistry m;
    EXPECT_NO_THROW(m.add(*d, [](MetricSamples& s) { s.add(1); })) << d->name;
  }
  MetricRegistry m;
  EXPECT_THROW(m.gauge(metric::raw_bytes, [] { return 0.0; }), std::logic_error);
  EXPECT_THROW(m.counter(metric::queue_depth, [] { return 0.0; }), std::logic_error);

  const std::regex literal("\"numastream_[a-z0-9_]+\"");
  for (const auto& e : std::filesystem::recursive_directory_iterator(NUMASTREAM_SOURCES)) {
    if (!e.is_regular_file() || e.path().filename() == "metric_catalog.hpp") continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string src = text.str();
    EXPECT_FALSE(std::regex_search(src, literal))
        << e.path() << " names a metric: declare it in obs/metric_catalog.hpp";
  }

  std::ifstream doc(std::string(NUMASTREAM_DOCS) + "/agent-metrics.md");
  ASSERT_TRUE(doc) << "docs/agent-metrics.md";
  std::stringstream text;
  text << doc.rdbuf();
  const std::string md = text.str();
  const std::regex documented("numastream_[a-z0-9_]+");
  std::set<std::string> in_docs;
  for (auto it = std::sregex_iterator(md.begin(), md.end(), documented);
       it != std::sregex_iterator(); ++it)
    in_docs.insert(it->str());
  EXPECT_EQ(in_docs, names) << "docs/agent-metrics.md and obs/metric_catalog.hpp differ";
}

}  // namespace
}  // namespace numastream
