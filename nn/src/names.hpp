#pragma once
// How nn checks and shows names: the UTF-8 rule that names written to files follow (JSON text is
// UTF-8), and the escaping that messages show every name with (nn::quote_name).
#include <cstddef>
#include <string>
#include <string_view>

namespace nn::detail {

// The index of the first byte of s that is not part of a well-formed UTF-8 sequence (a stray
// continuation byte, a sequence cut short, an overlong form, a UTF-16 surrogate, a code point
// past U+10FFFF), or std::string_view::npos when s is valid UTF-8.
std::size_t invalid_utf8_at(std::string_view s);

// s as quote_name shows it, without the quotes: control bytes (C0, DEL and the C1 controls
// U+0080..U+009F) and every byte that is not part of valid UTF-8 as \xNN, a backslash as \\.
// Valid UTF-8 otherwise stays as it is.
std::string printable_text(std::string_view s);

// "{op}: {what} {quote_name(text)} is not valid UTF-8 (byte 0xNN at position i); ..." as a
// CheckpointError, when text is not valid UTF-8. For everything that writes names into a file.
void check_utf8(std::string_view op, std::string_view what, std::string_view text);

}  // namespace nn::detail
