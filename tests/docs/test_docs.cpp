// The docs cannot drift from the code unnoticed: every repository path that README.md, a
// docs/*.md page or a code comment names exists; every ag::, autograd:: and nn:: name the docs
// use is declared in the public headers; the README stays a page, links every doc, and its C++
// blocks are code that is compiled and run (the engine example below, examples/nn_quickstart).
// Each failure names the file, the line and what is missing.
#define BOOST_TEST_MODULE docs
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <autograd/autograd.hpp>
namespace ag = autograd;

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = fs::path(HEADGRAD_TEST_DATA_DIR) / ".." / "..";

std::string read(const fs::path& relative) {
  std::ifstream in(kRoot / relative, std::ios::binary);
  BOOST_REQUIRE_MESSAGE(in, "cannot read " << relative.generic_string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// README.md and every docs/*.md, as paths relative to the root.
std::vector<std::string> markdown_docs() {
  std::vector<std::string> out = {"README.md"};
  for (const auto& e : fs::directory_iterator(kRoot / "docs"))
    if (e.path().extension() == ".md") out.push_back("docs/" + e.path().filename().string());
  std::sort(out.begin() + 1, out.end());
  return out;
}

// `*` matches any run of characters within one path component.
bool wildcard_match(std::string_view pattern, std::string_view name) {
  if (pattern.empty()) return name.empty();
  if (pattern[0] == '*')
    for (std::size_t skip = 0; skip <= name.size(); ++skip)
      if (wildcard_match(pattern.substr(1), name.substr(skip))) return true;
  return !name.empty() && pattern[0] == name[0] && wildcard_match(pattern.substr(1), name.substr(1));
}

// Whether `relative` names a file or folder, `*` matching within one path component (as in
// tests/*/test_double_backward_*.cpp).
bool pattern_exists(const std::string& relative) {
  std::vector<fs::path> here{kRoot};
  std::size_t begin = 0;
  while (begin < relative.size()) {
    std::size_t end = relative.find('/', begin);
    if (end == std::string::npos) end = relative.size();
    const std::string part = relative.substr(begin, end - begin);
    begin = end + 1;
    if (part.empty()) continue;
    std::vector<fs::path> found;
    for (const fs::path& d : here) {
      if (part.find('*') == std::string::npos) {
        if (fs::exists(d / part)) found.push_back(d / part);
      } else if (fs::is_directory(d)) {
        for (const auto& e : fs::directory_iterator(d))
          if (wildcard_match(part, e.path().filename().string())) found.push_back(e.path());
      }
    }
    if (found.empty()) return false;
    here = std::move(found);
  }
  return true;
}

// A path as docs write it: from the root (`autograd/src/walk.cpp`), from a library's folder
// (`src/walk.cpp`, `include/autograd/tensor.hpp`), as an include (`nn/hooks.hpp`), or an
// example's name without its `.cpp` (`examples/curvature`).
bool path_resolves(std::string path) {
  while (!path.empty() && path.back() == '/') path.pop_back();
  for (const char* base : {"", "autograd/", "nn/", "autograd/include/", "nn/include/"})
    for (const char* suffix : {"", ".cpp"})
      if (pattern_exists(base + path + suffix)) return true;
  return false;
}

// Paths of other projects that the text names as such.
const std::set<std::string> kOtherProjectsPaths = {
    "tests/kat_vectors",  // Random123's known-answer file (tests/kernels/test_philox.cpp)
};

bool is_path_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' || c == '*' || c == '-';
}

// The repository paths named on one line: a word starting with one of the top-level folders
// (or a library's src/ or include/) and a slash, not itself part of a longer path or name.
std::vector<std::string> paths_in(const std::string& line) {
  static const char* const kPrefixes[] = {"autograd/", "nn/",    "examples/", "tests/", "docs/", "benchmarks/",
                                          "scripts/",  "fuzz/",  "cmake/",    "src/",   "include/", ".ci/"};
  std::vector<std::string> out;
  for (const char* prefix : kPrefixes) {
    const std::string_view p(prefix);
    for (std::size_t i = line.find(p); i != std::string::npos; i = line.find(p, i + 1)) {
      if (i > 0) {
        const char before = line[i - 1];
        if (is_path_char(before) || before == ':' || before == '<' || before == '@') continue;
      }
      std::size_t end = i;
      while (end < line.size() && is_path_char(line[end])) ++end;
      if (end < line.size() && line[end] == '<') continue;  // a placeholder: tests/data/mha_<config>.txt
      std::string path = line.substr(i, end - i);
      while (!path.empty() && (path.back() == '.' || path.back() == '-')) path.pop_back();  // end of a sentence
      if (path.size() <= p.size()) continue;  // the folder alone: "nn/", "autograd/"
      out.push_back(path);
    }
  }
  return out;
}

// "file:line: what" for every path that `text` names and the tree lacks. With comments_only, only
// the part of each line after `//` is read (code files).
std::vector<std::string> missing_paths(const std::string& file, const std::string& text, bool comments_only) {
  std::vector<std::string> out;
  const std::vector<std::string> lines = lines_of(text);
  for (std::size_t n = 0; n < lines.size(); ++n) {
    std::string line = lines[n];
    if (comments_only) {
      const std::size_t comment = line.find("//");
      if (comment == std::string::npos) continue;
      line = line.substr(comment + 2);
    }
    for (const std::string& path : paths_in(line))
      if (!kOtherProjectsPaths.count(path) && !path_resolves(path))
        out.push_back(file + ":" + std::to_string(n + 1) + ": names `" + path + "`, which does not exist");
  }
  return out;
}

bool is_word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// The name of every file in the repository (build directories and .git left out).
std::set<std::string> repository_file_names() {
  std::set<std::string> names;
  for (auto it = fs::recursive_directory_iterator(kRoot); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name.rfind("build", 0) == 0 || name == ".git")) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) names.insert(name);
  }
  return names;
}

