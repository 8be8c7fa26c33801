#include "html_page.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

namespace html {

namespace {

// Runs first, in <head>: every script error, unhandled promise rejection and console.error is
// counted on <html data-script-errors> and written into <pre id="script-errors">.
const char* const kErrorCatcher = R"JS(
(function () {
  var count = 0, pending = [];
  function report(message) {
    count += 1;
    document.documentElement.setAttribute('data-script-errors', String(count));
    var pre = document.getElementById('script-errors');
    if (!pre) { pending.push(message); return; }
    pre.hidden = false;
    pre.textContent += pending.splice(0).concat([message]).join('\n') + '\n';
  }
  window.addEventListener('error', function (e) {
    var where = e.filename ? ' (' + e.filename + ':' + e.lineno + ')' : '';
    var what = e.message || ('could not load ' + ((e.target && (e.target.src || e.target.href)) || 'a resource'));
    report('error: ' + what + where);
  }, true);
  document.addEventListener('DOMContentLoaded', function () {
    var pre = document.getElementById('script-errors');
    if (pre && pending.length) { pre.hidden = false; pre.textContent += pending.splice(0).join('\n') + '\n'; }
  });
  window.addEventListener('unhandledrejection', function (e) {
    report('unhandled rejection: ' + ((e.reason && e.reason.message) || e.reason));
  });
  var consoleError = console.error;
  console.error = function () {
    report('console.error: ' + Array.prototype.join.call(arguments, ' '));
    return consoleError.apply(console, arguments);
  };
})();
)JS";

// Runs last: the contents list, the sliders, the tooltip; then marks the page ready.
const char* const kPageScript = R"JS(
(function () {
  var toc = document.querySelector('#toc ol');
  document.querySelectorAll('h2[id]').forEach(function (h) {
    var li = document.createElement('li'), a = document.createElement('a');
    a.href = '#' + h.id;
    a.textContent = h.textContent;
    li.appendChild(a);
    toc.appendChild(li);
  });
  document.querySelectorAll('.slider').forEach(function (box) {
    var input = box.querySelector('input[type=range]'), out = box.querySelector('.slider-label');
    var frames = box.querySelectorAll('.frame'), labels = JSON.parse(box.getAttribute('data-labels'));
    if (frames.length !== labels.length) throw new Error('slider ' + box.id + ': ' + frames.length + ' frames, ' + labels.length + ' labels');
    function show(i) {
      frames.forEach(function (f, j) { f.hidden = j !== i; });
      out.textContent = labels[i] + ' (' + (i + 1) + ' of ' + frames.length + ')';
      box.setAttribute('data-shown', String(i));
      input.value = String(i);
    }
    input.addEventListener('input', function () { show(Number(input.value)); });
    var play = document.createElement('button'), timer = null;
    play.type = 'button';
    play.className = 'play';
    play.textContent = 'play';
    play.addEventListener('click', function () {
      if (timer) { clearInterval(timer); timer = null; play.textContent = 'play'; return; }
      play.textContent = 'stop';
      var i = Number(input.value) >= frames.length - 1 ? -1 : Number(input.value);
      timer = setInterval(function () {
        i += 1;
        show(i);
        if (i >= frames.length - 1) { clearInterval(timer); timer = null; play.textContent = 'play'; }
      }, 400);
    });
    input.parentNode.insertBefore(play, input);
    show(Number(input.value));
  });
  var tip = document.createElement('div');
  tip.id = 'tooltip';
  tip.hidden = true;
  document.body.appendChild(tip);
  document.addEventListener('mouseover', function (e) {
    var el = e.target.closest ? e.target.closest('[data-v]') : null;
    if (!el) { tip.hidden = true; return; }
    var title = el.querySelector('title');
    tip.textContent = title ? title.textContent : el.getAttribute('data-v');
    tip.hidden = false;
  });
  document.addEventListener('mousemove', function (e) {
    tip.style.left = (e.clientX + 14) + 'px';
    tip.style.top = (e.clientY + 14) + 'px';
  });
  document.documentElement.setAttribute('data-js-ready', '1');
})();
)JS";

