#pragma once
// One self-contained HTML page (inline CSS, SVG and script; nothing fetched, works from file://):
// headings with a contents list the page's script builds, paragraphs, pictures, tables, a slider
// that steps through frames (e.g. attention maps along training) and data as JSON. The page
// catches its own script errors: each is written into <pre id="script-errors"> and counted in the
// data-script-errors attribute of <html> ("0" when none); data-js-ready="1" is set on <html> once
// the page's script has run to its end. A tooltip shows the value of any element with data-v
// (heatmap cells, chart points) under the pointer.
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "svg_charts.hpp"

namespace html {

using svg::escape;

// `value` as JSON text that is safe inside a <script> element (<, > and & written as \u escapes).
std::string json_in_script(const nlohmann::json& value);

// Writes `text` to `path` through a temporary file in the same directory that is then renamed
// over `path`, so a reader never sees half a file; throws std::runtime_error naming the path and
// the reason when it cannot. A symbolic link is followed: the file it names is replaced, the link
// stays.
void write_file(const std::string& path, const std::string& text);

// Throws what write_file(path, ...) would throw for want of a directory, of permission, or because
// path is a directory or a special file ("cannot write PATH: REASON"), so that a program can refuse
// an output path before it does the work. Creates and removes a probe file beside path; an
// existing file at path is left as it is.
void check_writable(const std::string& path);

// The file a path names once its symbolic links are followed (a dangling link: the file it would
// create): the file write_file(path, ...) replaces.
std::filesystem::path link_target(const std::filesystem::path& path);

// Pictures side by side (wrapping on narrow windows), each with an optional caption, as markup.
std::string figures(const std::vector<std::string>& pictures, const std::vector<std::string>& captions = {});

struct Table {
  std::string caption;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;  // plain text, escaped when written
  std::string attributes;                      // of the <table> element, e.g. id="ablation"
  std::string row_attributes;                  // of every body row's <tr>
};

// Frames shown one at a time, chosen with a range input; `labels` name the frames (e.g. "step 100").
// Without script the last frame shows.
struct Slider {
  std::string id;
  std::string label;  // what the slider steps through
  std::vector<std::string> labels;
  std::vector<std::string> frames;  // markup made by this toolkit (SVG pictures)
};

class Page {
 public:
  explicit Page(std::string title);

  // A level-2 heading is a section: it gets an id and an entry in the contents list.
  Page& heading(int level, const std::string& text);
  Page& paragraph(const std::string& text);  // plain text
  Page& raw(const std::string& markup);      // markup made by this toolkit, e.g. an SVG picture
  // Pictures side by side (wrapping on narrow windows), each with an optional caption.
  Page& figures(const std::vector<std::string>& pictures, const std::vector<std::string>& captions = {});
  Page& table(const Table& table);
  Page& slider(const Slider& slider);
  // Plain text in <pre>; with a summary, folded away behind it (<details>).
  Page& preformatted(const std::string& text, const std::string& summary = {});
  Page& data(const std::string& id, const nlohmann::json& value);  // <script type="application/json" id=...>

  std::string html() const;
  void write(const std::string& path) const { write_file(path, html()); }

 private:
  std::string title_;
  std::string body_;
  int sections_ = 0;
};

}  // namespace html