// Files of other projects, or that a command writes, which texts name by their bare names.
const std::set<std::string> kOtherFileNames = {
    "sample.py",     // nanoGPT's (examples/char_gpt/sample.hpp)
    "gemm_libs.md",  // what docs/gemm_choice.md's command writes
};

// "file:line: what" for every bare file name (`walk.cpp`, `gemm_avx*.cpp`, `guide.md`: a word
// ending in .cpp, .hpp, .md, .sh, .py or .cmake that is not part of a path) that names no file
// of the repository. With comments_only, only the part of each line after `//` is read.
std::vector<std::string> missing_file_names(const std::string& file, const std::string& text, bool comments_only,
                                            const std::set<std::string>& names) {
  static const char* const kExtensions[] = {".cpp", ".hpp", ".md", ".sh", ".py", ".cmake"};
  std::vector<std::string> out;
  const std::vector<std::string> lines = lines_of(text);
  for (std::size_t n = 0; n < lines.size(); ++n) {
    std::string line = lines[n];
    if (comments_only) {
      const std::size_t comment = line.find("//");
      if (comment == std::string::npos) continue;
      line = line.substr(comment + 2);
    }
    for (std::size_t i = 0; i < line.size();) {
      if (!(is_word_char(line[i]) || line[i] == '*' || line[i] == '-') ||
          (i > 0 && (is_path_char(line[i - 1]) || line[i - 1] == '<'))) {
        ++i;
        continue;
      }
      std::size_t end = i;
      while (end < line.size() && (is_word_char(line[end]) || line[end] == '*' || line[end] == '-')) ++end;
      std::string found;
      for (const char* ext : kExtensions) {
        const std::string_view e(ext);
        if (line.compare(end, e.size(), e) == 0 &&
            (end + e.size() == line.size() || !is_word_char(line[end + e.size()]))) {
          found = line.substr(i, end - i) + ext;
          end += e.size();
        }
      }
      if (!found.empty() && !kOtherFileNames.count(found) &&
          std::none_of(names.begin(), names.end(), [&](const std::string& name) { return wildcard_match(found, name); }))
        out.push_back(file + ":" + std::to_string(n + 1) + ": names `" + found + "`, but no file of that name exists");
      i = end;
    }
  }
  return out;
}

