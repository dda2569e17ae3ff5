// The agent's shape, held as its sources change: no source file over 600 lines, no class with more
// than 20 fields (a class's own state is named with a trailing underscore, one declaration per
// line at its indentation). Functions over 80 lines are clang-tidy's (readability-function-size,
// agent/.clang-tidy).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace {

std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<std::filesystem::path> sources() {
  std::vector<std::filesystem::path> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(NUMASTREAM_SOURCES)) {
    const auto ext = e.path().extension();
    if (e.is_regular_file() && (ext == ".cpp" || ext == ".hpp")) out.push_back(e.path());
  }
  return out;
}

std::size_t indent(const std::string& l) { return l.find_first_not_of(' '); }

// The fields of each class or struct that opens on line `i` of `src`: lines at the body's
// indentation declaring names that end in '_' (`int a_ = 0, b_;`, `} counts_;` after a nested
// struct).
int fields_of(const std::vector<std::string>& src, std::size_t i) {
  const std::size_t body = indent(src[i]) + 2;
  const std::string close = std::string(body - 2, ' ') + "};";
  static const std::regex member(R"((\w+_)\s*(=[^,;]*|\{[^}]*\})?\s*[,;])");
  int n = 0;
  for (std::size_t j = i + 1; j < src.size() && src[j].rfind(close, 0) != 0; ++j) {
    const std::string& l = src[j];
    if (l.empty() || indent(l) != body || l.compare(body, 2, "//") == 0 ||
        l.compare(body, 6, "return") == 0 || l.find('(') < l.find("_;"))
      continue;
    const std::string code = l.substr(0, l.find("//"));
    for (auto it = std::sregex_iterator(code.begin(), code.end(), member);
         it != std::sregex_iterator(); ++it)
      ++n;
  }
  return n;
}

}  // namespace

TEST(Shape, NoAgentSourceFileIsOverSixHundredLines) {
  const auto all = sources();
  ASSERT_GT(all.size(), 50u) << NUMASTREAM_SOURCES;
  for (const auto& p : all) {
    EXPECT_LE(lines_of(p).size(), 600u) << p << ": split it into parts with one job each";
  }
}

TEST(Shape, NoClassHoldsMoreThanTwentyFields) {
  static const std::regex opens(R"(^\s*(class|struct) (\w+)( final)?( *:[^{]*)? *\{\s*$)");
  int classes = 0;
  for (const auto& p : sources()) {
    const auto src = lines_of(p);
    for (std::size_t i = 0; i < src.size(); ++i) {
      std::smatch m;
      if (!std::regex_match(src[i], m, opens)) continue;
      ++classes;
      EXPECT_LE(fields_of(src, i), 20) << p << ": " << m[2] << ": group its state into parts";
    }
  }
  EXPECT_GT(classes, 50);
}

TEST(Shape, TheFieldCounterCountsWhatAClassDeclares) {
  const std::vector<std::string> src = {"class A {",
                                        " public:",
                                        "  int f() { return x_; }",
                                        "  int a_ = 0, b_;",
                                        "  std::map<int, int> c_{};",
                                        "  struct Part {",
                                        "    int d_;",
                                        "  } part_;",
                                        "  // e_;",
                                        "};"};
  EXPECT_EQ(fields_of(src, 0), 4);  // a_, b_, c_, part_
}