const char* const kStyle = R"CSS(
body { font-family: sans-serif; margin: 24px; color: #222; line-height: 1.4; }
h1 { font-size: 24px; margin-bottom: 4px; }
h2 { font-size: 19px; margin-top: 32px; border-bottom: 1px solid #ddd; padding-bottom: 3px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
p { max-width: 960px; }
#script-errors { color: #a00; background: #fee; border: 1px solid #a00; padding: 8px; }
#toc { background: #f6f6f6; padding: 6px 14px; display: inline-block; }
#toc ol { margin: 4px 0; padding-left: 20px; columns: 2; column-gap: 40px; }
.figures { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
figure { margin: 0; }
figcaption { font-size: 12px; color: #555; max-width: 420px; white-space: pre-line; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
caption { text-align: left; font-weight: bold; padding-bottom: 4px; }
th, td { border: 1px solid #ccc; padding: 3px 9px; text-align: right; }
th { background: #f0f0f0; }
td:first-child, th:first-child { text-align: left; }
.slider { border: 1px solid #ddd; padding: 8px; display: inline-block; }
.slider-controls { display: flex; gap: 10px; align-items: center; margin-bottom: 6px; }
.slider input[type=range] { width: 360px; }
.slider-label { font-weight: bold; min-width: 160px; }
#tooltip { position: fixed; background: #222; color: #fff; padding: 3px 7px; font-size: 12px; border-radius: 3px;
           pointer-events: none; z-index: 10; }
pre.text { background: #f8f8f8; padding: 8px; font-size: 12px; overflow-x: auto; }
)CSS";

}  // namespace

std::string json_in_script(const nlohmann::json& value) {
  const std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size());
  for (char c : text) {  // these occur only inside strings, where the escapes mean the same
    if (c == '<') out += "\\u003c";
    else if (c == '>') out += "\\u003e";
    else if (c == '&') out += "\\u0026";
    else out += c;
  }
  return out;
}

std::filesystem::path link_target(const std::filesystem::path& path) {
  std::filesystem::path p = path;
  std::error_code ec;
  for (int hops = 0; hops < 40 && std::filesystem::is_symlink(p, ec); ++hops) {
    const std::filesystem::path next = std::filesystem::read_symlink(p, ec);
    if (ec) break;
    p = next.is_absolute() ? next : p.parent_path() / next;
  }
  return p;
}

void write_file(const std::string& path, const std::string& text) {
  const std::filesystem::path target = link_target(path);
  const std::filesystem::path temp = target.parent_path() / (target.filename().string() + fmt::format(".tmp{}", ::getpid()));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    if (out) out << text;
    if (out) out.close();
    if (!out) {
      const int err = errno;
      std::error_code ignored;
      std::filesystem::remove(temp, ignored);
      throw std::runtime_error(fmt::format("cannot write {}: {}", path, err ? std::strerror(err) : "write failed"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(temp, target, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw std::runtime_error(fmt::format("cannot write {}: {}", path, ec.message()));
  }
}

void check_writable(const std::string& path) {
  const std::filesystem::path target = link_target(path);
  auto refuse = [&path](const std::string& reason) {
    throw std::runtime_error(fmt::format("cannot write {}: {}", path, reason));
  };
  if (path.empty()) refuse("the path is empty");
  std::error_code ec;
  const auto status = std::filesystem::status(target, ec);
  if (std::filesystem::is_directory(status)) refuse(std::strerror(EISDIR));
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    refuse("it exists and is not a regular file");
  // A new file beside the target, as write_file's temporary file; O_EXCL: never an existing one.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const std::filesystem::path probe =
        target.parent_path() / fmt::format(".{}.probe{}-{}", target.filename().string(), ::getpid(), attempt);
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::close(fd);
      ::unlink(probe.c_str());
      return;
    }
    if (errno != EEXIST) refuse(std::strerror(errno));
  }
  refuse("no probe file could be created beside it");
}

Page::Page(std::string title) : title_(std::move(title)) {}

Page& Page::heading(int level, const std::string& text) {
  if (level < 1 || level > 6) throw std::invalid_argument(fmt::format("Page::heading: level {} is not 1..6", level));
  const std::string id = level == 2 ? fmt::format(" id=\"section-{}\"", ++sections_) : "";
  body_ += fmt::format("<h{0}{1}>{2}</h{0}>\n", level, id, escape(text));
  return *this;
}

Page& Page::paragraph(const std::string& text) {
  body_ += "<p>" + escape(text) + "</p>\n";
  return *this;
}

Page& Page::raw(const std::string& markup) {
  body_ += markup;
  return *this;
}

std::string figures(const std::vector<std::string>& pictures, const std::vector<std::string>& captions) {
  std::string s = "<div class=\"figures\">\n";
  for (std::size_t i = 0; i < pictures.size(); ++i) {
    s += "<figure>\n" + pictures[i];
    if (i < captions.size() && !captions[i].empty()) s += "<figcaption>" + escape(captions[i]) + "</figcaption>\n";
    s += "</figure>\n";
  }
  return s + "</div>\n";
}

Page& Page::figures(const std::vector<std::string>& pictures, const std::vector<std::string>& captions) {
  body_ += html::figures(pictures, captions);
  return *this;
}

Page& Page::table(const Table& t) {
  body_ += fmt::format("<table{}{}>\n", t.attributes.empty() ? "" : " ", t.attributes);
  if (!t.caption.empty()) body_ += "<caption>" + escape(t.caption) + "</caption>\n";
  body_ += "<tr>";
  for (const auto& h : t.header) body_ += "<th>" + escape(h) + "</th>";
  body_ += "</tr>\n";
  for (const auto& row : t.rows) {
    body_ += t.row_attributes.empty() ? "<tr>" : "<tr " + t.row_attributes + ">";
    for (const auto& cell : row) body_ += "<td>" + escape(cell) + "</td>";
    body_ += "</tr>\n";
  }
  body_ += "</table>\n";
  return *this;
}

Page& Page::slider(const Slider& s) {
  if (s.frames.empty() || s.frames.size() != s.labels.size())
    throw std::invalid_argument(fmt::format("Page::slider: '{}' has {} frames and {} labels", s.id, s.frames.size(),
                                            s.labels.size()));
  const std::size_t last = s.frames.size() - 1;
  body_ += fmt::format("<div class=\"slider\" id=\"{}\" data-labels=\"{}\">\n<div class=\"slider-controls\">"
                       "<label>{}</label><input type=\"range\" min=\"0\" max=\"{}\" value=\"{}\" aria-label=\"{}\">"
                       "<output class=\"slider-label\"></output></div>\n",
                       escape(s.id), escape(nlohmann::json(s.labels).dump()), escape(s.label), last, last,
                       escape(s.label));
  for (std::size_t i = 0; i < s.frames.size(); ++i)
    body_ += fmt::format("<div class=\"frame\" data-frame=\"{}\"{}>\n{}</div>\n", i, i == last ? "" : " hidden",
                         s.frames[i]);
  body_ += "</div>\n";
  return *this;
}

Page& Page::preformatted(const std::string& text, const std::string& summary) {
  const std::string pre = "<pre class=\"text\">" + escape(text) + "</pre>\n";
  body_ += summary.empty() ? pre : "<details><summary>" + escape(summary) + "</summary>\n" + pre + "</details>\n";
  return *this;
}

Page& Page::data(const std::string& id, const nlohmann::json& value) {
  body_ += fmt::format("<script type=\"application/json\" id=\"{}\">{}</script>\n", escape(id), json_in_script(value));
  return *this;
}

std::string Page::html() const {
  return fmt::format("<!DOCTYPE html>\n<html lang=\"en\" data-script-errors=\"0\">\n<head>\n<meta charset=\"utf-8\">\n"
                     "<title>{0}</title>\n<style>{1}</style>\n<script>{2}</script>\n</head>\n<body>\n"
                     "<pre id=\"script-errors\" hidden></pre>\n<h1>{0}</h1>\n"
                     "<nav id=\"toc\"><b>Contents</b><ol></ol></nav>\n{3}<script>{4}</script>\n</body>\n</html>\n",
                     escape(title_), kStyle, kErrorCatcher, body_, kPageScript);
}

}  // namespace html