// Source text without its comments (// and /* */), so a name only a comment mentions is not
// taken for a declaration.
std::string without_comments(const std::string& code) {
  std::string out;
  for (std::size_t i = 0; i < code.size(); ++i) {
    if (code.compare(i, 2, "//") == 0) {
      i = code.find('\n', i);
      if (i == std::string::npos) break;
    } else if (code.compare(i, 2, "/*") == 0) {
      i = code.find("*/", i + 2);
      if (i == std::string::npos) break;
      ++i;
      continue;
    }
    out += code[i];
  }
  return out;
}

// Every identifier in the installed headers' code (autograd/include, nn/include).
std::set<std::string> public_header_words() {
  std::set<std::string> words;
  for (const char* dir : {"autograd/include", "nn/include"})
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
      if (e.path().extension() != ".hpp") continue;
      const std::string code = without_comments(read(fs::relative(e.path(), kRoot)));
      for (std::size_t i = 0; i < code.size();) {
        if (!is_word_char(code[i])) {
          ++i;
          continue;
        }
        std::size_t end = i;
        while (end < code.size() && is_word_char(code[end])) ++end;
        words.insert(code.substr(i, end - i));
        i = end;
      }
    }
  return words;
}

// "file:line: what" for every ag::, autograd:: or nn:: name (each part of a qualified name:
// nn::study::zero_ablate_head, nn::AttentionOptions::need_weights) that no public header
// declares. torch::nn::... is PyTorch's and left alone.
std::vector<std::string> undeclared_names(const std::string& file, const std::string& text,
                                          const std::set<std::string>& declared) {
  std::vector<std::string> out;
  const std::vector<std::string> lines = lines_of(text);
  for (std::size_t n = 0; n < lines.size(); ++n) {
    const std::string& line = lines[n];
    for (const char* ns : {"ag::", "autograd::", "nn::"}) {
      const std::string_view p(ns);
      for (std::size_t i = line.find(p); i != std::string::npos; i = line.find(p, i + 1)) {
        if (i > 0 && (is_word_char(line[i - 1]) || line[i - 1] == ':' || line[i - 1] == '.')) continue;
        std::size_t at = i + p.size();
        std::string qualified(p.substr(0, p.size() - 2));
        while (true) {
          std::size_t end = at;
          while (end < line.size() && is_word_char(line[end])) ++end;
          if (end == at) break;
          const std::string part = line.substr(at, end - at);
          qualified += "::" + part;
          if (!declared.count(part))
            out.push_back(file + ":" + std::to_string(n + 1) + ": names `" + qualified + "`, but no public header declares `" +
                          part + "`");
          if (line.compare(end, 2, "::") != 0) break;
          at = end + 2;
        }
      }
    }
  }
  return out;
}

struct Block {
  std::string marker;  // the line before the opening fence
  std::string fence;   // "```cpp", ...
  std::vector<std::string> lines;
  int line = 0;  // the opening fence's line number
};

std::vector<Block> blocks_of(const std::string& markdown) {
  std::vector<Block> out;
  const std::vector<std::string> lines = lines_of(markdown);
  for (std::size_t n = 0; n < lines.size(); ++n) {
    if (lines[n].rfind("```", 0) != 0) continue;
    Block b{n > 0 ? lines[n - 1] : "", lines[n], {}, static_cast<int>(n + 1)};
    for (++n; n < lines.size() && lines[n] != "```"; ++n) b.lines.push_back(lines[n]);
    out.push_back(b);
  }
  return out;
}

