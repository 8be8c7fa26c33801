#!/usr/bin/env python3
# Docs that are true: fails when README.md, docs/*.md or a comment in the sources names something
# the tree does not have.
#
#   (a) every repository path that README.md or a docs/*.md page names (anywhere in it), or that a
#       comment names (// and /* */ in C++; # in Python, shell and CMake files), exists. A path is
#       a word starting with a top-level folder or a library's src/ or include/ and a slash
#       (autograd/src/walk.cpp, src/kernels/gemm.cpp, nn/hooks.hpp, tests/*/test_*.cpp); it resolves
#       from the root, from the library folder of the file that names it (autograd/ or nn/; files
#       elsewhere may name either library's src/), as an include path (autograd/include/,
#       nn/include/), from the naming file's own folder, or as an example's name without .cpp.
#       `*` matches within one path component.
#   (b) every ag::, autograd:: and nn:: name in README.md and docs/*.md (each part of a qualified
#       name) is an identifier of the code (comments left out) of a header under autograd/include
#       or nn/include. torch::nn::... is PyTorch's and left alone.
#   (c) every test name the docs give (a `backticked_snake_case_word` of four or more parts, as
#       docs/bad_input.md's Test column and "test `...` in tests/..." write them) is a word of some
#       source, test or CMake file: a renamed test case or ctest name is found.
#   (d) a code block of a doc that follows `<!-- code: FILE -->` is that file's code: its lines
#       (trimmed, blank ones skipped) are lines of FILE, in order.
#   (e) README.md has at most 200 lines.
#
# tests/docs/test_docs.cpp checks (a) and (b) for C++ // comments too, with the library built; this
# script needs no build and also reads /* */ comments and the comments of the scripts and CMake
# files.
#
# Usage: check_docs.py [--root DIR] [--extra FILE]...   check the tree (exit 1 on any problem)
#        check_docs.py --self-test                        the checks find what they must (exit 0)
#        check_docs.py --negative-control                 the tree plus a page with a stale path
#                                                         and name: must exit 1 (ctest WILL_FAIL)
import argparse
import contextlib
import io
import os
import re
import sys
import tempfile

README_MAX_LINES = 200

# Paths that texts name as another project's, or as what a command writes.
OTHER_PROJECTS_PATHS = {
    "tests/kat_vectors",  # Random123's known-answer file (tests/kernels/test_philox.cpp)
}

# ag::/nn:: words in the docs that are not C++ identifiers of ours. Empty: add an entry only with
# a comment saying what it is.
NOT_IDENTIFIERS = set()

PATH_PREFIXES = ("autograd", "nn", "examples", "tests", "docs", "benchmarks", "scripts", "fuzz", "cmake",
                 "src", "include", r"\.ci")
PATH_RE = re.compile(r"(?<![\w.*/<@:-])((?:%s)/[\w.*/-]+)" % "|".join(PATH_PREFIXES))
NAME_RE = re.compile(r"(?<![\w:.])(ag|autograd|nn)::(\w+(?:::\w+)*)")
WORD_RE = re.compile(r"\w+")
TEST_NAME_RE = re.compile(r"`([a-z0-9]+(?:_[a-z0-9]+){3,})`")

CPP_EXTENSIONS = (".cpp", ".hpp", ".h", ".cc")
HASH_EXTENSIONS = (".py", ".sh", ".cmake")
SOURCE_DIRS = ("autograd", "nn", "examples", "benchmarks", "tests", "fuzz", "scripts", "cmake")
SKIP_FILES = {
    "tests/docs/test_docs.cpp",  # its negative controls name missing paths on purpose
}


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def cpp_comments(text):
    """(line number, comment text) for every // and /* */ comment of C++ source (string literals
    are not parsed: a // inside one is taken for a comment, which only adds text to check)."""
    out = []
    in_block = False
    for n, line in enumerate(text.split("\n"), 1):
        i = 0
        while i < len(line):
            if in_block:
                end = line.find("*/", i)
                out.append((n, line[i:] if end < 0 else line[i:end]))
                if end < 0:
                    break
                in_block, i = False, end + 2
                continue
            slash = line.find("//", i)
            block = line.find("/*", i)
            if slash < 0 and block < 0:
                break
            if block < 0 or (0 <= slash < block):
                out.append((n, line[slash + 2:]))
                break
            in_block, i = True, block + 2
    return out


