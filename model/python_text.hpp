// How Python writes one code point inside repr(str): jinja2 prints lists and dicts (and the
// `string` filter of them) with Python's repr, which escapes every character str.isprintable
// rejects. Chat templates print such values when a message's content is not a string.
#pragma once

#include <string>

namespace rlserve::model {

// str.isprintable() of one code point: false for the Unicode categories Cc, Cf, Co, Cs, Zl, Zp
// and Zs other than the space, and for the noncharacters. Other unassigned code points (the
// rest of Cn, which needs the Unicode database) count as printable here.
bool python_printable(char32_t c);

// Appends c as repr writes it inside quotes when it is not printable: \xNN below U+0100,
// \uNNNN below U+10000, \UNNNNNNNN above (lowercase hex).
void append_python_escape(std::string& out, char32_t c);

} // namespace rlserve::model