std::string trimmed(const std::string& s) {
  const std::size_t first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// The first line of `block` (trimmed, blank lines skipped) that is not found in `source` after
// the lines before it; empty when every line is there, in order.
std::string first_line_not_in(const std::vector<std::string>& block, const std::string& source) {
  const std::vector<std::string> code = lines_of(source);
  std::size_t at = 0;
  for (const std::string& line : block) {
    const std::string want = trimmed(line);
    if (want.empty()) continue;
    while (at < code.size() && trimmed(code[at]) != want) ++at;
    if (at == code.size()) return want;
    ++at;
  }
  return "";
}

// "<!-- code: examples/nn_quickstart.cpp -->" -> "examples/nn_quickstart.cpp"
std::string code_source(const std::string& marker) {
  const std::string head = "<!-- code: ", tail = " -->";
  if (marker.rfind(head, 0) != 0 || marker.size() < head.size() + tail.size() ||
      marker.compare(marker.size() - tail.size(), tail.size(), tail) != 0)
    return "";
  return marker.substr(head.size(), marker.size() - head.size() - tail.size());
}

// GitHub's anchor of a heading: lower case, spaces as '-', punctuation dropped (letters beyond
// ASCII kept).
std::string anchor_of(const std::string& heading) {
  std::string out;
  for (const char c : heading) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80 || std::isalnum(u) || c == '-' || c == '_') out += static_cast<char>(std::tolower(u));
    else if (c == ' ') out += '-';
  }
  return out;
}

// The anchors of a markdown file's headings (those in code blocks left out).
std::set<std::string> anchors_of(const std::string& markdown) {
  std::set<std::string> out;
  bool in_code = false;
  for (const std::string& line : lines_of(markdown)) {
    if (line.rfind("```", 0) == 0) in_code = !in_code;
    if (in_code || line.empty() || line[0] != '#') continue;
    const std::size_t text = line.find_first_not_of('#');
    if (text == std::string::npos || line[text] != ' ') continue;
    out.insert(anchor_of(trimmed(line.substr(text + 1))));
  }
  return out;
}

// "file:line: what" for every markdown link of `doc` to a file of the repository that does not
// exist, or to a heading (#anchor) that the file lacks. Links to web pages are left alone.
std::vector<std::string> broken_links(const std::string& doc, const std::string& text) {
  std::vector<std::string> out;
  const fs::path dir = fs::path(doc).parent_path();
  const std::vector<std::string> lines = lines_of(text);
  for (std::size_t n = 0; n < lines.size(); ++n) {
    const std::string& line = lines[n];
    for (std::size_t i = line.find("]("); i != std::string::npos; i = line.find("](", i + 2)) {
      const std::size_t end = line.find(')', i + 2);
      if (end == std::string::npos) break;
      const std::string target = line.substr(i + 2, end - i - 2);
      if (target.empty() || target.find("://") != std::string::npos || target.rfind("mailto:", 0) == 0 ||
          target.find(' ') != std::string::npos)
        continue;
      const std::size_t hash = target.find('#');
      const std::string file = target.substr(0, hash);
      const std::string relative = file.empty() ? doc : (dir / file).lexically_normal().generic_string();
      const std::string where = doc + ":" + std::to_string(n + 1) + ": the link to `" + target + "`";
      if (!fs::exists(kRoot / relative)) {
        out.push_back(where + " leads to no file");
        continue;
      }
      if (hash == std::string::npos) continue;
      if (fs::path(relative).extension() != ".md" || !anchors_of(read(relative)).count(target.substr(hash + 1)))
        out.push_back(where + " leads to no heading of " + relative);
    }
  }
  return out;
}

std::string joined(const std::vector<std::string>& problems) {
  std::string out;
  for (const std::string& p : problems) out += "\n  " + p;
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_path_the_docs_name_exists) {
  std::vector<std::string> problems;
  for (const std::string& doc : markdown_docs()) {
    const std::vector<std::string> found = missing_paths(doc, read(doc), false);
    problems.insert(problems.end(), found.begin(), found.end());
  }
  BOOST_TEST(problems.empty(), problems.size() << " missing path(s):" << joined(problems));
}

BOOST_AUTO_TEST_CASE(every_path_a_code_comment_names_exists) {
  std::vector<std::string> problems;
  int files = 0;
  for (const char* dir : {"autograd", "nn", "examples", "tests", "benchmarks", "fuzz"})
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".h") continue;
      const std::string file = fs::relative(e.path(), kRoot).generic_string();
      if (file == "tests/docs/test_docs.cpp") continue;  // its negative controls name missing paths on purpose
      const std::vector<std::string> found = missing_paths(file, read(file), true);
      problems.insert(problems.end(), found.begin(), found.end());
      ++files;
    }
  BOOST_TEST(files > 100);
  BOOST_TEST(problems.empty(), problems.size() << " missing path(s):" << joined(problems));
}

