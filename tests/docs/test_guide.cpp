// docs/guide.md cannot drift from its programs: every C++ block in the guide names the program
// under examples/guide/ it is taken from and appears there verbatim (whole lines, in order);
// every program the guide names exists and is built and run as a test by examples/CMakeLists.txt.
// (The programs' output, which the guide shows too, is checked by the example_guide_* tests.)
#define BOOST_TEST_MODULE guide
#include <boost/test/unit_test.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

const std::string kRoot = std::string(HEADGRAD_TEST_DATA_DIR) + "/../..";

std::string read(const std::string& relative) {
  std::ifstream in(kRoot + "/" + relative, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(in, "cannot read " << relative);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Block {
  std::string marker;  // the comment line before the fence ("" when there is none)
  std::string fence;   // "```cpp", "```text", ...
  std::string text;    // the lines between the fences, each ending in '\n'
  int line = 0;        // the opening fence's line number
};

std::vector<Block> blocks_of(const std::string& markdown) {
  std::vector<Block> out;
  std::istringstream in(markdown);
  std::string line, previous;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.rfind("```", 0) == 0) {
      Block b{previous.rfind("<!--", 0) == 0 ? previous : "", line, "", number};
      while (std::getline(in, line) && (++number, line != "```")) b.text += line + "\n";
      out.push_back(b);
      previous.clear();
      continue;
    }
    previous = line;
  }
  return out;
}

// text with a newline in front, so that finding "\n" + lines matches whole lines only.
std::string after_newline(const std::string& text) {
  std::string out = "\n";
  out += text;
  return out;
}

// "<!-- code: examples/guide/guide_module.cpp -->" -> "examples/guide/guide_module.cpp"
std::string code_source(const std::string& marker) {
  const std::string head = "<!-- code: ", tail = " -->";
  if (marker.rfind(head, 0) != 0 || marker.size() < head.size() + tail.size() ||
      marker.compare(marker.size() - tail.size(), tail.size(), tail) != 0)
    return "";
  return marker.substr(head.size(), marker.size() - head.size() - tail.size());
}

// "<!-- output: guide_training (digits vary by CPU) -->" -> "guide_training"
std::string output_program(const std::string& marker) {
  const std::string head = "<!-- output: ";
  if (marker.rfind(head, 0) != 0) return "";
  const std::size_t end = marker.find_first_of(" -", head.size());
  return marker.substr(head.size(), end - head.size());
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_cpp_block_is_verbatim_code_of_a_guide_program) {
  const std::vector<Block> blocks = blocks_of(read("docs/guide.md"));
  int checked = 0;
  std::set<std::string> sources;
  for (const Block& b : blocks) {
    if (b.fence != "```cpp") continue;
    BOOST_TEST_CONTEXT("docs/guide.md line " << b.line) {
      const std::string source = code_source(b.marker);
      BOOST_TEST(source.rfind("examples/guide/", 0) == 0, "a ```cpp block must follow <!-- code: examples/guide/<file> -->");
      if (source.empty()) continue;
      const std::string code = after_newline(read(source));
      BOOST_TEST(code.find(after_newline(b.text)) != std::string::npos, "not verbatim in " << source << ":\n" << b.text);
      sources.insert(source);
      ++checked;
    }
  }
  BOOST_TEST(checked >= 8);
  for (const char* name : {"guide_module", "guide_attention", "guide_training", "guide_checkpoint"})
    BOOST_TEST(sources.count(std::string("examples/guide/") + name + ".cpp") == 1u, name << " is not shown");
}

BOOST_AUTO_TEST_CASE(every_output_block_names_a_program_the_tests_run) {
  const std::string cmake = read("examples/CMakeLists.txt");
  const std::string listed = cmake.substr(cmake.find("set(HEADGRAD_GUIDE_PROGRAMS"));
  int outputs = 0;
  for (const Block& b : blocks_of(read("docs/guide.md"))) {
    if (b.fence != "```text" || b.marker.empty()) continue;
    BOOST_TEST_CONTEXT("docs/guide.md line " << b.line) {
      const std::string program = output_program(b.marker);
      BOOST_TEST(!program.empty(), "unknown marker " << b.marker);
      BOOST_TEST(listed.substr(0, listed.find(')')).find(" " + program) != std::string::npos,
                 program << " is not in HEADGRAD_GUIDE_PROGRAMS");
      read("examples/guide/" + program + ".cpp");
      ++outputs;
    }
  }
  BOOST_TEST(outputs >= 4);
}

// The check itself: a block that is not in its file is found out.
BOOST_AUTO_TEST_CASE(a_changed_block_is_not_found_in_its_file) {
  const std::string code = after_newline(read("examples/guide/guide_module.cpp"));
  BOOST_TEST(code.find("\nint main() {\n") != std::string::npos);
  BOOST_TEST(code.find("\nint main()  {\n") == std::string::npos);
  BOOST_TEST(code_source("<!-- code: examples/guide/guide_module.cpp -->") == "examples/guide/guide_module.cpp");
  BOOST_TEST(output_program("<!-- output: guide_training (digits vary by CPU) -->") == "guide_training");
  BOOST_TEST(output_program("<!-- output: guide_module -->") == "guide_module");
}