def hash_comments(text):
    """(line number, comment text) for every # comment (a # at the start of a line or after a
    blank) of a Python, shell or CMake file; a first-line #! is left out."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        if n == 1 and line.startswith("#!"):
            continue
        m = re.search(r"(?:^|\s)#(.*)", line)
        if m:
            out.append((n, m.group(1)))
    return out


def paths_in(text):
    """The repository paths a text names (a sentence's final '.' or '-' dropped; a placeholder
    such as tests/data/mha_<config>.txt and a folder alone, nn/, left out)."""
    out = []
    for m in PATH_RE.finditer(text):
        if text[m.end():m.end() + 1] == "<":
            continue
        path = m.group(1).rstrip(".-")
        if path.rstrip("/").count("/") == 0:
            continue
        out.append(path)
    return out


def exists(root, relative):
    """Whether `relative` (with `*` matching within one component) names a file or folder."""
    parts = [p for p in relative.split("/") if p]
    dirs = [root]
    for k, part in enumerate(parts):
        found = []
        for d in dirs:
            if "*" not in part:
                candidate = os.path.join(d, part)
                if os.path.exists(candidate):
                    found.append(candidate)
            elif os.path.isdir(d):
                pattern = re.compile("^" + ".*".join(re.escape(s) for s in part.split("*")) + "$")
                found += [os.path.join(d, e) for e in sorted(os.listdir(d)) if pattern.match(e)]
        dirs = found
        if not dirs:
            return False
    return True


def bases_for(citing):
    """The folders a path named in file `citing` may be relative to."""
    top = citing.split("/", 1)[0]
    own = os.path.dirname(citing)
    libraries = [top] if top in ("autograd", "nn") else ["autograd", "nn"]
    bases = [""] + [lib + "/" for lib in libraries] + ["autograd/include/", "nn/include/"]
    if own:
        bases.append(own + "/")
    return bases


def resolves(root, citing, path):
    path = path.rstrip("/")
    return any(exists(root, base + path + suffix) for base in bases_for(citing) for suffix in ("", ".cpp"))


def missing_paths(root, citing, numbered_texts):
    problems, count = [], 0
    for n, text in numbered_texts:
        for path in paths_in(text):
            count += 1
            if path not in OTHER_PROJECTS_PATHS and not resolves(root, citing, path):
                problems.append(f"{citing}:{n}: names `{path}`, which does not exist")
    return problems, count


def strip_cpp_comments(code):
    return re.sub(r"//[^\n]*|/\*.*?\*/", " ", code, flags=re.S)


def declared_words(root):
    words = set()
    for lib in ("autograd/include", "nn/include"):
        for dirpath, _, files in os.walk(os.path.join(root, lib)):
            for f in files:
                if f.endswith((".hpp", ".h")):
                    words.update(WORD_RE.findall(strip_cpp_comments(read(os.path.join(dirpath, f)))))
    return words


def undeclared_names(citing, text, declared):
    problems, count = [], 0
    for n, line in enumerate(text.split("\n"), 1):
        for m in NAME_RE.finditer(line):
            qualified = m.group(1)
            for part in m.group(2).split("::"):
                qualified += "::" + part
                count += 1
                if part not in declared and part not in NOT_IDENTIFIERS:
                    problems.append(f"{citing}:{n}: names `{qualified}`, but no header under autograd/include or "
                                    f"nn/include declares `{part}`")
    return problems, count


def source_words(root):
    """Every word of every file under the source folders (test cases, ctest names, options)."""
    words = set()
    for d in SOURCE_DIRS + (".ci",):
        for dirpath, _, files in os.walk(os.path.join(root, d)):
            for f in files:
                words.update(WORD_RE.findall(read(os.path.join(dirpath, f))))
    return words


def unknown_test_names(citing, text, words):
    problems = []
    for n, line in enumerate(text.split("\n"), 1):
        for name in TEST_NAME_RE.findall(line):
            if name not in words:
                problems.append(f"{citing}:{n}: names `{name}`, which no source, test or CMake file has")
    return problems


def code_blocks(text):
    """(line of the opening fence, the FILE of the `<!-- code: FILE -->` line before it, the
    block's lines) for every fenced block that has such a marker."""
    out = []
    lines = text.split("\n")
    n = 0
    while n < len(lines):
        if lines[n].startswith("```"):
            start = n
            n += 1
            body = []
            while n < len(lines) and lines[n] != "```":
                body.append(lines[n])
                n += 1
            m = re.fullmatch(r"<!-- code: (\S+) -->", lines[start - 1]) if start > 0 else None
            if m:
                out.append((start + 1, m.group(1), body))
        n += 1
    return out


def first_line_not_in(block, source):
    """The first line of `block` (trimmed, blank ones skipped) not found in `source` after the
    lines found before it; None when every line is there, in order."""
    code = [line.strip() for line in source.split("\n")]
    at = 0
    for line in block:
        want = line.strip()
        if not want:
            continue
        while at < len(code) and code[at] != want:
            at += 1
        if at == len(code):
            return want
        at += 1
    return None


def stale_blocks(root, citing, text):
    problems = []
    for n, source, body in code_blocks(text):
        if not os.path.isfile(os.path.join(root, source)):
            problems.append(f"{citing}:{n}: the block's source `{source}` does not exist")
            continue
        missing = first_line_not_in(body, read(os.path.join(root, source)))
        if missing is not None:
            problems.append(f"{citing}:{n}: the line `{missing}` is not in {source} (after the block's lines "
                            "before it)")
    return problems


def markdown_docs(root):
    docs = ["README.md"]
    docs += sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    return docs


def commented_sources(root):
    """(path relative to root, comment extractor) for every source, script and CMake file."""
    out = []
    for d in SOURCE_DIRS:
        for dirpath, dirnames, files in os.walk(os.path.join(root, d)):
            dirnames.sort()
            for f in sorted(files):
                rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                if rel in SKIP_FILES:
                    continue
                if f.endswith(CPP_EXTENSIONS):
                    out.append((rel, cpp_comments))
                elif f.endswith(HASH_EXTENSIONS) or f == "CMakeLists.txt":
                    out.append((rel, hash_comments))
    out.append(("CMakeLists.txt", hash_comments))
    if os.path.exists(os.path.join(root, ".ci/run")):
        out.append((".ci/run", hash_comments))
    return out


def check(root, extra_docs=()):
    problems = []
    declared = declared_words(root)
    words = source_words(root)
    paths = names = blocks = 0
    docs = [(d, os.path.join(root, d)) for d in markdown_docs(root)]
    docs += [(os.path.basename(e), e) for e in extra_docs]
    for citing, full in docs:
        text = read(full)
        found, k = missing_paths(root, citing, enumerate(text.split("\n"), 1))
        problems += found
        paths += k
        found, k = undeclared_names(citing, text, declared)
        problems += found
        names += k
        problems += unknown_test_names(citing, text, words)
        problems += stale_blocks(root, citing, text)
        blocks += len(code_blocks(text))
    sources = commented_sources(root)
    for citing, comments in sources:
        found, k = missing_paths(root, citing, comments(read(os.path.join(root, citing))))
        problems += found
        paths += k
    readme_lines = read(os.path.join(root, "README.md")).count("\n")
    if readme_lines > README_MAX_LINES:
        problems.append(f"README.md has {readme_lines} lines, more than {README_MAX_LINES}: move measurements to "
                        "docs/benchmarks.md and details to a page of docs/")
    # A scanner that finds nothing passes vacuously: the tree names hundreds of paths and names.
    if len(sources) < 100 or paths < 300 or names < 300 or blocks < 10 or "MultiHeadAttention" not in declared:
        problems.append(f"the scan looks broken: {len(sources)} sources, {paths} paths, {names} ag::/nn:: names, "
                        f"{blocks} code blocks, {len(declared)} declared words")
    for p in problems:
        print(p)
    print(f"check_docs: {len(docs)} docs and {len(sources)} commented files; {paths} paths, {names} "
          f"ag::/nn:: names and {blocks} code blocks checked; {len(problems)} problem(s)")
    return 1 if problems else 0


def self_test(root):
    """The checks find a stale path and an undeclared name with file and line, and pass what exists."""
    failures = []

    def expect(what, got, want):
        if got != want:
            failures.append(f"{what}: got {got!r}, want {want!r}")

    expect("paths_in", paths_in("see `autograd/src/walk.cpp`, src/kernels/gemm.cpp. And tests/data/mha_<c>.txt, nn/, "
                                "https://x.org/nn/y, build/examples/train_heads"),
           ["autograd/src/walk.cpp", "src/kernels/gemm.cpp"])
    text = ("The walk is in autograd/src/walk.cpp (src/walk.cpp); see tests/*/test_*.cpp, examples/curvature,\n"
            "nn/hooks.hpp and docs/design.md. Binary ops: src/ops/elementwise.cpp.\n")
    found, count = missing_paths(root, "docs/x.md", enumerate(text.split("\n"), 1))
    expect("missing paths", found, ["docs/x.md:2: names `src/ops/elementwise.cpp`, which does not exist"])
    expect("paths counted", count, 7)
    expect("a library's own src/", resolves(root, "nn/src/hooks.cpp", "src/kernels/gemm.cpp"), False)
    expect("the other library's src/ from docs", resolves(root, "docs/x.md", "src/kernels/gemm.cpp"), True)
    expect("wildcard that matches nothing", resolves(root, "docs/x.md", "tests/test_nothing_*.cpp"), False)
    expect("cpp comments", cpp_comments('int a; // one\n/* two\nthree */ int b; /* four */\nchar* s = "x";'),
           [(1, " one"), (2, " two"), (3, "three "), (3, " four ")])
    expect("hash comments", hash_comments("#!/bin/sh\n# one\nn=${#a[@]}  # two\nx=1"), [(2, " one"), (3, " two")])
    declared = declared_words(root)
    text = "`ag::matmul(a, b)`, `nn::study::zero_ablate_head` and `torch::nn::Nothing` exist;\n" \
           "`ag::no_such_op(x)` and `nn::AttentionOptions::no_such_field` do not.\n"
    found, _ = undeclared_names("docs/x.md", text, declared)
    expect("undeclared names", found,
           ["docs/x.md:2: names `ag::no_such_op`, but no header under autograd/include or nn/include declares "
            "`no_such_op`",
            "docs/x.md:2: names `nn::AttentionOptions::no_such_field`, but no header under autograd/include or "
            "nn/include declares `no_such_field`"])
    expect("a name only a comment mentions is not declared", "elementwise" in declared, False)
    words = source_words(root)
    renamed = "a_test_" + "that_was_renamed"  # split, so that this file does not hold the word
    expect("test names", unknown_test_names("docs/x.md", "`a_missing_path_is_reported_with_its_file_and_line`, "
                                            "`browser_induction_heads`;\n`" + renamed + "` and `no_such`",
                                            words),
           [f"docs/x.md:2: names `{renamed}`, which no source, test or CMake file has"])
    block = "<!-- code: tests/check_docs.py -->\n```python\nimport argparse\n\nimport os\n```\n"
    expect("a block that is the file's code", stale_blocks(root, "docs/x.md", block), [])
    expect("a block out of order", stale_blocks(root, "docs/x.md", block.replace("argparse", "zzz")),
           ["docs/x.md:2: the line `import zzz` is not in tests/check_docs.py (after the block's lines before it)"])
    expect("a block without a marker", stale_blocks(root, "docs/x.md", "```cpp\nnothing;\n```\n"), [])
    for f in failures:
        print("self-test:", f)
    print(f"check_docs self-test: {len(failures)} failure(s)")
    return 1 if failures else 0


def negative_control(root):
    """The whole check with one more page that names a file and an op that do not exist: exits 1
    when both are reported (what ctest expects, WILL_FAIL), 0 when either is missed."""
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "stale.md")
        with open(page, "w", encoding="utf-8") as f:
            f.write("Binary ops live in `autograd/src/ops/elementwise.cpp`; call `ag::no_such_op(x)`.\n")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            status = check(root, [page])
    print(out.getvalue(), end="")
    report = out.getvalue()
    for want in ("stale.md:1: names `autograd/src/ops/elementwise.cpp`, which does not exist",
                 "stale.md:1: names `ag::no_such_op`"):
        if want not in report:
            print(f"negative control: not reported: {want}")
            return 0
    return status


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--extra", action="append", default=[], help="one more markdown file to check")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--self-test", action="store_true")
    mode.add_argument("--negative-control", action="store_true")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    if args.self_test:
        return self_test(root)
    if args.negative_control:
        return negative_control(root)
    return check(root, args.extra)


if __name__ == "__main__":
    sys.exit(main())