BOOST_AUTO_TEST_CASE(every_file_name_the_docs_and_code_comments_mention_exists) {
  const std::set<std::string> names = repository_file_names();
  BOOST_TEST(names.count("walk.cpp") == 1u);
  std::vector<std::string> problems;
  for (const std::string& doc : markdown_docs()) {
    const std::vector<std::string> found = missing_file_names(doc, read(doc), false, names);
    problems.insert(problems.end(), found.begin(), found.end());
  }
  for (const char* dir : {"autograd", "nn", "examples", "tests", "benchmarks", "fuzz"})
    for (const auto& e : fs::recursive_directory_iterator(kRoot / dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".hpp") continue;
      const std::string file = fs::relative(e.path(), kRoot).generic_string();
      if (file == "tests/docs/test_docs.cpp") continue;
      const std::vector<std::string> found = missing_file_names(file, read(file), true, names);
      problems.insert(problems.end(), found.begin(), found.end());
    }
  BOOST_TEST(problems.empty(), problems.size() << " missing file(s):" << joined(problems));
}

BOOST_AUTO_TEST_CASE(every_link_between_the_docs_leads_to_a_file_and_heading) {
  std::vector<std::string> problems;
  for (const std::string& doc : markdown_docs()) {
    const std::vector<std::string> found = broken_links(doc, read(doc));
    problems.insert(problems.end(), found.begin(), found.end());
  }
  BOOST_TEST(problems.empty(), problems.size() << " broken link(s):" << joined(problems));
}

BOOST_AUTO_TEST_CASE(every_ag_and_nn_name_in_the_docs_is_declared_in_a_public_header) {
  const std::set<std::string> declared = public_header_words();
  BOOST_TEST(declared.count("MultiHeadAttention") == 1u);
  std::vector<std::string> problems;
  for (const std::string& doc : markdown_docs()) {
    const std::vector<std::string> found = undeclared_names(doc, read(doc), declared);
    problems.insert(problems.end(), found.begin(), found.end());
  }
  BOOST_TEST(problems.empty(), problems.size() << " undeclared name(s):" << joined(problems));
}

// A kernel compiled per instruction set is a file of its own with its own -m flags; the two
// places that explain why such files share no inline code list them all.
BOOST_AUTO_TEST_CASE(every_instruction_set_variant_file_is_named_in_isa_hpp_and_design_md) {
  const std::string isa = read("autograd/src/kernels/isa.hpp"), design = read("docs/design.md");
  int variants = 0;
  for (const auto& e : fs::directory_iterator(kRoot / "autograd/src/kernels")) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".cpp" ||
        (name.find("_avx2.") == std::string::npos && name.find("_avx512.") == std::string::npos))
      continue;
    BOOST_TEST(isa.find(name) != std::string::npos, "autograd/src/kernels/isa.hpp does not name " << name);
    BOOST_TEST(design.find("`" + name + "`") != std::string::npos, "docs/design.md does not name " << name);
    ++variants;
  }
  BOOST_TEST(variants >= 6);
}

// The seam of docs/design.md: the op files reach the speed code through the headers of
// autograd/src/kernels/, and no kernel includes an op file, so a reader can skip the kernels.
BOOST_AUTO_TEST_CASE(no_kernel_includes_an_op_file) {
  int files = 0;
  for (const auto& e : fs::directory_iterator(kRoot / "autograd/src/kernels")) {
    const std::string name = e.path().filename().string();
    const std::string text = read("autograd/src/kernels/" + name);
    BOOST_TEST(text.find("#include \"ops/") == std::string::npos,
               "autograd/src/kernels/" << name << " includes a file of autograd/src/ops/");
    ++files;
  }
  BOOST_TEST(files >= 20);
}

BOOST_AUTO_TEST_CASE(readme_is_a_page_of_at_most_200_lines) {
  const std::size_t lines = lines_of(read("README.md")).size();
  BOOST_TEST(lines <= 200u, "README.md has " << lines << " lines; measurements belong in docs/benchmarks.md");
}

BOOST_AUTO_TEST_CASE(readme_links_every_doc) {
  const std::string readme = read("README.md");
  for (const std::string& doc : markdown_docs())
    if (doc != "README.md")
      BOOST_TEST(readme.find("](" + doc + ")") != std::string::npos, "README.md does not link " << doc);
}

// docs/circuits.md's study is a program that CI builds and runs: its block is that file's code.
BOOST_AUTO_TEST_CASE(the_circuits_study_block_is_code_that_is_built) {
  int checked = 0;
  for (const Block& b : blocks_of(read("docs/circuits.md"))) {
    const std::string source = code_source(b.marker);
    if (b.fence != "```cpp" || source.empty()) continue;
    const std::string missing = first_line_not_in(b.lines, read(source));
    BOOST_TEST(missing.empty(), "docs/circuits.md:" << b.line << ": the line `" << missing << "` is not in " << source);
    ++checked;
  }
  BOOST_TEST(checked >= 1, "docs/circuits.md shows no block of a built program");
}

BOOST_AUTO_TEST_CASE(every_cpp_block_of_the_readme_is_code_that_is_built) {
  int checked = 0;
  for (const Block& b : blocks_of(read("README.md"))) {
    if (b.fence != "```cpp") continue;
    const std::string source = code_source(b.marker);
    BOOST_TEST(!source.empty(), "README.md:" << b.line << ": a ```cpp block must follow <!-- code: FILE -->");
    if (source.empty()) continue;
    const std::string missing = first_line_not_in(b.lines, read(source));
    BOOST_TEST(missing.empty(), "README.md:" << b.line << ": the line `" << missing << "` is not in " << source
                                             << " (after the block's lines before it)");
    ++checked;
  }
  BOOST_TEST(checked >= 2);
}

// The README's engine example, run here: README.md shows these lines (checked above).
BOOST_AUTO_TEST_CASE(readme_engine_example_runs_and_its_gradcheck_passes) {
  ag::manual_seed(0);
  ag::Tensor x = ag::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, ag::Dtype::Float64).requires_grad_();
  ag::Tensor w = ag::randn({3, 2}, ag::Dtype::Float64).requires_grad_();
  ag::Tensor loss = ag::sum(ag::softmax(ag::matmul(x, w), -1) * ag::narrow(x, 1, 0, 2));
  loss.backward();
  fmt::print("{}\n", w.grad());

  auto r = ag::gradcheck([&](const ag::TensorList& in) { return ag::sum(ag::tanh(ag::matmul(in[0], in[1]))); },
                         {x, w});
  fmt::print("{}\n", r);  // gradcheck ok: 12 Jacobian elements checked, max abs error ..., worst: ...

  BOOST_TEST(w.grad().defined());
  BOOST_TEST(r.ok, r.message);
}

// docs/studying_attention.md counts correct positions with this expression (eq gives 0/1 Int64).
BOOST_AUTO_TEST_CASE(studying_attentions_count_of_correct_positions_works_on_int64_targets) {
  const ag::Tensor logits = ag::tensor({0, 1, 0, /**/ 2, 0, 0, /**/ 0, 0, 3, /**/ 1, 0, 0}, {2, 2, 3});
  const std::vector<std::int64_t> ids = {1, 0, 1, -100};  // the last is ignore_index: never counted
  const ag::Tensor targets = ag::tensor(ids, {2, 2});
  BOOST_TEST(ag::sum(ag::eq(ag::argmax(logits, -1), targets)).item() == 2.0);
  BOOST_TEST((ag::eq(ag::argmax(logits, -1), targets).dtype() == ag::Dtype::Int64));
}

// The checks themselves: a stale path, an undeclared name and a changed line are each found,
// with the file and line in the message.
BOOST_AUTO_TEST_CASE(a_missing_path_is_reported_with_its_file_and_line) {
  const std::string text =
      "The walk is in `autograd/src/walk.cpp` (src/walk.cpp).\n"
      "Binary ops are in `src/ops/elementwise.cpp`, see examples/curvature and tests/*/test_*.cpp.\n"
      "Random123's tests/kat_vectors, tests/data/mha_<config>.txt, build/examples/train_heads, nn/.\n";
  const std::vector<std::string> found = missing_paths("docs/x.md", text, false);
  BOOST_TEST_REQUIRE(found.size() == 1u, joined(found));
  BOOST_TEST(found[0] == "docs/x.md:2: names `src/ops/elementwise.cpp`, which does not exist");
  BOOST_TEST(missing_paths("a.hpp", "see src/ops/nothing.cpp\n// src/ops/none.cpp", true).size() == 1u);
  BOOST_TEST(!path_resolves("tests/test_nothing_*.cpp"));
  BOOST_TEST(path_resolves("tests/*/test_double_backward_*.cpp"));
}

BOOST_AUTO_TEST_CASE(a_missing_file_name_is_reported_with_its_file_and_line) {
  const std::set<std::string> names = repository_file_names();
  const std::string text =
      "`walk.cpp`, gemm_avx*.cpp, guide.md and autograd/src/walk.cpp exist, as does <immintrin.h>;\n"
      "elementwise.cpp and rows_sse*.cpp do not.\n";
  const std::vector<std::string> found = missing_file_names("docs/x.md", text, false, names);
  BOOST_TEST_REQUIRE(found.size() == 2u, joined(found));
  BOOST_TEST(found[0] == "docs/x.md:2: names `elementwise.cpp`, but no file of that name exists");
  BOOST_TEST(found[1] == "docs/x.md:2: names `rows_sse*.cpp`, but no file of that name exists");
}

BOOST_AUTO_TEST_CASE(a_broken_link_is_reported_with_its_file_and_line) {
  BOOST_TEST(anchor_of("train_heads: accuracy and ablations") == "train_heads-accuracy-and-ablations");
  BOOST_TEST(anchor_of("1. What differentiating a gradient means") == "1-what-differentiating-a-gradient-means");
  const std::string text =
      "[a](design.md#threads), [b](../README.md), [c](https://example.org/x.md), [d](#threads)\n"
      "[e](design.md#no-such-heading) and [f](no_such_page.md)\n";
  const std::vector<std::string> found = broken_links("docs/design.md", text);
  BOOST_TEST_REQUIRE(found.size() == 2u, joined(found));
  BOOST_TEST(found[0] == "docs/design.md:2: the link to `design.md#no-such-heading` leads to no heading of docs/design.md");
  BOOST_TEST(found[1] == "docs/design.md:2: the link to `no_such_page.md` leads to no file");
}

BOOST_AUTO_TEST_CASE(an_undeclared_name_is_reported_with_its_file_and_line) {
  const std::set<std::string> declared = public_header_words();
  const std::string text =
      "`ag::matmul`, `nn::study::zero_ablate_head` and `torch::nn::Nothing` exist;\n"
      "`nn::AttentionOptions::no_such_field` and `ag::no_such_op(x)` do not.\n";
  const std::vector<std::string> found = undeclared_names("docs/x.md", text, declared);
  BOOST_TEST_REQUIRE(found.size() == 2u, joined(found));
  BOOST_TEST(found[0] == "docs/x.md:2: names `ag::no_such_op`, but no public header declares `no_such_op`");
  BOOST_TEST(found[1] == "docs/x.md:2: names `nn::AttentionOptions::no_such_field`, but no public header declares "
                         "`no_such_field`");
}

BOOST_AUTO_TEST_CASE(a_changed_line_of_a_readme_block_is_not_found_in_its_source) {
  const std::string source = "int main() {\n  int a = 1;\n  return a;\n}\n";
  BOOST_TEST(first_line_not_in({"int a = 1;", "", "return a;"}, source).empty());
  BOOST_TEST(first_line_not_in({"int a = 2;"}, source) == "int a = 2;");
  BOOST_TEST(first_line_not_in({"return a;", "int a = 1;"}, source) == "int a = 1;");  // order matters
}
